#!/usr/bin/env bash
# One kill -9 of the DDP-tutorial-style script on 1 GPU under resctl, its run directory kept (launcher.log,
# events): where a recovery's time goes. With OLD=DIR (a tree holding another resctl/ package), the same
# again with that resctl first on PYTHONPATH. The A/B of two trees over several rounds is gpu_issue30.sh's
# kill part (LAUNCHERS=resctl,resctl@old EXTRA_PATHS="--nvrx-path old=$PWD/DIR").
# Usage on the device (after bench/gpu_issue30.sh's installs, or alone): OUT=$OUT [OLD=.old] bash bench/gpu_kill_diag.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
REPO=$PWD PY=${PY:-python3} DEVICE_ARGS=${DEVICE_ARGS:-}   # DEVICE_ARGS="--device cpu --width 64": a CPU try
[ "${SKIP_PIP:-0}" = 1 ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site04 .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 NCCL_NVLS_ENABLE=0
one_kill() {  # label, PYTHONPATH
  local dir=/tmp/diag-$1; rm -rf "$dir"; mkdir -p "$dir"
  (cd "$dir" && PYTHONPATH=$2 timeout 120 $PY -m resctl run --nproc-per-node 1 --run-dir "$dir/run" \
     "$REPO/bench/scripts/ddp_snapshot.py" --steps 150 --step-time 0.05 --snapshot "$dir/snap.pt" $DEVICE_ARGS > "$dir/console.txt" 2>&1) &
  local job=$! pid=""
  for _ in $(seq 600); do
    grep -q "^STEP 0 100 " "$dir/console.txt" 2>/dev/null && break; sleep 0.1
  done
  pid=$(grep -m1 "^PID 0 " "$dir/console.txt" | awk '{print $3}')
  echo "$1: kill $pid at $(date +%s.%N)" | tee "$dir/kill.txt"; kill -9 "$pid"
  wait $job; echo "$1: exit $?"
  $PY - "$dir" <<'PY'
import re, sys
lines = open(sys.argv[1] + "/console.txt").read().splitlines()
kill = float(open(sys.argv[1] + "/kill.txt").read().split()[-1])
after = [float(m[1]) for l in lines if (m := re.match(r"STEP 0 \d+ ([\d.]+)$", l)) and float(m[1]) > kill]
print(f"  kill -> first step {after[0] - kill:.3f} s" if after else "  no step after the kill")
PY
}
for r in $(seq ${DIAG_ROUNDS:-1}); do
  one_kill new$r /tmp/site04:$PWD
  [ -n "${OLD:-}" ] && one_kill old$r /tmp/site04:$PWD/$OLD
done
tar -czf "$OUT/diag.tgz" --exclude=snap.pt -C /tmp $(cd /tmp && ls -d diag-*) 2>/dev/null
