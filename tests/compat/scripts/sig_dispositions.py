"""Contract: signal dispositions, the blocked mask and the wakeup fd are a fresh interpreter's."""
import os
import signal
import sys

RANK = int(os.environ["RANK"])


def name(handler):
    if handler in (signal.SIG_DFL, signal.SIG_IGN):
        return signal.Handlers(handler).name
    return "python" if callable(handler) else str(handler)


for sig in ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGPIPE", "SIGCHLD", "SIGQUIT", "SIGALRM"):
    sys.stdout.write(f"FACT rank={RANK} {sig}={name(signal.getsignal(getattr(signal, sig)))}\n")
sys.stdout.write(f"FACT rank={RANK} blocked={sorted(s.name for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))}\n")
fd = signal.set_wakeup_fd(-1)
sys.stdout.write(f"FACT rank={RANK} wakeup_fd_set={fd != -1}\n")
sys.stdout.write(f"FACT rank={RANK} alarm={signal.alarm(0)}\n")
