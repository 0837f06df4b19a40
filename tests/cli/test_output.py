"""Output read where it is not a terminal (logs, init containers, Slurm prologs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_tables_are_not_cut_to_80_columns_when_stdout_is_not_a_terminal(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = subprocess.run([sys.executable, "-m", "resctl", "doctor"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    text = out.stdout + out.stderr
    rows = [line for line in text.splitlines() if line.startswith("│ ")]
    assert rows, text
    assert "…" not in text, "no cell is cut"
    probes = [row.split("│")[1].strip() for row in rows]
    assert sum(1 for p in probes if p) >= 3, "one row per check, not a word a line"
    details = [row.split("│")[-2].strip() for row in rows]
    assert any(len(d.split()) >= 6 for d in details), "a detail reads as a sentence on one line"
