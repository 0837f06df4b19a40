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
    from resctl.shim.ending import exit_status

    try:
        main()
        code = 0
    except SystemExit as exit_:
        code = exit_status(exit_.code)
    lifeline.exit_quickly(code)


if __name__ == "__main__":
    entry()
