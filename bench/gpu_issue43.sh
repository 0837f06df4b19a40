#!/usr/bin/env bash
# Issue 43 on one GPU (H100/H200), one device call: the job's first seconds and the constant costs, each resctl
# beside torchrun in the same call, alternating (the benches do that), and beside the code before a change
# (resctl@before: the checkout at $BEFORE, first on PYTHONPATH).
#   kill:     bench_kill_resume.py ddp, 1 GPU, 50 ms steps: kill -9 after step 15 (the first seconds) and after step 100;
#             resctl on NVRx 0.7.0 too after step 100 (resctl@0.7)
#   happy:    bench_happy_path.py on CUDA, 1 GPU: the step (median of medians) and the no-op wall
#   profile:  bench/gpu_step_profile.py: a tiny DDP step's phases under torchrun, resctl forked and exec'd
#             (PROFILE_LAUNCHERS: others, e.g. resctl+launch.late_preload=late: resctl with --set launch.late_preload=late)
#   kill07:   kill -9 after step 100 under NVRx 0.7.0 and 0.4.1, alternating (the GPU memory wait after a restart's stop)
#   noop:     bench/noop_timeline.py: a no-op job's wall beside torchrun, and resctl's own timeline of it
#   tutorial: pytorch/examples' DDP tutorial (multigpu_torchrun.py, datautils.py in $EXAMPLES), killed at epoch 100
#   blocked:  a survivor blocked in a CUDA kernel: 2 ranks on the one GPU over gloo, 50 ms steps; after step 15 rank 0
#             spins in a kernel and synchronizes (bench/scripts/ddp_snapshot.py --block-at 15:0), rank 1 is killed -9:
#             kill -> both ranks' first step, torchrun, resctl forked, resctl exec'd without and with standby interpreters
#             (launch.standby) alternating
#   standby:  bench/standby_cost.py: one standby interpreter's import time, CPU, memory and GPU memory
#   variants: bench/fork_step_variants.py: the step loop fresh and forked from lighter and heavier parents (VARIANTS=a,b)
#   tier:     bench/bench_memory_tier.py: the memory tier's efficiency at the 1 % plan, 6.44 GB, device staging
#   pool:     bench/scripts/intraop_pool.py under torchrun, resctl forked and exec'd: does the worker's intra-op pool run
#   facts:    the kernel, THP, CPU, and which hardware counters a process may read (bench/scripts/hwcount.py)
#   death:    bench/gpu_death_notice.py: a killed CUDA process's teardown as a launcher sees it (pipe EOF, pidfd,
#             reap) and a forked worker's CUDA context and one-rank NCCL group times
# Wheels (cp312, git-ignored, carried): .whl = the NVRx 0.4.1 set (bench/gpu_issue41.sh), .whl07 = NVRx 0.7.0.
# torch's bytecode is compiled first where the image has none (a user's image has it: pip compiles at install).
# Usage on the device: OUT=$OUT BEFORE=.gpu/before EXAMPLES=.gpu/examples bash bench/gpu_issue43.sh [parts]
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site04 .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site07 .whl07/*.whl || exit 1
export PYTHONPATH=/tmp/site04:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
BEFORE=$(realpath "${BEFORE:-.gpu/before}"); EXAMPLES=$(realpath "${EXAMPLES:-.gpu/examples}")
TORCH=$(python3 -c "import os, torch; print(os.path.dirname(torch.__file__))")
python3 -c "import importlib.metadata as m, torch; print('nvrx', m.version('nvidia-resiliency-ext'), 'torch', torch.__version__, torch.cuda.get_device_name(0))" 2>&1 | tail -1
echo "cores $(nproc); torch bytecode: $(ls "$TORCH"/__pycache__ 2>/dev/null | wc -l) files in torch/__pycache__"
if [ ! -d "$TORCH/__pycache__" ] && [ -z "${NO_COMPILE:-}" ]; then
  t0=$(date +%s); python3 -m compileall -q -j 16 "$TORCH" "$(dirname "$TORCH")/sympy" > /dev/null 2>&1
  echo "compiled torch and sympy's bytecode: $(( $(date +%s) - t0 )) s, exit $?"
fi
ROUNDS=${ROUNDS:-2}
for part in ${*:-kill happy tutorial}; do
  t0=$(date +%s)
  case $part in
    kill) for after in ${KILL_AFTERS:-15 100}; do
        launchers=${KILL_LAUNCHERS:-torchrun,resctl,resctl@before}; [ $after = 100 ] && launchers=$launchers,resctl@0.7
        timeout ${KILL_TIMEOUT:-200} python3 bench/bench_kill_resume.py --script ddp --nproc 1 --device cuda --faults $ROUNDS \
          --clean 0 --steps $((after + 25)) --kill-after $after --script-args "--step-time 0.05" --launchers $launchers \
          --nvrx-path before=$BEFORE:/tmp/site04 --nvrx-path 0.7=/tmp/site07 > "$OUT/kill-$after.json" 2> "$OUT/kill-$after.err"
        echo "== kill after $after: exit $?"; python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d['p50']['kill_to_first_step']), json.dumps(d['kill_to_first_step'])); [print(e[-300:]) for e in d.get('errors', [])]" "$OUT/kill-$after.json"
      done;;
    kill07) echo "== kill after 100, NVRx 0.7.0 beside 0.4.1 (the GPU memory wait after the stop); idle GPU memory in use:"
      nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
      timeout ${KILL_TIMEOUT:-200} python3 bench/bench_kill_resume.py --script ddp --nproc 1 --device cuda --faults $ROUNDS \
        --clean 0 --steps 125 --kill-after 100 --script-args "--step-time 0.05" --launchers ${KILL07_LAUNCHERS:-resctl@0.7,resctl} \
        --nvrx-path 0.7=/tmp/site07 --resctl-args="--set launch.run_dir=/tmp/kill07-runs/{run_id}" > "$OUT/kill07.json" 2> "$OUT/kill07.err"
      echo "exit $?"; grep "^kill_to" "$OUT/kill07.err"; grep -h "GPU memory" /tmp/kill07-runs/*/launcher.log | tail -4
      for run in /tmp/kill07-runs/*/; do  # each run's recovery phases (resctl report), kept with its launcher.log
        echo "-- $run: $(grep -o -m1 "nvidia-resiliency-ext [0-9.]*\|NVRx [0-9.]*" $run/launcher.log)"
        python3 -m resctl report "$run" --json 2>/dev/null | python3 -c "
import json, sys
for r in json.load(sys.stdin)['recoveries']:
    print('  ' + ', '.join(f'{k} {r[k]:.3f}' for k in ('total', 'detection', 'stop', 'rendezvous', 'start_workers', 'load', 'first_step') if r.get(k) is not None))"
        mkdir -p "$OUT/kill07-runs/$(basename $run)"; cp $run/*.log $run/*.jsonl "$OUT/kill07-runs/$(basename $run)/" 2>/dev/null
      done;;
    happy) echo "== happy path, cuda, 1 GPU"
      timeout ${HAPPY_TIMEOUT:-200} python3 bench/bench_happy_path.py --repeats ${REPEATS:-5} --steps ${HAPPY_STEPS:-2000} --device cuda --nproc 1 \
        ${HAPPY_BEFORE---resctl-path before=$BEFORE} ${HAPPY_ARGS:-} --json "$OUT/happy.json" > "$OUT/happy.txt" 2>&1; echo "exit $?"; tail -9 "$OUT/happy.txt";;
    profile) echo "== step phases: torchrun, resctl (forked), resctl (exec'd), alternating"
      lscpu | grep -i "^CPU(s)\|thread\|core\|socket\|numa"
      timeout ${PROFILE_TIMEOUT:-200} python3 bench/gpu_step_profile.py --repeats ${PROFILE_REPEATS:-2} --blocks ${PROFILE_BLOCKS:-8} --steps 200 \
        ${PROFILE_LAUNCHERS:+--launchers $PROFILE_LAUNCHERS} > "$OUT/profile.json" 2> "$OUT/profile.err"
      echo "exit $?"; grep " step as_is " "$OUT/profile.err"; grep -c "s as_is" "$OUT/profile.err"
      python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['summary']))" "$OUT/profile.json";;
    noop) echo "== a no-op job's timeline, torchrun and resctl alternating"
      timeout ${NOOP_TIMEOUT:-120} python3 bench/noop_timeline.py --rounds ${NOOP_ROUNDS:-3} ${NOOP_ARGS:---importtime} > "$OUT/noop.txt" 2>&1
      echo "exit $?"; cat "$OUT/noop.txt" | cut -c1-200;;
    blocked) echo "== survivor blocked in a CUDA kernel, 2 ranks on one GPU (gloo), kill -9 of rank 1 after step 15"
      timeout ${BLOCKED_TIMEOUT:-240} python3 bench/bench_kill_resume.py --script ddp --nproc 2 --device cuda --faults $ROUNDS \
        --clean 0 --steps 40 --kill-after 15 --script-args "--step-time 0.05 --backend gloo --block-at 15:0" \
        --launchers ${BLOCKED_LAUNCHERS:-torchrun,resctl,resctl:exec:nostandby,resctl:exec:standby} --timeout ${BLOCKED_ROUND_TIMEOUT:-30} \
        > "$OUT/blocked.json" 2> "$OUT/blocked.err"
      echo "exit $?"; grep "^kill" "$OUT/blocked.err"; python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d['p50']['kill_to_first_step'])); [print(e[-600:]) for e in d.get('errors', [])]" "$OUT/blocked.json";;
    variants) echo "== the tiny CUDA step in a fresh interpreter and forked from lighter and heavier parents (no launcher)"
      timeout ${VARIANTS_TIMEOUT:-200} python3 bench/fork_step_variants.py --repeats ${VARIANTS_REPEATS:-2} --steps 4000 \
        ${VARIANTS:+--variants $VARIANTS} > "$OUT/variants.json" 2> "$OUT/variants.err"
      echo "exit $?"; python3 -c "import json,sys; [print(k, json.dumps(v)) for k, v in json.load(open(sys.argv[1]))['summary'].items()]" "$OUT/variants.json";;
    tier) echo "== memory tier, 6.44 GB, device staging, efficiency at the 1 % plan"
      timeout ${TIER_TIMEOUT:-300} python3 bench/bench_memory_tier.py --params-m 537 --device cuda --stage device --dir /var/tmp/resctl-bench-mem \
        --saves ${TIER_SAVES:-3} --restores ${TIER_RESTORES:-1} --efficiency --budget 0.01 --json "$OUT/mem-device.json" 2> "$OUT/mem-device.log" > /dev/null
      echo "exit $?"; grep -E "efficiency|stall|restore" "$OUT/mem-device.log" | tail -8; rm -rf /var/tmp/resctl-bench-mem;;
    pool) echo "== a worker's intra-op pool: OS threads and a CPU matmul with the pool / one thread, alternating"
      for i in 1 2; do
        for l in torchrun resctl resctl_exec; do
          case $l in torchrun) cmd="python3 -m torch.distributed.run --nproc-per-node 1";;
            resctl) cmd="python3 -m resctl run --nproc-per-node 1 --run-dir /tmp/pool-$l-$i";;
            resctl_exec) cmd="python3 -m resctl run --set launch.worker_start=exec --nproc-per-node 1 --run-dir /tmp/pool-$l-$i";; esac
          echo "$l $(timeout 120 $cmd bench/scripts/intraop_pool.py 2>&1 | grep '^POOL')"
        done
      done;;
    facts) echo "== the machine: kernel $(uname -r); THP $(cat /sys/kernel/mm/transparent_hugepage/enabled); perf_event_paranoid $(cat /proc/sys/kernel/perf_event_paranoid 2>&1)"
      lscpu | grep -i "model name\|^CPU(s)\|thread\|socket\|numa\|MHz\|hypervisor"
      python3 -c "import sys; sys.path.insert(0, 'bench/scripts'); import hwcount; c = hwcount.Counters(); print('hw counters:', sorted(c.fds), c.error or 'all')";;
    death) echo "== a killed CUDA process's teardown; persistence mode: $(nvidia-smi --query-gpu=persistence_mode --format=csv,noheader)"
      timeout 120 python3 bench/gpu_death_notice.py --rounds ${DEATH_ROUNDS:-4} --gib ${DEATH_GIB:-2} > "$OUT/death.json" 2> "$OUT/death.err"
      echo "exit $?"; python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['medians']))" "$OUT/death.json";;
    standby) echo "== one standby interpreter's cost (torch, the shim, torch._dynamo and FSDP imported)"
      timeout 120 python3 bench/standby_cost.py --late --repeats 3 > "$OUT/standby.json" 2> "$OUT/standby.err"
      echo "exit $?"; cut -c1-400 "$OUT/standby.json" | tail -c 400;;
    tutorial) echo "== DDP tutorial, 1 GPU, kill at epoch 100"
      timeout ${TUTORIAL_TIMEOUT:-120} python3 bench/bench_tutorial_kill.py --examples "$EXAMPLES" --rounds $ROUNDS --keep "$OUT/tutorial-runs" \
        > "$OUT/tutorial.json" 2> "$OUT/tutorial.err"
      echo "exit $?"; python3 -c "
import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d['p50']))
[print(e[-400:]) for e in d.get('errors', [])]" "$OUT/tutorial.json";;
  esac
  echo "($part: $(( $(date +%s) - t0 )) s)"
done
cd "$OUT" && tar czf logs.tgz --exclude logs.tgz . 2>/dev/null; true
