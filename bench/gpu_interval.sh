#!/usr/bin/env bash
# tune-interval prediction vs reality on the GPU machine (issue 5): the write-spacing diagnosis,
# then the interval bench on the GPU, or (with "cpu") the same CPU job as on the dev VM.
#   bash bench/gpu_interval.sh gpu          # ~5 min on one H200 (ROUNDS=3)
#   bash bench/gpu_interval.sh cpu          # ~4 min, the CPU job on the GPU machine's 16 cores
#   ROUNDS=2 bash bench/gpu_interval.sh gpu-quick cpu    # several, in turn
# Results go to $OUT (or ./bench-out) as JSON; the tables are printed.
set -euo pipefail
out=${OUT:-bench-out}
mkdir -p "$out"
nproc; uptime; findmnt -T . || true
interval_gpu() {
  python3 bench/bench_interval.py --device cuda --intervals 1 2 8 --steps 160 --calibrate-steps 80 \
    --calibrate-interval 10 --width 2048 --step-time 0.05 --writers 4 --rounds "${ROUNDS:-3}" \
    --json "$out/interval-cuda.json" 2>&1 | grep -v -i pynvml | grep -v '^  r'
}
for what in "${@:-gpu}"; do
case "$what" in
  gpu)
    python3 bench/bench_write_spacing.py --device cuda --width 2048 --writers 4 --gaps 0 0.3 --fills sleep \
      --json "$out/spacing-cuda.json" 2>&1 | grep -v -i pynvml
    interval_gpu ;;
  gpu-quick) interval_gpu ;;  # the interval bench alone
  cpu)
    python3 bench/bench_interval.py --device cpu --intervals 1 3 12 --steps 160 --calibrate-steps 200 \
      --calibrate-interval 5 --width 1536 --step-time 0.02 --writers 2 --rounds "${ROUNDS:-4}" \
      ${THREADS:+--threads $THREADS} --json "$out/interval-cpu.json" 2>&1 | grep -v -i pynvml | grep -v '^  r' ;;
  *) echo "unknown: $what (gpu, gpu-quick, cpu)" >&2; exit 2 ;;
esac
done
