#!/usr/bin/env bash
# One device call: the memory-tier benchmark on one H200, 6.44 GB model+Adam (537 M params), host
# staging then device staging, each with the efficiency loop.
# Usage (on the GPU machine, from the repo root): OUT=<dir> bash bench/gpu_memory_tier.sh
# Writes $OUT/env.txt, $OUT/mem-host.json, $OUT/mem-device.json and their logs.
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
  date -u; nproc; free -g; df -h /dev/shm
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
  python3 -c 'from resctl.checkpoint import memory; print("memory-tier checksum:", memory.CHECKSUM, "threads:", memory.THREADS)'
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
DIR=/var/tmp/resctl-bench-mem
for stage in host device; do
  python3 bench/bench_memory_tier.py --params-m 537 --device cuda --stage "$stage" --dir "$DIR" \
    --saves 7 --restores 3 --efficiency --json "$OUT/mem-$stage.json" 2>"$OUT/mem-$stage.log" >/dev/null
  echo "stage=$stage exit $?"; tail -3 "$OUT/mem-$stage.log"
done
rm -rf "$DIR" /dev/shm/resctl-bench-memory-tier*
