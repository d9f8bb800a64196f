#!/usr/bin/env bash
# Builds promtool (github.com/prometheus/prometheus, pinned in ci/prometheus/go.mod) and promcheck (the chart's
# PromQL checker, ci/prometheus/cmd/promcheck) into a version-keyed cache folder outside the clone, and prints that
# folder. The rule tests (tests/monitoring) call it; only the first run on a machine pays the build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mod=$here/prometheus
# The key covers what the binaries are built from: the pinned modules, the checker's source and the Go toolchain.
key=$( { cat "$mod/go.mod" "$mod/go.sum" "$mod"/cmd/promcheck/*.go; go env GOVERSION GOARCH; } | sha256sum | cut -c1-12)
dir=${KGS_PROMETHEUS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-gpu-stack/prometheus-$key}
bins=(promtool promcheck)

complete() { for b in "${bins[@]}"; do [ -x "$dir/$b" ] || return 1; done; }
if complete; then echo "$dir"; exit 0; fi

mkdir -p "$dir.tmp"
declare -A pkg=(
  [promtool]=github.com/prometheus/prometheus/cmd/promtool
  [promcheck]=./cmd/promcheck
)
start=$(date +%s)
for b in "${bins[@]}"; do
  [ -x "$dir.tmp/$b" ] && continue
  echo "building $b ($(( $(date +%s) - start ))s elapsed)..." >&2
  (cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$dir.tmp/$b" "${pkg[$b]}")
done
rm -rf "$dir" && mv "$dir.tmp" "$dir"
echo "promtool and promcheck built in $(( $(date +%s) - start ))s" >&2
echo "$dir"
