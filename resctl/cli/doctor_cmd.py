"""`resctl doctor`: preflight checks of this node (GPUs, NVLink, EFA, storage, shm, ...)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from resctl.cli.render import err_console
from resctl.errors import UsageError

EPILOG = (
    "Examples: resctl doctor -p prod.toml  |  resctl doctor --json --strict  |  "
    "resctl doctor --only storage --dir /fsx/ckpt  |  resctl doctor --deep --skip efa  |  "
    "resctl doctor --cluster (on every node at once). "
    "Exit codes: 0 fit, 1 a check failed (or warned, with --strict), 2 usage or profile error."
)

STYLE = {"PASS": "green", "WARN": "yellow", "FAIL": "bold red", "SKIP": "dim"}


def _names(values: list[str] | None) -> list[str]:
    return [n.strip() for v in values or [] for n in v.split(",") if n.strip()]


def doctor(
    profile: Annotated[Path | None, typer.Option("-p", "--profile", help="Profile file (default: ./resctl.toml when present).")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override one key: SECTION.KEY=VALUE (repeatable).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout (schema in docs/doctor.md).")] = False,
    only: Annotated[list[str] | None, typer.Option("--only", help="Run only these probes (comma-separated or repeated).")] = None,
    skip: Annotated[list[str] | None, typer.Option("--skip", help="Leave out these probes.")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 on warnings too.")] = False,
    deep: Annotated[bool, typer.Option("--deep", help="Also benchmark every GPU (matmul, host<->device, GPU-to-GPU); imports torch.")] = False,
    directory: Annotated[str | None, typer.Option("--dir", help="Directory the storage probe tests (default: checkpoint.dir).")] = None,
    storage_mb: Annotated[int | None, typer.Option("--storage-mb", min=0, help="MB the storage test writes (doctor.storage_test_mb); 0 skips it.")] = None,
    root: Annotated[Path, typer.Option("--root", help="Read /sys, /proc, /dev and nvml.json under this node snapshot instead of this machine.")] = Path("/"),
    cluster: Annotated[bool, typer.Option("--cluster", help="Run on every node at once: collectives in pairs and all together, a matmul per device; names slow or broken nodes (docs/doctor.md).")] = False,
) -> None:
    """Check that this node is fit to train.

    GPUs, NVLink, EFA, storage, /dev/shm, memlock, env, DNS, clock, memory.

    Probes: gpu, nvlink, efa, storage, shm, memlock, env, dns, clock, memory.
    """
    from resctl.doctor import make_context, run, select
    from resctl.profile.load import resolve

    names = select(_names(only), _names(skip))
    sets = list(set_ or [])
    if storage_mb is not None:
        sets.append(f"doctor.storage_test_mb={storage_mb}")
    resolved = resolve(profile, sets=sets)
    err_console.print(resolved.loaded(), markup=False, highlight=False)
    if cluster:
        from resctl.cli.doctor_cluster import doctor_cluster

        raise typer.Exit(doctor_cluster(resolved, as_json))
    if root != Path("/") and not root.is_dir():
        raise UsageError(f"--root {root}: not a directory")
    explicit = frozenset(k for k in resolved.sources if k.startswith("doctor."))
    with _progress(err_console) as progress:
        ctx = make_context(resolved.profile, root=root.resolve(), checkpoint_dir=directory, deep=deep,
                           progress=progress, explicit=explicit)
        report = run(ctx, names)
    if as_json:
        typer.echo(json.dumps(report.to_json(strict), indent=2))
    else:
        _table(err_console, report, strict)
    raise typer.Exit(report.exit_code(strict))


def preflight_check(resolved: Any) -> bool:
    """`resctl run --preflight`: every probe but --deep on this node; prints the table when a check
    fails and returns False (nothing is launched), else one summary line and True."""
    from resctl.doctor import make_context, run, select

    explicit = frozenset(k for k in resolved.sources if k.startswith("doctor."))
    with _progress(err_console) as progress:
        report = run(make_context(resolved.profile, root=Path("/"), checkpoint_dir=None, deep=False,
                                  progress=progress, explicit=explicit), select([], []))
    if report.exit_code(False) != 0:
        _table(err_console, report, False)
        err_console.print(Text("resctl: preflight failed: not launching (see `resctl doctor`)", style="bold red"))
        return False
    counts = ", ".join(f"{n} {s}" for s, n in report.counts().items() if n)
    err_console.print(Text(f"resctl: preflight ok ({counts}, {report.duration_s:.1f}s)"))
    return True


class _progress:
    """A rich progress bar on stderr for the storage test; nothing when stderr is not a terminal."""

    def __init__(self, console: Any) -> None:
        self.console = console
        self.bar: Any = None
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> Any | None:
        if not self.console.is_terminal:
            return None
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                            console=self.console, transient=True)
        self.bar.start()
        return self.update

    def update(self, phase: str, done: int, total: int) -> None:
        if phase not in self.tasks:
            self.tasks[phase] = self.bar.add_task(phase, total=total)
        self.bar.update(self.tasks[phase], completed=done)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def expected_unit(check: Any) -> str:
    """" GB" after an expected 1.0, as after the measured value; nothing after words ("1 or unset")."""
    return f" {check.unit}" if check.unit and isinstance(check.expected, (int, float)) else ""


def _table(console: Any, report: Any, strict: bool) -> None:
    from rich.table import Table

    e = report.expectations
    title = f"resctl doctor: {report.host}" + (f" ({e['instance_type']}, {e['instance_source']})"
                                               if e.get("instance_type") else "")
    table = Table(title=title, title_justify="left")
    table.add_column("check", no_wrap=True)  # probe.check in one column: the detail gets the width
    table.add_column("status", no_wrap=True)
    # the detail names what to set (TORCH_NCCL_ASYNC_ERROR_HANDLING=...): on a 100-column terminal
    # it keeps room for such a name whole, as measured and expected wrap first; nothing is cut
    table.add_column("measured", overflow="fold", max_width=12)
    table.add_column("expected", overflow="fold", max_width=12)
    table.add_column("detail", overflow="fold")
    for i, probe in enumerate(report.probes):
        if i:
            table.add_section()
        for c in probe.checks:
            unit = f" {c.unit}" if c.unit and c.measured is not None else ""
            detail = Text(c.message)
            if c.fix:
                detail.append(f"\nfix: {c.fix}", style="cyan")
            table.add_row(probe.probe if c.name == "-" else f"{probe.probe}.{c.name}",
                          Text(c.status.value, style=STYLE[c.status.value]),
                          "" if c.measured is None else f"{c.measured}{unit}",
                          "" if c.expected is None else f"{c.expected}{expected_unit(c)}", detail)
    console.print(table, soft_wrap=False)  # soft wrap would let a table run past the terminal's width
    counts = report.counts()
    verdict = "FIT" if report.exit_code(strict) == 0 else "NOT FIT"
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    console.print(Text(f"{verdict}: {summary} in {report.duration_s:.1f}s" + (" (--strict)" if strict else ""),
                       style="bold green" if verdict == "FIT" else "bold red"))
