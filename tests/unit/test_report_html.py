"""`resctl report --html`: the page says what the text report says, rendered in a real browser
(headless Chromium) and read back from its DOM; the plots are checked on the figures themselves."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resctl.cli.report_cmd import load_analysis
from resctl.telemetry.goodput import RECOVERY_PHASES
from resctl.telemetry.report_html import PHASE_COLORS, figures
from resctl.telemetry.report_rows import spans

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"
ZERO_EDIT = RUNS / "zero_edit_inprocess"  # a real run: in-process + launcher restart, torch.load resumes
MEMORY = RUNS / "memory_tier"  # a real run: memory snapshots, a SIGKILL resumed from memory
SPAWNED = RUNS / "faults_spawned"  # crafted (make_runs.py): a launcher restart in all its phases, an in-process one
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


class Tables(HTMLParser):
    """{table id: rows of cell texts} of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.current: str | None = None
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.current = dict(attrs).get("id") or ""
            self.tables[self.current] = []
        elif tag == "tr" and self.current is not None:
            self.tables[self.current].append([])
        elif tag in ("td", "th") and self.current is not None:
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self.cell is not None and self.current is not None:
            self.tables[self.current][-1].append("".join(self.cell).strip())
            self.cell = None
        elif tag == "table":
            self.current = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def tables(page: str) -> dict[str, list[list[str]]]:
    parser = Tables()
    parser.feed(page)
    return parser.tables


def write_report(run: Path, tmp_path: Path) -> tuple[Path, dict]:  # type: ignore[type-arg]
    out = tmp_path / f"{run.name}.html"
    proc = subprocess.run([sys.executable, "-m", "resctl", "report", str(run), "--html", str(out), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return out, json.loads(proc.stdout)


def chromium(page: Path, tmp_path: Path, *extra: str) -> str:
    profile = tmp_path / "chromium-profile"  # fresh: no state from another run or test
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", "--window-size=1400,3000", "--virtual-time-budget=10000", *extra,
           page.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def rows(table: list[list[str]]) -> dict[str, str]:
    return {r[0]: r[1] for r in table if len(r) == 2}


def columns(table: list[list[str]]) -> list[dict[str, str]]:
    """The body rows of a table, each as {heading: cell}."""
    return [dict(zip(table[0], r)) for r in table[1:]]


def terminal_table(text: str, title: str) -> list[list[str]]:
    """The cells of the rich table under `title` in `resctl report`'s terminal output, heading first."""
    lines = text.splitlines()
    start = lines.index(title)
    out = []
    for line in lines[start + 1:]:
        if line.startswith("└"):
            return out
        if line.startswith(("┃", "│")):
            out.append([c.strip() for c in line.replace("┃", "│").split("│")[1:-1]])
    raise AssertionError(f"table {title!r} not closed")


def test_the_page_answers_what_an_operator_asks(tmp_path: Path) -> None:
    """Read from the raw page (no browser needed): the same numbers as `resctl report --json`."""
    page, doc = write_report(ZERO_EDIT, tmp_path)
    t = tables(page.read_text())
    summary = rows(t["summary"])
    assert summary["steps completed"] == f"{doc['kept_steps']} kept of {doc['steps_run']} run; final step 60"
    assert summary["steps lost"].startswith(f"{doc['steps_run'] - doc['kept_steps']} rolled back")
    assert summary["ranks"] == "2: 0, 1"
    f = doc["freshness"]
    assert f"{f['max_age_s']:.1f} s" in summary["checkpoint freshness"]  # in seconds too
    assert "infrastructure goodput" in summary and "training goodput" in summary
    recoveries = columns(t["recoveries"])
    assert [(r["layer"], r["cause"], r["rank"], r["rollback"], r["steps lost"]) for r in recoveries] == [
        (rec["layer"], rec["cause"] + "*", str(rec["rank"]),
         f"{rec['last_step']}->{rec['resumed_step']} (source=torch.load)", str(rec["rollback_steps"]))
        for rec in doc["recoveries"]]  # cause and layer of each restart, drills marked, rollback, where from
    assert sorted(tuple(r) for r in t["causes"][1:]) == sorted((c, str(n)) for c, n in doc["causes"].items())
    restarts = [r for r in t["timeline"][1:] if r[4] == "restart"]
    assert {r[5].split("layer=")[1] for r in restarts} == {"inprocess", "launcher"}


def test_memory_snapshots_and_the_tier_are_on_the_page(tmp_path: Path) -> None:
    page, doc = write_report(MEMORY, tmp_path)
    t = tables(page.read_text())
    assert rows(t["summary"])["memory snapshots"].startswith(f"{doc['calibration']['mem_snapshots']} (reference rank)")
    assert [r["rollback"] for r in columns(t["recoveries"])] == ["23->20 (memory)"]


def test_restarts_are_drawn_as_their_layer_at_the_step_they_interrupted() -> None:
    a = load_analysis(ZERO_EDIT)
    (timeline, bars) = figures(a)
    traces = {tr.name: tr for tr in timeline.data}
    launcher, inprocess = traces["launcher restart"], traces["in-process restart"]
    assert len(launcher.y) == 2 and set(launcher.y) == {35}  # not at step 0
    assert len(inprocess.y) == 2 and set(inprocess.y) == {15}
    assert "infrastructure goodput" in traces and "checkpoint age (s)" in traces
    # no start event of this run says when its process was created: no "start workers" bar
    assert [tr.name for tr in bars.data] == ["detect", "stop", "rendezvous", "restore", "first step"]
    assert bars.layout.height >= 300


def test_the_recovery_phases_are_the_text_reports(tmp_path: Path) -> None:
    """Issue 25's split of the restart (stop, rendezvous, start workers) on the page: the same rows
    as the terminal report's tables (goodput and ranks too), the numbers of --json, a bar per phase."""
    page, doc = write_report(SPAWNED, tmp_path)
    t = tables(page.read_text())
    text = subprocess.run([sys.executable, "-m", "resctl", "report", str(SPAWNED)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "200"}).stdout
    head = ["#", "detect", "stop", "rendezvous", "start workers", "restore", "first step"]
    assert t["recovery-phases"] == terminal_table(text, "recovery phases per fault (s)") == [
        head, ["1", "2.00", "0.00", "1.50", "1.00", "2.00", "1.50"], ["2", "2.00", "-", "0.50", "-", "1.00", "0.50"]]
    assert [[f"{v:.2f}" if (v := rec[k]) is not None else "-" for k, _ in RECOVERY_PHASES]
            for rec in doc["recoveries"]] == [r[1:] for r in t["recovery-phases"][1:]]
    stats = t["recovery-stats"]
    assert stats == terminal_table(text, f"recovery of {len(doc['recoveries'])} fault(s)")
    assert [r[0] for r in stats[1:]] == ["total (fault -> first step)", "detect", "stop", "rendezvous", "start workers",
                                         "restart (stop + rendezvous + start)", "restore", "first step",
                                         "rollback (steps)"]
    assert rows(t["summary"]) == rows(terminal_table(text, "goodput"))  # the goodput table too, row for row
    assert t["ranks"] == terminal_table(text, "step time per rank")  # and the per-rank step times
    assert t["recoveries"] == terminal_table(text, "faults")  # and the faults
    assert t["causes"] == terminal_table(text, "restart causes")
    assert [r[0] for r in t["ranks"][1:]] == ["0", "1"]
    (_, bars) = figures(load_analysis(SPAWNED))
    assert [tr.name for tr in bars.data] == [label for _, label in RECOVERY_PHASES]
    assert [list(tr.x) for tr in bars.data] == [[rec[k] or 0.0 for rec in doc["recoveries"]] for k, _ in RECOVERY_PHASES]
    assert list(PHASE_COLORS) == [k for k, _ in RECOVERY_PHASES]


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium); "
                                              ".ci/run installs it")
