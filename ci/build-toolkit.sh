#!/usr/bin/env bash
# Builds the NVIDIA container toolkit's installer (nvidia-ctk-installer, the image's entrypoint) and the programs it
# copies onto the host (nvidia-ctk, nvidia-cdi-hook, nvidia-container-runtime and its .cdi and .legacy variants,
# nvidia-container-runtime-hook) from the upstream module at the chart's pinned version, through the Go module
# proxy, for the real-node test tier, into a folder of the same cache as the kubelet (ci/build-node.sh), and prints
# that folder. A complete folder is reused, so only the first run on a machine pays the build.
#
# The module is built inside a copy of its folder, with its own go.mod and go.sum; this repository's go.mod is not
# involved. The flags are those of upstream's Makefile (cmd-%: -s -w, the version stamp and its extldflags). Not
# static: every one of them imports go-nvml's dlopen wrapper (cgo), which has no pure Go build, so they link against
# glibc as upstream's do (its image's distroless base carries glibc; the test's image carries this machine's).
# Not built: libnvidia-container (nvidia-container-cli, libnvidia-container.so.1, libnvidia-container-go.so.1), a
# separate C project whose packages upstream's image unpacks beside these; the test supplies it as a fixture.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/progress.sh"
. "$here/upstream.sh"
toolkit_version=v1.20.0
module=github.com/NVIDIA/nvidia-container-toolkit
bins=(nvidia-ctk-installer nvidia-ctk nvidia-cdi-hook nvidia-container-runtime nvidia-container-runtime.cdi
  nvidia-container-runtime.legacy nvidia-container-runtime-hook)
# upstream's EXTLDFLAGS: NVML and the other driver libraries are dlopen'ed at run time, never linked
ldflags="-s -w '-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files -Wl,-z,lazy'"
ldflags+=" -X $module/internal/info.version=${toolkit_version#v} -X $module/internal/info.gitCommit=$toolkit_version"
# The key covers what the binaries are built from: the module's version, the toolchain, the flags and the list.
key=$( { echo "$module@$toolkit_version" "$ldflags" "${bins[*]}"; go env GOVERSION GOARCH; } | sha256sum | cut -c1-12)
dir=${KGS_TOOLKIT_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-gpu-stack/toolkit-$key}

complete() { for b in "${bins[@]}"; do [ -x "$dir/$b" ] || return 1; done; }
if complete; then echo "$dir"; exit 0; fi

progress_start "nvidia-container-toolkit $toolkit_version" "2 to 5 minutes on a 2-core machine, under a minute with its packages in the Go build cache"
rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
# GOTOOLCHAIN=local: a module that wants a newer Go fails here, naming the version, instead of fetching a toolchain
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=1
# go-nvml's generated cgo code trips deprecation warnings that newer compilers make noise of
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
json=$(upstream_download "$module@$toolkit_version")
cp -r "$(upstream_field Dir "$json")" "$dir.tmp/src" && chmod -R u+w "$dir.tmp/src"
upstream_modules "$dir.tmp/src" "$module@$toolkit_version"
upstream_build "$dir.tmp/src" "$dir.tmp" "$ldflags" -- "${bins[@]}"
rm -rf "$dir.tmp/src" "$dir" && mv "$dir.tmp" "$dir"
progress_done
echo "$dir"
