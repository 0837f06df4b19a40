#!/usr/bin/env bash
# The CPU demo: install resctl into .venv, then run a 2-worker gloo job (examples/train_snapshot.py,
# an unmodified torchrun-style script) whose rank 1 is SIGKILLed at step 25 by a fault drill.
# ft_launcher restarts the workers in-job, the script resumes from its snapshot, the job exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
.venv/bin/pip install -q -e . torch==2.13.0 nvidia-resiliency-ext==0.4.1
work=$(mktemp -d -t resctl-demo-XXXXXX)
.venv/bin/resctl run -p examples/profiles/local-cpu.toml --run-dir "$work/run" \
    --set 'faults.schedule=[{kind="sigkill", step=25, rank=1}]' \
    examples/train_snapshot.py --steps 60 --snapshot "$work/snapshot.pt"
echo "demo: the job survived the SIGKILL; events of every rank are in $work/run"
if .venv/bin/resctl report --help >/dev/null 2>&1; then .venv/bin/resctl report "$work/run"; fi
