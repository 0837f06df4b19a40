#!/usr/bin/env bash
# Issue 41 on one GPU (H100/H200), one device call: FSDP2's checkpoint stall beside DDP's and beside the script's
# own synchronous DCP save, the host-copy floor, restore and loop efficiency (bench_fsdp_save.py: torchrun and resctl
# alternating); the straggler timing on CUDA (bench/gpu_straggler.py); the happy path's step (bench_happy_path.py).
# Wheels (cp312, git-ignored, carried): .whl = nvidia-resiliency-ext 0.4.1, pydantic 2.11.7, pydantic-core 2.33.2,
# annotated-types, typing-inspection, setproctitle, defusedxml, pynvml, crc32c, plotly.
# planned: the loop's efficiency at the interval `resctl tune-interval` plans from a calibration run of the same job
# (memory tier on; MTBF 24 h a node, 16 nodes), torchrun and resctl alternating, 2 intervals long.
# Usage on the device: OUT=$OUT bash bench/gpu_issue41.sh [parts: stall profile verify planned straggler happy]
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site04 .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site04:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 -c "import importlib.metadata as m, torch; print('nvrx', m.version('nvidia-resiliency-ext'), 'torch', torch.__version__, torch.cuda.get_device_name(0))" 2>&1 | tail -1
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
for part in ${*:-stall straggler happy}; do
  case $part in
    stall) echo "== FSDP2 vs DDP vs own sync DCP: stall, host copy, restore, efficiency; 1 GPU, 8 x Linear(8192, 8192) + AdamW (6.4 GB of state)"
      df -h /tmp | tail -1
      timeout ${STALL_TIMEOUT:-330} python3 bench/bench_fsdp_save.py --device cuda --nproc 1 --layers ${LAYERS:-8} --width 8192 \
        --steps ${STEPS:-60} --interval ${INTERVAL:-20} --step-time ${STEP_TIME:-0.25} --memory-every ${MEMORY_EVERY:-20} --restore \
        ${SPLIT---split-wait} --repeats 1 --cases ${CASES:-fsdp2:resctl,ddp:resctl,fsdp2:dcp} --launchers ${LAUNCHERS:-torchrun,resctl} \
        --json "$OUT/stall41.json" 2> "$OUT/stall41.err"
      echo "exit $?"; grep "^\[" "$OUT/stall41.err";;
    profile) echo "== FSDP2's save call profiled (resctl run, 1 GPU, 8 x Linear(8192, 8192) + AdamW): with the memory tier (a snapshot at the save step) and without"
      for every in 20 0; do
        timeout ${PROFILE_TIMEOUT:-150} python3 -m resctl run --nproc-per-node 1 --run-dir /tmp/prof-$every --set checkpoint.interval_steps=20 \
          --set checkpoint.memory_every=$every --set checkpoint.dir=/tmp/prof-ck-$every bench/scripts/fsdp_stall.py --device cuda \
          --layers 8 --width 8192 --steps 60 --interval 20 --step-time 0.25 --split-wait --profile-save 2 > "$OUT/profile-$every.txt" 2>&1
        echo "memory_every=$every: exit $?"; grep "^STALL" "$OUT/profile-$every.txt" | cut -c1-400
        grep -A40 "PROFILE OF" "$OUT/profile-$every.txt" | grep -v "^ *$" | head -42 | cut -c1-160; rm -rf /tmp/prof-ck-$every
      done;;
    verify) echo "== FSDP2 saves written and loaded back (resctl run, 1 GPU, 8 x Linear(8192, 8192) + AdamW, a save every 20 of 60 steps): the disk checkpoint of step 60 against the state, with the code before (BEFORE41) and now; the memory tier's restore now"
      for case in ${VERIFY_CASES:-before:0 now:0 now:20}; do
        tree=${case%%:*}; every=${case##*:}; path=$PWD; [ $tree = before ] && path=$(realpath ${BEFORE41:-.gpu/before41}):$PWD
        PYTHONPATH=/tmp/site04:$path timeout ${VERIFY_TIMEOUT:-120} python3 -m resctl run --nproc-per-node 1 --run-dir /tmp/v-$tree-$every \
          --set checkpoint.interval_steps=20 --set checkpoint.memory_every=$every --set checkpoint.dir=/tmp/v-ck-$tree-$every \
          bench/scripts/fsdp_stall.py --device cuda --layers 8 --width 8192 --steps ${VERIFY_STEPS:-60} --interval 20 --step-time 0.25 \
          --split-wait --restore > "$OUT/verify-$tree-$every.txt" 2>&1
        echo "$tree, memory_every=$every: exit $?"; grep "^STALL" "$OUT/verify-$tree-$every.txt" | cut -c1-600
        grep -h "ckpt_load" /tmp/v-$tree-$every/events-rank0.jsonl 2>/dev/null | tail -1 | cut -c1-300; rm -rf /tmp/v-ck-$tree-$every
      done;;
    planned) echo "== efficiency at the planned interval: calibrate (resctl run, a save every 20 steps, memory_every 20), plan, run 2 intervals"
      cal=/tmp/plan-cal; rm -rf $cal /tmp/plan-ck
      timeout ${PLAN_TIMEOUT:-150} python3 -m resctl run --nproc-per-node 1 --run-dir $cal --set checkpoint.interval_steps=20 \
        --set checkpoint.memory_every=20 --set checkpoint.dir=/tmp/plan-ck bench/scripts/fsdp_stall.py --device cuda --layers 8 \
        --width 8192 --steps 60 --interval 20 --step-time 0.25 --split-wait > "$OUT/plan-cal.txt" 2>&1; echo "calibration: exit $?"
      rm -rf /tmp/plan-ck
      python3 -m resctl tune-interval --from-run $cal --mtbf ${MTBF:-24h} --nodes ${NODES:-16} > "$OUT/plan.txt" 2>&1
      python3 -m resctl tune-interval --from-run $cal --mtbf ${MTBF:-24h} --nodes ${NODES:-16} --json > "$OUT/plan.json" 2>/dev/null
      read interval every < <(python3 -c "import json,sys; p=json.load(open(sys.argv[1]))['profile']; print(p['interval_steps'], p.get('memory_every', 0))" "$OUT/plan.json")
      echo "planned: interval_steps=$interval memory_every=$every"; grep -i "efficien\|overhead" "$OUT/plan.txt" | head -6
      timeout ${PLANNED_TIMEOUT:-400} python3 bench/bench_fsdp_save.py --device cuda --nproc 1 --layers 8 --width 8192 \
        --steps $((2 * interval)) --interval $interval --step-time 0.25 --memory-every $every --split-wait --repeats 1 \
        --cases fsdp2:resctl --launchers torchrun,resctl --json "$OUT/planned.json" 2> "$OUT/planned.err"
      echo "exit $?"; grep "^\[" "$OUT/planned.err"
;;
    straggler) echo "== stragglers on CUDA: DDP, 2 ranks on GPU 0 over gloo, rank 1 +delay after backward, then before forward"
      for where in after before; do
        timeout ${STRAGGLER_TIMEOUT:-150} python3 bench/gpu_straggler.py --device cuda --runs 1 --model ddp --where $where \
          --json "$OUT/straggler-$where.json" > "$OUT/straggler-$where.txt" 2>&1
        echo "exit $?"; tail -12 "$OUT/straggler-$where.txt"
      done;;
    happy) echo "== happy path, 1 GPU, torchrun vs resctl (step median of medians, no-op wall)"
      timeout ${HAPPY_TIMEOUT:-240} python3 bench/bench_happy_path.py --device cuda --nproc 1 --steps 2000 --repeats ${HAPPY_REPEATS:-3} \
        > "$OUT/happy.txt" 2>&1
      echo "exit $?"; tail -12 "$OUT/happy.txt";;
  esac
done
