#!/usr/bin/env bash
# Installs NVRTC 13 from NVIDIA's pinned PyPI wheel (no CUDA toolkit, no GPU
# needed) into DIR and prints the folder to put on LD_LIBRARY_PATH:
#
#   export LD_LIBRARY_PATH="$(bash .ci/install-nvrtc.sh target/nvrtc)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
#
# DIR defaults to target/nvrtc (ignored by git). libnvrtc.so.13 finds its
# builtins library (same folder) only when that folder is on LD_LIBRARY_PATH.
# The kernels include no CUDA headers, so the nvidia-cuda-runtime and
# nvidia-cuda-cccl wheels (13.0.96, 13.0.85) are not needed. Progress goes to
# stderr; stdout is the lib folder alone. Re-running with the same version
# installed is a no-op.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VERSION=13.0.88
DIR=${1:-target/nvrtc}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
LIB="$DIR/nvidia/cu13/lib"
PY=${PYTHON:-python3}

if [[ -f "$LIB/libnvrtc.so.13" && -d "$DIR/nvidia_cuda_nvrtc-$VERSION.dist-info" ]]; then
    echo "install-nvrtc: nvidia-cuda-nvrtc $VERSION already in $DIR" >&2
else
    echo "install-nvrtc: installing nvidia-cuda-nvrtc==$VERSION into $DIR" >&2
    rm -rf "$DIR"
    "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore \
        --no-deps --target "$DIR" "nvidia-cuda-nvrtc==$VERSION" >&2
fi
[[ -f "$LIB/libnvrtc.so.13" && -f "$LIB/libnvrtc-builtins.so.13.0" ]] \
    || { echo "install-nvrtc: no libnvrtc.so.13 / libnvrtc-builtins.so.13.0 in $LIB" >&2; exit 1; }
echo "$LIB"
