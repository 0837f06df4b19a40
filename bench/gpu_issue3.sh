#!/usr/bin/env bash
# One device call for issue 3 (NCCL recovery drill on one H200) and issue 5 (one prediction-vs-reality
# case on the GPU). Needs the py3.12 wheels in .whl (nvidia-resiliency-ext 0.4.1, pydantic, ...).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import nvidia_resiliency_ext, pydantic, torch, resctl.cli; print('deps ok', torch.__version__, torch.cuda.get_device_name(0))"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "== recovery drill (NCCL, 1 GPU)"
timeout 300 python3 bench/gpu_recovery.py --nproc 1 > "$OUT/gpu_recovery.json" 2> "$OUT/gpu_recovery.err"; echo "exit $?"
cat "$OUT/gpu_recovery.json"; tail -5 "$OUT/gpu_recovery.err"
echo "== interval prediction vs reality (cuda)"
timeout 200 python3 bench/bench_interval.py --device cuda --intervals 4 16 --steps 160 --calibrate-steps 80 \
    --width 2048 --step-time 0.05 --writers 4 --json "$OUT/interval_gpu.json" 2>&1 | tail -12
