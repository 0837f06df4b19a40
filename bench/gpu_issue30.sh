#!/usr/bin/env bash
# Issue 30 on one H200, one device call: the same resctl on NVRx 0.4.1 and 0.7.0.
#   lines: console lines of a one-line script under resctl (what is not the script's), 0.4.1 and 0.7.0
#   kill:  kill -9 -> first step after the resume, DDP-tutorial-style script, 1 GPU, NCCL:
#          torchrun, resctl on 0.4.1, resctl on 0.7.0, alternating round by round (bench_kill_resume.py)
# Wheels (cp312, git-ignored, carried): .whl = the 0.4.1 set (see bench/gpu_issue10.sh), .whl07 = NVRx 0.7.0.
# 0.4.1 installs into /tmp/site04 (with its dependencies); 0.7.0 alone into /tmp/site07, put first on
# PYTHONPATH for `resctl@0.7` (its dist-info is found first: importlib.metadata says 0.7.0).
# Usage on the device: OUT=$OUT bash bench/gpu_issue30.sh [parts: lines kill]   (~6 min; kill part capped at 420 s)
# Another resctl beside them: LAUNCHERS=torchrun,resctl,resctl@0.7,resctl@old EXTRA_PATHS="--nvrx-path old=$PWD/DIR"
# (DIR holds that resctl/ package, e.g. `git archive REV resctl | tar -x -C DIR`).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site04 .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site07 .whl07/*.whl || exit 1
export PYTHONPATH=/tmp/site04:$PWD PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 NCCL_NVLS_ENABLE=0
for pp in /tmp/site04 /tmp/site07:/tmp/site04; do
  PYTHONPATH=$pp:$PWD python3 -c "import importlib.metadata as m, torch, resctl.cli, nvidia_resiliency_ext.fault_tolerance.launcher; print('nvrx', m.version('nvidia-resiliency-ext'), 'torch', torch.__version__, torch.cuda.get_device_name(0))" 2>&1 | tail -1
done
printf 'import torch\nprint("one line", torch.cuda.is_available())\n' > /tmp/one_line.py
for part in ${*:-lines kill}; do
  case $part in
    lines) echo "== console lines besides the script's, 1 GPU (3 runs each; 0.4.1 then 0.7.0)"
      for i in 1 2 3; do
        for v in 0.4.1 0.7.0; do
          pp=/tmp/site04; [ "$v" = 0.7.0 ] && pp=/tmp/site07:/tmp/site04
          t0=$(date +%s%N)
          PYTHONPATH=$pp:$PWD timeout 120 python3 -m resctl run --nproc-per-node 1 --run-dir /tmp/r30 /tmp/one_line.py > "$OUT/lines-$v.txt" 2>&1; rc=$?
          echo "$v rc=$rc wall=$(( ($(date +%s%N) - t0) / 1000000 )) ms console lines besides the script's: $(grep -vc '^one line' "$OUT/lines-$v.txt")"
        done
      done
      echo "-- 0.7.0 console:"; cat "$OUT/lines-0.7.0.txt";;
    kill) echo "== kill -9 -> first step after resume: ddp, 1 GPU, torchrun vs resctl (0.4.1) vs resctl (0.7.0)"
      timeout ${KILL_TIMEOUT:-420} python3 bench/bench_kill_resume.py --script ddp --nproc 1 --device cuda --faults ${FAULTS:-3} --clean ${CLEAN:-2} \
        --steps 150 --kill-after 100 --script-args "--step-time 0.05" --launchers ${LAUNCHERS:-torchrun,resctl,resctl@0.7} \
        --nvrx-path 0.7=/tmp/site07 ${EXTRA_PATHS:-} > "$OUT/kill30.json" 2> "$OUT/kill30.err"
      echo "exit $?"; grep "^kill_to\|^clean" "$OUT/kill30.err" | tr '\n' ';'; echo
      python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d['p50'])); [print(e[-600:]) for e in d.get('errors', [])]" "$OUT/kill30.json";;
  esac
done
