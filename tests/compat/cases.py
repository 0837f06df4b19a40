"""The compatibility cases: one unmodified script each (tests/compat/scripts/), how it is launched, and
what torchrun does with it (the suite's check that each script tests what it says).

`{tmp}` in arguments is a fresh directory per launch, `{port}` a free port (the same one in the
launcher's and the script's arguments). A `signal` is sent once every rank printed `READY rank=<r>
pid=<pid>`: to "rank0"/"rank1"/"workers" (those pids), "launcher" (the process the user started) or
"group" (its whole process group, as Ctrl-C in a terminal does).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    name: str
    code: int  # torchrun's exit code for it
    script: str = ""  # default: <name>.py
    args: tuple[str, ...] = ()
    launcher_args: tuple[str, ...] = ()
    module: bool = False
    no_python: bool = False
    max_restarts: int = 0
    stdin: bytes | None = None  # None: /dev/null
    signal: tuple[str, str] | None = None  # (target, signal name)
    summary: str = ""  # text torchrun's failure summary shows: the others' must show it too
    timeout: float = 120.0  # whole launch
    idle: float = 30.0  # no output for this long: a hang
    facts: int = 1  # FACT lines torchrun's run must print at least (0: the case checks lines only)
    # It prints what the launching shell's environment holds, not only what the launcher adds (CI's passes differ:
    # pass 2 sets PYTHONPATH for NVRx 0.7.0): torchrun's run is made in each pass, never reused
    # (`--compat-torchrun`, tests/compat/reference.py).
    shell_env: bool = False

    def __post_init__(self) -> None:
        if not self.script:
            object.__setattr__(self, "script", f"{self.name}.py")


TMP = ("{tmp}",)
FRAMEWORKS = ("fw_lightning", "fw_fabric", "fw_accelerate", "fw_hf_trainer")
FRAMEWORK_KILL_AT = 15  # after the checkpoint at step 10: a resume loses 5 steps
TORCH_IDLE = 60.0  # a worker importing torch on a loaded 2-core box can be silent that long
_CASES = [
    # every way a worker can end
    Case("end_return", 0),
    Case("end_sys_exit", 0),
    Case("end_sys_exit_none", 0),
    Case("end_sys_exit_zero", 0),
    Case("end_sys_exit_three", 1, args=TMP),
    Case("end_sys_exit_message", 1, args=TMP, facts=0),
    Case("end_raise_systemexit", 0),
    Case("end_os_exit_zero", 0),
    Case("end_os_exit_seven", 1, args=TMP),
    Case("end_exception", 1, args=TMP),
    Case("end_keyboardinterrupt", 1, args=TMP),
    Case("end_sigkill_self", 1, args=TMP),
    Case("end_sigsegv_self", 1, args=TMP),
    Case("end_one_rank_fails", 1, args=TMP, facts=0),
    # output
    Case("out_unflushed_exit", 0, facts=0),
    Case("out_interleave", 0, facts=0),
    Case("out_lost_on_os_exit", 0, facts=0),
    Case("out_stream_props", 0),
    Case("out_many_lines", 0, facts=0),
    # logging, warnings, hooks
    Case("log_basic_info", 0),
    Case("log_last_resort", 0, facts=0),
    Case("warn_show", 0),
    Case("excepthook", 1, args=TMP, facts=0),
    Case("atexit_return", 0, facts=0),
    Case("atexit_exception", 1, args=TMP, facts=0),
    Case("faulthandler_segv", 1, args=TMP),
    # environment
    Case("env_ranks", 0),
    Case("env_torchelastic", 0),
    Case("env_names", 0, shell_env=True),
    Case("env_master_flags", 0, args=("{port}",), launcher_args=("--master-addr", "127.0.0.1", "--master-port", "{port}")),
    Case("init_method_tcp", 0, args=("--init-method=tcp://localhost:{port}",),
         launcher_args=("--master-port", "{port}"), idle=TORCH_IDLE),
    # the program: argv, __main__, -m, --no-python, the interpreter, stdin
    # --workers/--ft-param: prefixes of options only ft_launcher has (an abbreviation was an error)
    Case("argv", 0, args=("--lr", "3e-4", "data dir", "--flag=x", "--workers", "0", "--ft-param", "1")),
    Case("main_identity", 0),
    Case("module_run", 0, script="compatmod.cli", module=True, args=("--flag", "value")),
    Case("no_python", 0, script="no_python.sh", no_python=True, args=("one", "two")),
    Case("interpreter_state", 0),
    Case("stdin_read", 0, stdin=b"hello from stdin\n"),
    Case("proc_identity", 0),
    # threads
    Case("thread_nondaemon", 0, facts=0),
    Case("threads_at_start", 0),
    # signals to the worker, to the launcher, Ctrl-C; dispositions
    Case("sig_term_handler", 0, signal=("workers", "SIGTERM")),
    Case("sig_usr1_handler", 0, signal=("workers", "SIGUSR1")),
    Case("sig_int_worker", 0, signal=("workers", "SIGINT")),
    Case("sig_term_default", 1, signal=("rank1", "SIGTERM"), facts=0),
    Case("sig_term_launcher", 1, signal=("launcher", "SIGTERM")),
    Case("sig_int_launcher", 1, signal=("launcher", "SIGINT")),
    Case("sig_ctrl_c", 1, signal=("group", "SIGINT")),
    Case("sig_dispositions", 0),
    # child processes
    Case("mp_fork_pool", 0),
    Case("mp_fork_pool_many", 0),
    Case("mp_spawn_pool", 0),
    Case("mp_forkserver_pool", 0),
    Case("mp_state", 0),
    Case("dataloader_fork", 0, idle=TORCH_IDLE),
    Case("dataloader_spawn", 0, idle=TORCH_IDLE),
    Case("torch_mp_spawn", 0, idle=TORCH_IDLE),
    # randomness
    Case("rng_unseeded", 0),
    Case("rng_torch", 0, idle=TORCH_IDLE),
    Case("rng_restart", 0, args=TMP, max_restarts=1, idle=45),
    # torch
    Case("torch_compile", 0, timeout=180, idle=90),
    Case("pg_env", 0, idle=TORCH_IDLE),
    Case("pg_env_no_destroy", 0, idle=TORCH_IDLE),
    Case("pg_tcp", 0, idle=TORCH_IDLE),
    Case("pg_file", 0, args=TMP, idle=TORCH_IDLE),
    # failures and restarts
    Case("record_error", 1, args=TMP, summary="RECORDED rank=1 failure", facts=0, idle=TORCH_IDLE),
    Case("restart_once", 0, args=TMP, max_restarts=1, idle=45),
    Case("restart_exhausted", 1, args=TMP, max_restarts=1, idle=45),
    # the frameworks users train with: each one's own checkpoints (every 10 of 30 steps), tiny models, gloo
    # (test_compat.py also SIGKILLs rank 1 of each at step FRAMEWORK_KILL_AT under resctl, and checks the resume)
    *(Case(name, 0, args=TMP, timeout=240, idle=90) for name in FRAMEWORKS),
]
CASES: dict[str, Case] = {c.name: c for c in _CASES}

