#!/usr/bin/env bash
# Issue 31 on one H200 (NVRx 0.4.1 cp312 wheels in .whl). Parts (default: all): profile happy kill tutorial tier
#   profile:  bench/gpu_step_profile.py: step phases under torchrun, resctl fork, resctl exec (hooks/GC A/B inside)
#   happy:    bench_happy_path.py on CUDA, 1 GPU, ~0.8 ms steps, torchrun vs resctl alternating (REPEATS, default 7)
#   kill:     bench_kill_resume.py ddp, 1 GPU: kill after step 15 (the first seconds) and after step 100 (KILL_ARGS: more options)
#   tutorial: pytorch/examples multigpu_torchrun.py (EXAMPLES: folder with it and datautils.py), 200 epochs,
#             snapshot every 50, killed at epoch 100: kill -> loading / resumed / first epoch line, + resctl's phases
#   tier:     bench/gpu_memory_tier.sh (memory tier efficiency at the planned memory_every)
#   tutorial-before: the same, resctl only, with the code of the checkout at BEFORE_ROOT (before/after phases)
# Usage: OUT=<dir> EXAMPLES=<dir> bash bench/gpu_issue31.sh [parts]; everything lands in $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ${WHL:-.whl}/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
ROUNDS=${ROUNDS:-2}
for part in ${*:-profile happy kill tutorial tier}; do
  t0=$(date +%s)
  case $part in
    profile) echo "== step profile"
      timeout 200 python3 bench/gpu_step_profile.py --repeats ${PROFILE_REPEATS:-2} --blocks 8 --steps 200 > "$OUT/profile.json" 2> "$OUT/profile.err"
      echo "exit $?"; python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['summary']))" "$OUT/profile.json";;
    happy) echo "== happy path, cuda, 1 GPU"
      timeout 500 python3 bench/bench_happy_path.py --repeats ${REPEATS:-7} --steps 2000 --device cuda --nproc 1 --json "$OUT/happy.json" ${HAPPY_ARGS:-} \
        > "$OUT/happy.txt" 2>&1; echo "exit $?"; tail -6 "$OUT/happy.txt";;
    kill) echo "== kill -9 -> first step, ddp, 1 GPU, after step 15 and 100"
      for after in 15 100; do
        faults=$ROUNDS; [ $after = 100 ] && faults=${ROUNDS_100:-$ROUNDS}
        timeout 300 python3 bench/bench_kill_resume.py --script ddp --nproc 1 --device cuda --faults $faults --clean 0 \
          --steps $((after + 20)) --kill-after $after --script-args "--step-time 0.02 --save-every 5" ${KILL_ARGS:-} > "$OUT/kill-$after.json" 2> "$OUT/kill-$after.err"
        echo "after $after: exit $?"; python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d['p50']['kill_to_first_step']), json.dumps(d['kill_to_first_step'])); [print(e[-300:]) for e in d.get('errors', [])]" "$OUT/kill-$after.json"
      done;;
    tutorial) echo "== DDP tutorial, 1 GPU, kill at epoch 100"
      timeout 300 python3 bench/bench_tutorial_kill.py --examples "${EXAMPLES:-.gpu/examples}" --rounds $ROUNDS --keep "$OUT/tutorial-runs" > "$OUT/tutorial.json" 2> "$OUT/tutorial.err"
      echo "exit $?"; python3 -c "
import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d['p50']))
for r in d['rounds'].get('resctl', []): print(json.dumps(r.get('report')))
[print(e[-400:]) for e in d.get('errors', [])]" "$OUT/tutorial.json";;
    tutorial-before) echo "== DDP tutorial, resctl of BEFORE_ROOT (the code before these changes)"
      (cd "$BEFORE_ROOT" && PYTHONPATH=/tmp/site:$BEFORE_ROOT timeout 120 python3 "$OLDPWD/bench/bench_tutorial_kill.py" \
        --examples "$(cd "$OLDPWD" && realpath "${EXAMPLES:-.gpu/examples}")" --rounds 1 --launchers resctl) > "$OUT/tutorial-before.json" 2> "$OUT/tutorial-before.err"
      echo "exit $?"; python3 -c "
import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d['p50']))
for r in d['rounds'].get('resctl', []): print(json.dumps(r.get('report')))
[print(e[-400:]) for e in d.get('errors', [])]" "$OUT/tutorial-before.json";;
    tier) echo "== memory tier, device staging, efficiency at the planned memory_every"
      timeout 400 python3 bench/bench_memory_tier.py --params-m 537 --device cuda --stage device --dir /var/tmp/resctl-bench-mem \
        --saves 3 --restores 1 --efficiency --budget 0.01 --json "$OUT/mem-device.json" 2> "$OUT/mem-device.log" > /dev/null
      echo "exit $?"; grep -E "efficiency|stall|restore" "$OUT/mem-device.log" | tail -8; rm -rf /var/tmp/resctl-bench-mem;;
  esac
  echo "($part: $(( $(date +%s) - t0 )) s)"
done
