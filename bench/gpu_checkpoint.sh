#!/usr/bin/env bash
# One device call: environment facts + the full checkpoint benchmark on one H200.
# Usage (on the GPU machine, from the repo root): OUT=<dir> bash bench/gpu_checkpoint.sh [extra bench args]
# Writes $OUT/env.txt, $OUT/bench.json, $OUT/bench.log. No CLI deps needed: the bench imports only
# resctl.checkpoint (torch + stdlib), with the repo on PYTHONPATH.
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
  date -u; uname -a; nproc; free -g; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
  python3 -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name())'
  python3 - <<'PY'
import importlib.util as u, zlib
for m in ("typer", "rich", "pydantic", "psutil", "nvidia_resiliency_ext"):
    print(m, "present" if u.find_spec(m) else "MISSING")
print("zlib", zlib.ZLIB_RUNTIME_VERSION)
PY
  echo "--- df -T"; df -T / "$PWD" /tmp /root /var/tmp /dev/shm 2>&1
  echo "--- mounts"; grep -v -E 'cgroup|proc|sysfs|devpts|mqueue|securityfs|debugfs|tracefs|bpf|pstore|hugetlbfs|configfs|fusectl' /proc/mounts
  echo "--- block"; lsblk -o NAME,SIZE,ROTA,TYPE,MOUNTPOINT 2>&1; cat /sys/block/*/queue/scheduler 2>/dev/null
  echo "--- vm"; sysctl vm.dirty_ratio vm.dirty_background_ratio vm.dirty_bytes vm.dirty_background_bytes 2>&1
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
# Pick a directory on a real disk: the first candidate that is not tmpfs/ramfs and has >= 40 GB free.
DIR=""
for d in /var/tmp /root "$PWD" /tmp; do
  fs=$(df -T "$d" 2>/dev/null | awk 'NR==2{print $2}'); free=$(df -B1G "$d" 2>/dev/null | awk 'NR==2{print $4}')
  if [ -n "$fs" ] && [ "$fs" != tmpfs ] && [ "$fs" != ramfs ] && [ "${free:-0}" -ge 40 ]; then DIR=$d/resctl-bench-ck; break; fi
done
[ -n "$DIR" ] || { echo "no real-disk directory with 40 GB free" | tee -a "$OUT/env.txt"; exit 1; }
echo "bench dir: $DIR ($(df -T "$(dirname "$DIR")" | awk 'NR==2{print $1, $2}'))" | tee -a "$OUT/env.txt"
python3 bench/bench_checkpoint.py --state model --params-m 537 --batch 8192 --device cuda --writers 8 \
  --writer-sweep "${SWEEP:-4,16}" --repeats 3 --eff-mults "${MULTS:-1.25,5}" --eff-saves 2 \
  --dir "$DIR" --json "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log"
