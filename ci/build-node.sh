#!/usr/bin/env bash
# Builds the kubelet for the real-node test tier from the same pinned ci/tools module, toolchain and version stamp as
# the control plane (ci/build-controlplane.sh), into a sibling folder of the same cache keyed the same way, and prints
# that folder. A complete folder is reused, so only the first run on a machine pays the build (~3 minutes on a warm
# Go build cache), and prints its progress meanwhile. containerd, runc and the CNI plugins come from Debian packages
# (tests/node installs them).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/progress.sh"
kube_version=v1.37.2
# Same key as the control plane: a kubelet is always the same version as the API server it registers with.
key=$( { cat "$here/tools/go.mod" "$here/tools/go.sum"; go env GOVERSION GOARCH; echo "$kube_version"; } | sha256sum | cut -c1-12)
dir=${KGS_NODE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-gpu-stack/node-$key}

if [ -x "$dir/kubelet" ]; then echo "$dir"; exit 0; fi

mkdir -p "$dir.tmp"
ver=k8s.io/component-base/version
minor=${kube_version#v1.}; minor=${minor%%.*}
ldflags="-s -w -X $ver.gitVersion=$kube_version -X $ver.gitMajor=1 -X $ver.gitMinor=$minor -X $ver.gitTreeState=clean"
progress_start kubelet "about 3 minutes once the control plane is built (its packages are then in the Go build cache)"
progress_run kubelet \
  bash -c 'cd "$1" && CGO_ENABLED=0 go build -trimpath -ldflags "$2" -o "$3" k8s.io/kubernetes/cmd/kubelet' _ "$here/tools" "$ldflags" "$dir.tmp/kubelet"
rm -rf "$dir" && mv "$dir.tmp" "$dir"
progress_done
echo "$dir"
