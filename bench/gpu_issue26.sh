#!/usr/bin/env bash
# Issue 26 on one H200, in few device calls. Parts (default: all): tier happy exit kill
#   tier:  OUT=$OUT bash bench/gpu_memory_tier.sh (memory tier: stalls, restore, efficiency)
#   happy: bench_happy_path.py on CUDA, ~1 ms steps, torchrun vs resctl alternating
#   exit:  bench/scripts/accel_exit.py (`sys.exit(main())`, main() -> None) under torchrun, resctl fork, resctl exec
#   kill:  kill -9 -> first step after the resume, DDP-tutorial-style script, torchrun vs resctl
# Needs the cp312 wheels in .whl (see bench/gpu_issue10.sh). Usage: OUT=<dir> bash bench/gpu_issue26.sh [parts]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for part in ${*:-tier happy exit kill}; do
  case $part in
    tier) echo "== memory tier"; OUT=$OUT bash bench/gpu_memory_tier.sh;;
    happy) echo "== happy path, cuda, 1 GPU"
      timeout 300 python3 bench/bench_happy_path.py --repeats 7 --steps 2000 --device cuda --nproc 1 --json "$OUT/happy.json" \
        > "$OUT/happy.txt" 2>&1; echo "exit $?"; tail -12 "$OUT/happy.txt";;
    exit) echo "== sys.exit(main()) after an accelerator check, 1 worker"
      for launcher in torchrun fork exec torchrun fork exec; do
        case $launcher in
          torchrun) cmd=(python3 -m torch.distributed.run --nproc-per-node 1);;
          fork) cmd=(python3 -m resctl run --nproc-per-node 1 --run-dir /tmp/r26);;
          exec) cmd=(python3 -m resctl run --set launch.worker_start=exec --nproc-per-node 1 --run-dir /tmp/r26);;
        esac
        t0=$(date +%s%N); timeout 60 "${cmd[@]}" bench/scripts/accel_exit.py > "$OUT/exit-$launcher.txt" 2>&1; rc=$?
        echo "$launcher rc=$rc wall=$(( ($(date +%s%N) - t0) / 1000000 )) ms $(grep -c 'nothing to do' "$OUT/exit-$launcher.txt") line(s)"
      done;;
    kill) echo "== kill -9 -> first step after resume: ddp, 1 GPU"
      timeout 280 python3 bench/bench_kill_resume.py --script ddp --nproc 1 --device cuda --faults ${FAULTS:-5} --clean ${CLEAN:-3} \
        --steps 40 --kill-after 15 --script-args "--step-time 0.05" > "$OUT/kill-ddp.json" 2> "$OUT/kill-ddp.err"
      echo "exit $?"; python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d['p50'])); [print(e[-400:]) for e in d.get('errors', [])]" "$OUT/kill-ddp.json";;
  esac
done
