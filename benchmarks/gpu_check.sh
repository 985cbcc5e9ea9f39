#!/usr/bin/env bash
# The one prepared GPU check: the CUDA tests and the CUDA benchmarks, in under 10 minutes on one GPU.
#
# Run it from the repository root on a machine with CUDA (python3 there must hold a CUDA torch):
#     bash benchmarks/gpu_check.sh [OUT_DIR]            # OUT_DIR defaults to $OUT, else benchmarks/results
# Packages the GPU image lacks travel as wheels in .whl/ (made here by `bash benchmarks/gpu_wheels.sh`);
# they are installed into /tmp/site first. Results: OUT_DIR/gpu_tests.xml (pytest -m gpu),
# OUT_DIR/loader_cuda.json (benchmarks/bench_loader.py --cuda), OUT_DIR/trainer_cuda.json
# (benchmarks/bench_trainer.py on device=cuda, 35 s per sampler: rays/s and steps/s of each sampler, the
# step unsynchronised but when a record is logged), OUT_DIR/trainer_cuda_compiled.json (25 s each for
# occupancy and proposal with --compile-field: the flag's default is chosen from the two files),
# OUT_DIR/ns_runs.log (ns-train with the raykit plugin beside the stock methods, benchmarks/gpu_nerfstudio.sh; skipped without a full nerfstudio)
# and OUT_DIR/gpu_check.log.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-benchmarks/results}}"
mkdir -p "$out"
log="$out/gpu_check.log"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu_check: wheel install failed" | tee -a "$log"; exit 2; }
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
if ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: torch.cuda.is_available() is False on this machine; nothing to check" | tee -a "$log"
  exit 3
fi
"$py" -c "import torch; print('gpu:', torch.cuda.get_device_name(), 'torch', torch.__version__)" | tee -a "$log"
status=0
step() {  # step NAME TIMEOUT_S COMMAND...: run one part, log it, remember a failure, go on
  local name=$1 limit=$2; shift 2
  echo "== $name" | tee -a "$log"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc in $((SECONDS - t0)) s" | tee -a "$log"
  [ "$rc" -eq 0 ] || status=1
}
mapfile -t gpu_files < <(grep -rl "mark.gpu" tests)  # only the files with CUDA tests: fewer imports to carry
step "CUDA tests" 150 "$py" -m pytest -q -m gpu -p no:cacheprovider --junitxml="$out/gpu_tests.xml" "${gpu_files[@]}"
step "loader benchmark (CUDA)" 100 "$py" benchmarks/bench_loader.py --cuda --size small --out "$out/loader_cuda.json"
step "trainer benchmark (CUDA)" 200 "$py" benchmarks/bench_trainer.py --budget 35 --progress-points 4 \
  --set device=cuda --work /tmp/raykit-gpu-trainer --out "$out/trainer_cuda.json"
step "trainer benchmark (CUDA, --compile-field: is torch.compile worth a default?)" 150 "$py" benchmarks/bench_trainer.py \
  --budget 25 --progress-points 2 --samplers occupancy,proposal --set device=cuda --set compile_field=true \
  --work /tmp/raykit-gpu-trainer --out "$out/trainer_cuda_compiled.json"
step "nerfstudio plugin (issue 28; skipped at once without a full nerfstudio)" 30 bash benchmarks/gpu_nerfstudio.sh "$out" 300
exit $status
