#!/usr/bin/env bash
# Builds NVIDIA's device plugin (nvidia-device-plugin), GPU feature discovery (gpu-feature-discovery) and their
# config manager (config-manager) from the upstream module, through the Go module proxy, for the real-node test tier,
# into a folder of the same cache as the kubelet (ci/build-node.sh), and prints that folder. A complete folder is
# reused, so only the first run on a machine pays the build.
#
# The chart pins k8s-device-plugin v0.20.0, which the module proxy does not serve (December 2026); v0.18.0, the newest
# it serves, carries the same programs, and its contract row records the gap. The module is built inside a copy of
# its folder, with its own go.mod and go.sum; this repository's go.mod is not involved. The flags are those of
# upstream's Makefile: -s -w, the version stamp and its extldflags (NVML is dlopen'ed at run time, never linked), so
# the programs link against glibc as upstream's do (its distroless base carries glibc; the test's image carries
# this machine's).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/progress.sh"
. "$here/upstream.sh"
plugin_version=v0.18.0
module=github.com/NVIDIA/k8s-device-plugin
bins=(nvidia-device-plugin gpu-feature-discovery config-manager)
ldflags="-s -w '-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files'"
ldflags+=" -X $module/internal/info.version=$plugin_version -X $module/internal/info.gitCommit=$plugin_version"
# The key covers what the binaries are built from: the module's version, the toolchain, the flags and the list.
key=$( { echo "$module@$plugin_version" "$ldflags" "${bins[*]}"; go env GOVERSION GOARCH; } | sha256sum | cut -c1-12)
dir=${KGS_DEVICE_PLUGIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-gpu-stack/device-plugin-$key}
complete() { for b in "${bins[@]}"; do [ -x "$dir/$b" ] || return 1; done; }
if complete; then echo "$dir"; exit 0; fi
progress_start "k8s-device-plugin $plugin_version" "3 to 6 minutes on a 2-core machine, under a minute with its packages in the Go build cache"
rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
# GOTOOLCHAIN=local: a module that wants a newer Go fails here, naming the version, instead of fetching a toolchain
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=1
# go-nvml's generated cgo code trips deprecation warnings that newer compilers make noise of
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
json=$(upstream_download "$module@$plugin_version")
cp -r "$(upstream_field Dir "$json")" "$dir.tmp/src" && chmod -R u+w "$dir.tmp/src"
upstream_modules "$dir.tmp/src" "$module@$plugin_version"
upstream_build "$dir.tmp/src" "$dir.tmp" "$ldflags" -- "${bins[@]}"
rm -rf "$dir.tmp/src" "$dir" && mv "$dir.tmp" "$dir"
progress_done
echo "$dir"
