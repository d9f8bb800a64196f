#!/usr/bin/env bash
# Builds promtool (github.com/prometheus/prometheus, pinned in ci/prometheus/go.mod) and promcheck (the chart's
# PromQL checker, ci/prometheus/cmd/promcheck) into a version-keyed cache folder outside the clone, and prints that
# folder. The rule tests (tests/monitoring) call it; only the first run on a machine pays the build, and sees its
# progress.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/progress.sh"
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
progress_start "promtool and promcheck" "several minutes on 2 cores (the prometheus module is large)"
n=0
for b in "${bins[@]}"; do
  n=$((n + 1))
  [ -x "$dir.tmp/$b" ] && continue
  progress_run "$b ($n of ${#bins[@]})" \
    bash -c 'cd "$1" && go build -trimpath -ldflags "-s -w" -o "$2" "$3"' _ "$mod" "$dir.tmp/$b" "${pkg[$b]}"
done
rm -rf "$dir" && mv "$dir.tmp" "$dir"
progress_done
echo "$dir"
