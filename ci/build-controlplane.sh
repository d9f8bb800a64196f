#!/usr/bin/env bash
# Builds the local control plane (kube-apiserver, kube-controller-manager, kube-scheduler, etcd, kwok) from the
# pinned ci/tools module into a version-keyed cache folder outside the clone, and prints that folder. A folder
# that is already complete is reused, so only the first run on a machine pays the build (~3 GB of memory; the time
# is the estimate printed below), and prints its progress meanwhile.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/progress.sh"
kube_version=v1.37.2
# The key covers what the binaries are built from: the pinned modules, the Go toolchain and the version stamped in.
key=$( { cat "$here/tools/go.mod" "$here/tools/go.sum"; go env GOVERSION GOARCH; echo "$kube_version"; } | sha256sum | cut -c1-12)
dir=${KGS_CONTROLPLANE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-gpu-stack/controlplane-$key}
bins=(kube-apiserver kube-controller-manager kube-scheduler etcd kwok)

complete() { for b in "${bins[@]}"; do [ -x "$dir/$b" ] || return 1; done; }
if complete; then echo "$dir"; exit 0; fi

mkdir -p "$dir.tmp"
ver=k8s.io/component-base/version
minor=${kube_version#v1.}; minor=${minor%%.*}
ldflags="-s -w -X $ver.gitVersion=$kube_version -X $ver.gitMajor=1 -X $ver.gitMinor=$minor -X $ver.gitTreeState=clean"
declare -A pkg=(
  [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
  [kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler
  [etcd]=go.etcd.io/etcd/server/v3
  [kwok]=sigs.k8s.io/kwok/cmd/kwok
)
progress_start "control plane" "about 5 minutes on an idle 2-core machine, up to half an hour on a loaded one (the timing table of docs/development.md, measured 4 December 2026), most of it the first binary"
n=0
for b in "${bins[@]}"; do
  n=$((n + 1))
  [ -x "$dir.tmp/$b" ] && continue
  progress_run "$b ($n of ${#bins[@]})" \
    bash -c 'cd "$1" && CGO_ENABLED=0 go build -trimpath -ldflags "$2" -o "$3" "$4"' _ "$here/tools" "$ldflags" "$dir.tmp/$b" "${pkg[$b]}"
done
rm -rf "$dir" && mv "$dir.tmp" "$dir"
progress_done
echo "$dir"
