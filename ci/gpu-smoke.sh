#!/usr/bin/env bash
# GPU smoke check for a machine with a real NVIDIA GPU and a host-installed driver, and no registry access. It
# builds the node binaries (the validator with cgo, so it links NVML through go-nvml) and runs, read-only, what
# they would do on this node:
#   - the validator's driver check in host-driver mode against / : nvidia-smi, then the NVML probe (GPU count and
#     driver version); its status files go to a temp dir, never /run/nvidia; no /dev/char links, no API access;
#   - the driver manager's detection (driver-manager detect): host driver found or not, loaded NVIDIA modules and
#     their users, processes holding /dev/nvidia*, nouveau, the NVIDIA PCI functions and their drivers.
# It prints one report and changes nothing on the host (everything it writes is under a temp dir it removes).
#
# Exit status: 0 the report was printed and, where an NVIDIA GPU or driver is present, the driver check passed
# (a machine with neither reports "no NVIDIA GPU/driver found" and also exits 0); 2 an NVIDIA GPU or driver is
# present but the driver check failed (the report says why); 1 the binaries did not build.
set -uo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-smoke.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/validations"

echo "== building (the image's binary, with CGO_ENABLED=1 so the validator links NVML; validator and driver-manager link to it)"
if ! command -v "${CC:-gcc}" >/dev/null; then
  echo "no C compiler (${CC:-gcc}): the validator needs cgo to link NVML" >&2
  exit 1
fi
# lazy binding: go-nvml leaves NVML's symbols to be resolved when first called (see hooks/cmd/incluster)
CGO_ENABLED=1 go build -ldflags=-extldflags=-Wl,-z,lazy -o "$work/bin/kube-gpu-stack" ./hooks/cmd/in-cluster || exit 1
ln -s kube-gpu-stack "$work/bin/validator" && ln -s kube-gpu-stack "$work/bin/driver-manager" || exit 1

# what the machine has, from sysfs alone
gpus=0
for v in /sys/bus/pci/devices/*/vendor; do
  [ -r "$v" ] && [ "$(cat "$v")" = 0x10de ] && gpus=$((gpus + 1))
done
smi=$(command -v nvidia-smi || true)

echo
echo "== validator driver (host-driver mode against /, status files in a temp dir)"
# NODE_NAME empty: nothing is recorded on a Node; DRIVER_INSTALL_DIR points at an empty temp dir so no
# containerized driver is looked for under /run/nvidia.
env -u KUBECONFIG NODE_NAME= HOST_ROOT=/ OUTPUT_DIR="$work/validations" DRIVER_INSTALL_DIR="$work/no-driver-container" \
  WITH_WAIT=false DISABLE_DEV_CHAR_SYMLINK_CREATION=true \
  "$work/bin/validator" driver >"$work/validator.log" 2>&1
validator_rc=$?
sed 's/^/  /' "$work/validator.log"

echo
echo "== driver-manager detect (--host-root /)"
"$work/bin/driver-manager" detect --host-root / >"$work/detect.log" 2>&1
detect_rc=$?
sed 's/^/  /' "$work/detect.log"

echo
echo "== report"
echo "  NVIDIA PCI functions (sysfs):  $gpus"
echo "  nvidia-smi on PATH:            ${smi:-none}"
if [ -f "$work/validations/driver-ready" ]; then
  echo "  driver check:                  passed; driver-ready would say:"
  sed 's/^/                                 /' "$work/validations/driver-ready"
else
  echo "  driver check:                  not passed (exit $validator_rc)"
fi
nvml=$(grep -E 'answers$|NVML' "$work/validator.log" | head -n1)
echo "  NVML probe:                    ${nvml:-no result (the driver check stopped before it)}"
echo "  driver manager:                $(sed -n 's/^verdict: *//p' "$work/detect.log") (detect exit $detect_rc)"

if [ "$gpus" -eq 0 ] && [ -z "$smi" ] && [ "$validator_rc" -ne 0 ]; then
  echo
  echo "no NVIDIA GPU/driver found: nothing to check on this machine (exit 0)"
  exit 0
fi
if [ "$validator_rc" -ne 0 ] || [ "$detect_rc" -ne 0 ]; then
  exit 2
fi
exit 0
