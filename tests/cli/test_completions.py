"""The generated completion scripts in real shells, installed as the README says: what TAB offers.

bash: the function `complete -p resctl` names, called as readline calls it. zsh: an interactive zsh
on a pseudo-terminal with `compinit` and the file in its fpath; the keys `<line><TAB>` are typed
and a widget reports the buffer after the TAB and the matches the completion system produced
(`compadd -O`: zsh's own matching). fish: `complete -C` (fish's completion engine) with the file
in ~/.config/fish/completions and resctl on PATH (fish autoloads completions of commands it finds).
A shell that is not installed skips its cases (.ci/run installs zsh and fish); the last test reads
the three scripts against the CLI's own commands and options with no shell at all.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "completions"
BASH = SCRIPTS / "resctl.bash"

#: (what is typed, what TAB offers), the same in every shell. Where the last word is not an option,
#: the options are left out of the comparison (fish offers them only once a "-" is typed).
CASES = [
    ("resctl ", ["doctor", "profile", "report", "run", "store", "tune-interval"]),
    ("resctl --", ["--help", "--version"]),
    ("resctl run --nproc", ["--nproc-per-node"]),  # once, in dashes: no --nproc_per_node
    ("resctl run --max", ["--max-restarts"]),
    ("resctl run --nproc-per-node 2 --ma", ["--master-addr", "--master-port", "--max-restarts"]),
    ("resctl run --start-method ", ["fork", "forkserver", "spawn"]),  # values, not file names
    ("resctl run --start_method f", ["fork", "forkserver"]),  # an alias typed still gets its values
    ("resctl run --rdzv-backend ", ["c10d"]),
    ("resctl run --nproc-per-node 2 tr", ["train.py"]),  # the script: files
    ("resctl doctor --only s", ["shm", "storage"]),
    ("resctl profile ", ["init", "show", "validate"]),
    ("resctl profile show ", []),  # its own words only: not init/show/validate again
    ("resctl profile show -", ["--help", "--json", "--profile", "--set", "-p"]),
    ("resctl report --", ["--help", "--html", "--json"]),
]


def _offered(line: str, got: list[str]) -> list[str]:
    last = line.split(" ")[-1]
    return sorted(w for w in got if last.startswith("-") or not w.startswith("-"))


def _shell(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (apt-get install {name}; .ci/run installs it)")
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home with the scripts installed the README's way, and a directory holding train.py."""
    home = tmp_path_factory.mktemp("home")
    (home / "work").mkdir()
    (home / "work" / "train.py").write_text("")
    (home / ".zfunc").mkdir()
    shutil.copy(SCRIPTS / "_resctl", home / ".zfunc" / "_resctl")
    (home / ".config" / "fish" / "completions").mkdir(parents=True)
    shutil.copy(SCRIPTS / "resctl.fish", home / ".config" / "fish" / "completions" / "resctl.fish")
    return home


def bash_tab(line: str, cwd: Path) -> list[str]:
    """What bash completes for the last word of `line` ("" when it ends in a space), through the
    function `complete -p resctl` names, as bash's readline would call it."""
    words = line.split() + ([""] if line.endswith(" ") else [])
    quoted = " ".join(f"'{w}'" for w in words)
    script = (f"source {BASH}\n"
              "fn=$(complete -p resctl | sed -n 's/.*-F \\([^ ]*\\) resctl$/\\1/p')\n"
              f"COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}\n"
              '"$fn" resctl "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"\n'
              'printf "%s\\n" "${COMPREPLY[@]}"\n')
    out = subprocess.run([_shell("bash"), "--norc", "--noprofile", "-c", script], cwd=cwd, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return [w for w in out.stdout.splitlines() if w]


ZSHRC = """PS1='> '
fpath=(~/.zfunc $fpath); autoload -Uz compinit && compinit -u -d ~/.zcompdump
# every match a completion function adds, as zsh matched it (-O: matched, not added); a call
# that only queries (-O/-A/-D of its own, as _path_files makes) is passed through
typeset -ga _caught
compadd() {
    if (( ${@[(I)-[OAD]*]} )); then builtin compadd "$@"; return; fi
    local -a _m
    builtin compadd -O _m "$@"
    _caught+=("${_m[@]}")
    builtin compadd "$@"
}
integer _n=0
_report() { print -rl -- "$BUFFER" "${_caught[@]}" > ~/zsh-out/$(( ++_n )); _caught=(); BUFFER=""; }
zle -N _report
bindkey '^T' _report
"""


class Zsh:
    """An interactive zsh on a pseudo-terminal: `tab(line)` types `line`, TAB, then ^T (the report)."""

    def __init__(self, home: Path) -> None:
        (home / ".zshrc").write_text(ZSHRC)
        self.out = home / "zsh-out"
        self.out.mkdir()
        self.n = 0
        master, slave = os.openpty()
        env = {"HOME": str(home), "ZDOTDIR": str(home), "TERM": "xterm", "PATH": os.environ["PATH"]}
        self.proc = subprocess.Popen([_shell("zsh"), "--no-globalrcs", "-i"], stdin=slave, stdout=slave,
                                     stderr=slave, cwd=home / "work", env=env, start_new_session=True)
        os.close(slave)
        self.master = master
        self.screen = b""

    def tab(self, line: str) -> tuple[str, list[str]]:
        """(the command line after the TAB, the matches offered)."""
        self.n += 1
        report = self.out / str(self.n)
        os.write(self.master, line.encode() + b"\t\x14")
        deadline = time.monotonic() + 60  # a loaded box: zsh's start and compinit take their time
        while not (report.exists() and report.read_text().endswith("\n")):
            assert time.monotonic() < deadline and self.proc.poll() is None, self.screen[-3000:].decode(errors="replace")
            if select.select([self.master], [], [], 0.1)[0]:  # drain the terminal: zsh must never block on it
                self.screen += os.read(self.master, 65536)
        buffer, *matches = report.read_text().splitlines()
        return buffer, matches

    def close(self) -> None:
        os.write(self.master, b"exit\r")
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)


