"""Contract: the script is __main__ as under `python script.py`: name, spec, file, path[0], cwd."""
import os
import sys

RANK = int(os.environ["RANK"])
main = sys.modules["__main__"]


def fact(key, value):
    sys.stdout.write(f"FACT rank={RANK} {key}={value}\n")


fact("__name__", __name__)
fact("__spec__", __spec__)
fact("__file__", __file__)
fact("__package__", __package__)
fact("__loader__", type(__loader__).__name__)
fact("sys.modules[__main__].is_this", main.__dict__ is globals())
fact("sys.path0", sys.path[0])
fact("sys.path0.is_script_dir", sys.path[0] == os.path.dirname(os.path.abspath(__file__)))
fact("cwd", os.getcwd())
fact("__builtins__", type(__builtins__).__name__)
fact("__cached__", globals().get("__cached__"))