def test_rendered_in_chromium(tmp_path: Path) -> None:
    page, doc = write_report(ZERO_EDIT, tmp_path)
    dom = chromium(page, tmp_path, "--dump-dom")
    t = tables(dom)
    assert {"summary", "recoveries", "recovery-phases", "recovery-stats", "causes", "timeline"} <= set(t)
    assert [r["rollback"] for r in columns(t["recoveries"])] == ["15->10 (source=torch.load)",
                                                                  "35->30 (source=torch.load)"]
    # plotly drew both figures: the legends list every trace, all four phases of the bar chart included
    legend = Legends()
    legend.feed(dom)
    assert len(legend.plots) == 2, legend.plots
    timeline, bars = legend.plots
    assert {"launcher restart", "in-process restart", "fault (* drill)", "training goodput",
            "infrastructure goodput", "checkpoint age (steps)", "checkpoint age (s)"} <= set(timeline["legend"])
    assert bars["legend"] == ["detect", "stop", "rendezvous", "restore", "first step"], bars
    assert bars["height"] >= 300 and not bars["scrolls"] and not timeline["scrolls"], legend.plots
    shot = tmp_path / "report.png"
    chromium(page, tmp_path, f"--screenshot={shot}")
    assert shot.stat().st_size > 50_000  # a drawn page, not a blank one
    # a run whose start events say when each process was created: all six phases, legend whole
    page, _ = write_report(SPAWNED, tmp_path)
    dom = chromium(page, tmp_path, "--dump-dom")
    legend = Legends()
    legend.feed(dom)
    bars = legend.plots[1]
    assert bars["legend"] == ["detect", "stop", "rendezvous", "start workers", "restore", "first step"], bars
    assert not bars["scrolls"], bars
    assert tables(dom)["recovery-phases"][1] == ["1", "2.00", "0.00", "1.50", "1.00", "2.00", "1.50"]


class Legends(HTMLParser):
    """Per plotly figure of a rendered DOM: its svg height, its legend's texts, and whether plotly
    had to give the legend a scrollbar (it did not fit: some entries hidden)."""

    def __init__(self) -> None:
        super().__init__()
        self.plots: list[dict] = []  # type: ignore[type-arg]
        self.in_legend = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "div" and "js-plotly-plot" in classes:
            self.plots.append({"height": None, "legend": [], "scrolls": False})
        elif not self.plots:
            return
        elif tag == "svg" and "main-svg" in classes and self.plots[-1]["height"] is None:
            self.plots[-1]["height"] = float(a.get("height") or 0)
        elif tag == "text" and "legendtext" in classes:
            self.in_legend = True
        elif tag == "rect" and "scrollbar" in classes and float(a.get("height") or 0) > 0:
            self.plots[-1]["scrolls"] = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "text":
            self.in_legend = False

    def handle_data(self, data: str) -> None:
        if self.in_legend and self.plots:
            self.plots[-1]["legend"].append(data)


@given(st.sets(st.integers(0, 5000), max_size=300))
def test_ranks_as_spans_name_every_rank_once(ranks: set[int]) -> None:
    """The summary's `ranks` row: runs of three or more as lo-hi, every rank named exactly once."""
    text = spans(sorted(ranks))
    named: list[int] = []
    for part in filter(None, text.split(", ")):
        lo, _, hi = part.partition("-")
        named += range(int(lo), int(hi or lo) + 1)
    assert named == sorted(ranks)
    assert len(text) <= len(", ".join(map(str, sorted(ranks))))
