"""Contract: the interpreter is a fresh `python -u`: flags, executable, nothing but the stdlib imported."""
import os
import sys

RANK = int(os.environ["RANK"])
preloaded = sorted(m for m in ("torch", "numpy", "resctl", "nvidia_resiliency_ext", "psutil", "typer", "rich")
                   if m in sys.modules)


def fact(key, value):
    sys.stdout.write(f"FACT rank={RANK} {key}={value}\n")


fact("preloaded", preloaded)
fact("executable", sys.executable)
for flag in ("optimize", "dont_write_bytecode", "no_user_site", "no_site", "ignore_environment", "isolated",
             "dev_mode", "safe_path", "int_max_str_digits", "hash_randomization", "warn_default_encoding"):
    fact(f"flags.{flag}", getattr(sys.flags, flag, None))
fact("recursionlimit", sys.getrecursionlimit())
fact("switchinterval", sys.getswitchinterval())
fact("gc.enabled", __import__("gc").isenabled())
fact("gc.threshold", __import__("gc").get_threshold())
