#!/usr/bin/env bash
# issue 28 on a GPU: ns-train with raykit's plugin beside the stock methods on the same capture.
# Needs a full nerfstudio (CUDA torchvision, gsplat) on that machine: `pip install "raykit[nerfstudio]"`.
#     bash benchmarks/gpu_nerfstudio.sh OUT_DIR [STEPS]
# Writes OUT_DIR/ns/<method>/ (nerfstudio's outputs: config.yml, tensorboard events with the loss curve
# and the train step time) and OUT_DIR/ns_runs.log. The capture: the built-in small scene (Blender
# form for the stock methods, its raykit store for the -raykit ones).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?OUT_DIR}; steps=${2:-300}
py=${PYTHON:-python3}
log="$out/ns_runs.log"; mkdir -p "$out/ns"
if ! "$py" -c "import nerfstudio, torchvision, gsplat" 2>>"$log"; then
  echo "gpu_nerfstudio: nerfstudio with torchvision and gsplat is not importable here; skipped" | tee -a "$log"
  exit 0
fi
data=/tmp/raykit-ns-capture
[ -d "$data/blender" ] || "$py" -m raykit scene make "$data/blender" --size small
[ -d "$data/scene.zarr" ] || "$py" -m raykit convert "$data/blender" "$data/scene.zarr"
common=(--max-num-iterations "$steps" --vis tensorboard --viewer.quit-on-train-completion True --output-dir "$out/ns")
status=0
run() {  # run NAME ARGS...
  echo "== ns-train $*" | tee -a "$log"
  local t0=$SECONDS
  timeout 110 ns-train "$@" 2>&1 | tail -n 20 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  echo "== exit $rc in $((SECONDS - t0)) s" | tee -a "$log"
  [ "$rc" -eq 0 ] || status=1
}
run nerfacto "${common[@]}" blender-data --data "$data/blender"
run nerfacto-raykit "${common[@]}" --data "$data/scene.zarr"
run splatfacto "${common[@]}" blender-data --data "$data/blender"
run splatfacto-raykit "${common[@]}" --data "$data/scene.zarr"
run splatfacto "${common[@]}" raykit-data --data "$data/scene.zarr"   # stock datamanager, raykit-data
exit $status
