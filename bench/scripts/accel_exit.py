"""Ends as pytorch/examples' FSDP2 and minGPT scripts end on a machine with fewer GPUs than they
want: `sys.exit(main())` where main() returns None (issue 20's hang; issue 26 checks it on a GPU)."""
import sys

import torch


def main():
    count = torch.accelerator.device_count() if torch.accelerator.is_available() else 0
    if count < 8:
        print(f"needs 8 accelerators, found {count}: nothing to do", flush=True)
        return None
    return None


sys.exit(main())
