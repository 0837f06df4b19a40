"""`python -m resctl.shim [--resctl-module] SCRIPT ARGS...`: how every worker starts under resctl run."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from resctl.shim.runtime import main

    sys.exit(main(sys.argv[1:]))
