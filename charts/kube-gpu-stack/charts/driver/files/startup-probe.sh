#!/bin/sh
# Startup probe of nvidia-driver-ctr. Succeeds once the driver is loaded and answers, then tells the node that
# the containerized driver is ready by writing /run/nvidia/validations/.driver-ctr-ready (atomically), listing the
# extra modules this pod loads so the driver validation checks them too.
set -eu

dir=/run/nvidia/validations

if [ ! -e /sys/module/nvidia/refcnt ]; then
  echo "the nvidia kernel module is not loaded yet"
  exit 1
fi

# The driver container reports its own daemons (persistenced, fabric manager, ...) here once it has started them.
if [ -f "$dir/.driver-daemons-status" ]; then
  status=$(cat "$dir/.driver-daemons-status")
  if [ "$status" != "Ready" ]; then
    echo "driver daemons not ready: $status"
    exit 1
  fi
fi

if ! nvidia-smi >/dev/null; then
  echo "nvidia-smi failed"
  exit 1
fi

mkdir -p "$dir"
cat >"$dir/.driver-ctr-ready.tmp" <<READY
GPU_DIRECT_RDMA_ENABLED=${GPU_DIRECT_RDMA_ENABLED:-false}
GDS_ENABLED=${GDS_ENABLED:-false}
GDRCOPY_ENABLED=${GDRCOPY_ENABLED:-false}
READY
mv -f "$dir/.driver-ctr-ready.tmp" "$dir/.driver-ctr-ready"
