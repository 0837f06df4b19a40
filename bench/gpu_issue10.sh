#!/usr/bin/env bash
# One device call for issue 10 on one H200 (NCCL): in-process exactness of an FSDP2 script, and
# kill -9 -> first step after the resume, torchrun vs resctl, on a DDP-tutorial-style script and an
# FSDP2 script. NVRX=0.4.1 (default) installs .whl/*.whl; NVRX=0.7.0 installs .whl07/*.whl over them.
# Usage on the device: [NPROC=2] bash bench/gpu_issue10.sh [parts: exact ddp fsdp2]   (NPROC=2 on nvidia-h200-x2)
# Wheels (cp312, downloaded here as the device README says, git-ignored): .whl = nvidia-resiliency-ext
# 0.4.1, pydantic 2.11.7, pydantic-core 2.33.2, annotated-types, typing-inspection, setproctitle,
# defusedxml, pynvml; .whl07 = nvidia-resiliency-ext 0.7.0 (manylinux_2_39; its launcher needs nothing more).
set -uo pipefail
NVRX=${NVRX:-0.4.1}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
if [ "$NVRX" = "0.7.0" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl07/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import nvidia_resiliency_ext, importlib.metadata as m, torch, resctl.cli; print('nvrx', m.version('nvidia-resiliency-ext'), 'torch', torch.__version__, torch.cuda.get_device_name(0), 'nccl', torch.cuda.nccl.version())"
parts=${*:-exact ddp fsdp2}
for part in $parts; do
  case $part in
    exact) echo "== in-process exactness, FSDP2 + DCP, 1 GPU"
      timeout ${EXACT_TIMEOUT:-240} python3 bench/gpu_inprocess_exact.py --nproc ${NPROC:-1} --device cuda --steps 20 > "$OUT/exact-$NVRX.json" 2> "$OUT/exact-$NVRX.err"
      echo "exit $?"; python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: (v['exit'], v['bitwise_equal_to_torchrun'], v['wall']) for k, v in d.items()})" "$OUT/exact-$NVRX.json";;
    ddp|fsdp2) echo "== kill -9 -> first step after resume: $part, 1 GPU, NCCL"
      timeout ${PART_TIMEOUT:-280} python3 bench/bench_kill_resume.py --script $part --nproc ${NPROC:-1} --device cuda --faults ${FAULTS:-5} --clean ${CLEAN:-3} \
        --steps 40 --kill-after 15 --script-args "--step-time 0.05" > "$OUT/kill-$part-$NVRX.json" 2> "$OUT/kill-$part-$NVRX.err"
      echo "exit $?"; grep -v Warning "$OUT/kill-$part-$NVRX.err" | grep "^kill_to\|^clean" | tr '\n' ';'; echo
      python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d['p50'])); [print(e[-400:]) for e in d.get('errors', [])]" "$OUT/kill-$part-$NVRX.json";;
  esac
done