@pytest.fixture(scope="module")
def zsh(work: Path) -> Iterator[Zsh]:
    shell = Zsh(work)
    yield shell
    shell.close()


def fish_tab(line: str, home: Path) -> list[str]:
    # the installed entry point on PATH: fish autoloads the completions of a command it finds
    beside = Path(sys.executable).parent / "resctl"
    resctl = beside if beside.exists() else Path(shutil.which("resctl") or beside)
    assert resctl.exists(), f"{resctl}: resctl is not installed (pip install -e .)"
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "PATH": f"{resctl.parent}:{os.environ['PATH']}"}
    out = subprocess.run([_shell("fish"), "-c", f"complete -C '{line}'"], cwd=home / "work", env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [w.split("\t")[0] for w in out.stdout.splitlines() if w]


TABS: dict[str, Callable[[str, Any], list[str]]] = {
    "bash": lambda line, ctx: bash_tab(line, ctx["work"] / "work"),
    "zsh": lambda line, ctx: ctx["zsh"]().tab(line)[1],
    "fish": lambda line, ctx: fish_tab(line, ctx["work"]),
}


@pytest.mark.parametrize("shell", list(TABS))
@pytest.mark.parametrize("line, offered", CASES, ids=[c[0].strip() for c in CASES])
def test_tab_offers_the_same_in_every_shell(shell: str, line: str, offered: list[str], work: Path,
                                            request: pytest.FixtureRequest) -> None:
    _shell(shell)
    ctx = {"work": work, "zsh": lambda: request.getfixturevalue("zsh")}
    assert _offered(line, TABS[shell](line, ctx)) == offered


def test_zsh_completes_the_line_itself(zsh: Zsh) -> None:
    """A single match is inserted by zsh's own completion widget, as a user sees it."""
    assert zsh.tab("resctl run --nproc")[0] == "resctl run --nproc-per-node "
    assert zsh.tab("resctl run --nproc-per-node 2 tr")[0] == "resctl run --nproc-per-node 2 train.py "
    assert zsh.tab("resctl run --start_method forks")[0] == "resctl run --start_method forkserver "


def test_installed_by_source_the_readme_way() -> None:
    out = subprocess.run([_shell("bash"), "--norc", "-c", f"source {BASH}; complete -p resctl"], capture_output=True,
                         text=True)
    assert out.stdout.strip() == "complete -o default -F _resctl resctl"
    readme = (REPO / "README.md").read_text()
    for step in ("source $PWD/completions/resctl.bash", "cp completions/_resctl ~/.zfunc/",
                 "fpath=(~/.zfunc $fpath); autoload -Uz compinit && compinit",
                 "cp completions/resctl.fish ~/.config/fish/completions/"):
        assert step in readme, step  # what the tests above install is what the README says


def test_the_order_of_values_is_the_flag_tables(tmp_path: Path) -> None:
    assert bash_tab("resctl run --start-method ", tmp_path) == ["fork", "spawn", "forkserver"]
    assert not [w for w in bash_tab("resctl run --", tmp_path) if "_" in w], "underscore aliases are hidden"


def test_the_aliases_are_still_accepted(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    out = subprocess.run([sys.executable, "-m", "resctl", "run", "--nproc_per_node", "2", "--start_method", "spawn",
                          "--dry-run", "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--nproc-per-node 2" in out.stdout and "--start-method spawn" in out.stdout


def _cli() -> dict[str, set[str]]:
    """Command path -> its subcommands and offered options, read from the click command itself."""
    from resctl.cli import command
    from resctl.cli.torchrun_flags import FLAGS

    aliases = {a for flag in FLAGS for a in flag.aliases}
    out: dict[str, set[str]] = {}

    def walk(cmd: Any, path: str) -> None:
        words = {o for p in cmd.params if p.param_type_name == "option" for o in [*p.opts, *p.secondary_opts]}
        out[path] = (words - aliases) | {"--help"} | set(getattr(cmd, "commands", {}))
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}".strip())

    walk(command(), "")
    assert len(out) >= 8 and "--nproc-per-node" in out["run"] and "--nproc_per_node" not in out["run"]
    return out


def test_each_script_offers_every_command_and_option_of_the_cli_no_shell_needed() -> None:
    """Without any shell: each script's words per command path are exactly the CLI's (no alias)."""
    import re

    cli = _cli()
    for name, pattern in (("resctl.bash", r'^\s*"([^":]*):"\*\) words="([^"]*)"'),
                          ("_resctl", r'^\s*"([^":]*):"\*\) opts=\(([^)]*)\)')):
        found = {m[1]: set(m[2].split()) for m in re.finditer(pattern, (SCRIPTS / name).read_text(), re.M)}
        assert found == cli, name
    fish: dict[str, set[str]] = {}
    line = re.compile(r"^complete -c resctl -n '([^']*)'(?: -([ls]) (\S+))?(?: -x)?(?: -a '([^']*)')?", re.M)
    for cond, kind, opt, words in line.findall((SCRIPTS / "resctl.fish").read_text()):
        if "__fish_prev_arg_in" in cond:
            continue  # the values of an alias typed, not a word of its own
        path = " ".join(re.findall(r"(?<!not )__fish_seen_subcommand_from (\S+)", cond))
        offered = fish.setdefault(path, set())
        if kind:
            offered.add(("--" if kind == "l" else "-") + opt)
        elif words:
            offered.update(words.split())  # the subcommands
    assert fish == cli, "resctl.fish"
