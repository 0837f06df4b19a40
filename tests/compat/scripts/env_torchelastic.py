"""Contract: MASTER_* and TORCHELASTIC_* as torchrun sets them (ports and ids by shape)."""
import os
import sys

RANK = int(os.environ["RANK"])
env = os.environ


def fact(key, value):
    sys.stdout.write(f"FACT rank={RANK} {key}={value}\n")


fact("MASTER_ADDR", env.get("MASTER_ADDR"))
fact("MASTER_PORT.isdigit", env.get("MASTER_PORT", "").isdigit())
fact("~MASTER_PORT", env.get("MASTER_PORT"))
for name in ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
             "TORCHELASTIC_RUN_ID"):
    fact(name, env.get(name))
error_file = env.get("TORCHELASTIC_ERROR_FILE")
fact("TORCHELASTIC_ERROR_FILE.set", error_file is not None)
fact("TORCHELASTIC_ERROR_FILE.name", error_file and os.path.basename(error_file))
fact("TORCHELASTIC_ERROR_FILE.dir_exists", error_file is not None and os.path.isdir(os.path.dirname(error_file)))
fact("TORCHELASTIC_ERROR_FILE.exists", error_file is not None and os.path.exists(error_file))
