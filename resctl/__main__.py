"""`python -m resctl` and the `resctl` command. `resctl run` starts the launcher's interpreter first, to import torch
while the CLI imports itself and makes the plan (resctl.launch.prestart), and leaves without tearing its modules down
(`lifeline.exit_quickly`): a short job's end waits for neither."""

import sys


def entry() -> None:
    from resctl.launch import lifeline, prestart

    prestart.begin(sys.argv[1:])
    from resctl.cli import main

    if not prestart.wanted(sys.argv[1:], {}):
        main()
        return
    try:
        main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if isinstance(exit_.code, str):
            print(exit_.code, file=sys.stderr)
    lifeline.exit_quickly(code)


if __name__ == "__main__":
    entry()
