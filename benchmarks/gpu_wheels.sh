#!/usr/bin/env bash
# Downloads, here, the wheels that benchmarks/gpu_check.sh needs on the GPU image (Python 3.12, x86-64),
# which has torch, numpy, pyarrow, pillow, fsspec, pytest and hypothesis but not the store's codecs,
# simplejpeg or pycolmap (tests/test_cameras.py's oracle).
# They land in .whl/ (ignored by .gitignore) and travel with `carry: [".whl"]`.
set -euo pipefail
cd "$(dirname "$0")/.."
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d .whl zarr numcodecs google-crc32c crc32c donfig webdataset braceexpand safetensors simplejpeg msgspec 'pycolmap>=4.2,<5'
