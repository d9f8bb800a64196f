#!/usr/bin/env bash
# Builds Node Feature Discovery's nfd-master, nfd-worker and nfd-gc (the three daemons the chart runs) from the
# upstream module at the chart's pinned version, through the Go module proxy, for the real-node test tier, into a
# folder of the same cache as the kubelet (ci/build-node.sh), and prints that folder. A complete folder is reused,
# so only the first run on a machine pays the build, and prints its progress meanwhile.
#
# NFD's go.mod carries replace directives (Kubernetes staging modules), so `go install pkg@version` refuses it: the
# module is downloaded and built inside a copy of its folder, with its own go.mod and go.sum; this repository's
# go.mod is not involved. The flags are those of NFD's Makefile: static, the version stamp, and the host mount
# prefix its container image is built with (/host-: the worker reads /host-sys, /host-etc, ... where the chart
# mounts the host's folders).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/progress.sh"
. "$here/upstream.sh"
nfd_version=v0.19.0
module=sigs.k8s.io/node-feature-discovery
bins=(nfd-master nfd-worker nfd-gc)
ldflags="-s -w -X $module/pkg/version.version=$nfd_version -X $module/pkg/utils/hostpath.pathPrefix=/host-"
# The key covers what the binaries are built from: the module's version, the toolchain, the flags and the list.
key=$( { echo "$module@$nfd_version" "$ldflags" "${bins[*]}"; go env GOVERSION GOARCH; } | sha256sum | cut -c1-12)
dir=${KGS_NFD_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-gpu-stack/nfd-$key}

complete() { for b in "${bins[@]}"; do [ -x "$dir/$b" ] || return 1; done; }
if complete; then echo "$dir"; exit 0; fi

progress_start "nfd $nfd_version" "3 to 6 minutes on a 2-core machine, 40 s with its packages in the Go build cache"
rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
# GOTOOLCHAIN=local: a module that wants a newer Go fails here, naming the version, instead of fetching a toolchain
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0
main_json=$(upstream_download "$module@$nfd_version")
# NFD's go.mod replaces its API module with ./api/nfd, a nested module the main module's zip leaves out: it comes
# from its own tag (api/nfd/v0.19.0), which must be the same commit.
api_json=$(upstream_download "$module/api/nfd@$nfd_version")
src=$(upstream_field Dir "$main_json") api=$(upstream_field Dir "$api_json")
# The commit is the info's Origin.Hash; the proxy leaves Origin out of some modules' info (the main module's, seen
# December 2026), and then the two tags' commit times must match instead.
info_time() { sed -n 's/.*"Time": *"\([^"]*\)".*/\1/p' "$(upstream_field Info "$1")"; }
main_commit=$(upstream_field Hash "$main_json") api_commit=$(upstream_field Hash "$api_json")
if [ -n "$main_commit" ] && [ -n "$api_commit" ]; then
  [ "$main_commit" = "$api_commit" ] ||
    { echo "$module@$nfd_version (commit $main_commit) and its api/nfd module (commit $api_commit) are not the same commit" >&2; exit 1; }
else
  main_time=$(info_time "$main_json") api_time=$(info_time "$api_json")
  [ -n "$main_time" ] && [ "$main_time" = "$api_time" ] ||
    { echo "$module@$nfd_version (commit time ${main_time:-unknown}) and its api/nfd module (${api_time:-unknown}) are not the same commit" >&2; exit 1; }
fi
cp -r "$src" "$dir.tmp/src" && chmod -R u+w "$dir.tmp/src"
rm -rf "$dir.tmp/src/api/nfd" && cp -r "$api" "$dir.tmp/src/api/nfd" && chmod -R u+w "$dir.tmp/src/api/nfd"
upstream_modules "$dir.tmp/src" "$module@$nfd_version"
upstream_build "$dir.tmp/src" "$dir.tmp" "$ldflags" -tags osusergo,netgo -- "${bins[@]}"
rm -rf "$dir.tmp/src" "$dir" && mv "$dir.tmp" "$dir"
progress_done
echo "$dir"
