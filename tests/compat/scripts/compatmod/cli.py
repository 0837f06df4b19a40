"""Contract: `-m compatmod.cli` runs the module as __main__ with sys.path[0] = the working directory."""
import os
import sys

RANK = int(os.environ["RANK"])


def fact(key, value):
    sys.stdout.write(f"FACT rank={RANK} {key}={value}\n")


fact("__name__", __name__)
fact("__spec__.name", __spec__.name if __spec__ else None)
fact("__package__", __package__)
fact("argv0", sys.argv[0])
fact("args", sys.argv[1:])
fact("sys.path0", sys.path[0])
fact("sys.modules[__main__].is_this", sys.modules["__main__"].__dict__ is globals())
