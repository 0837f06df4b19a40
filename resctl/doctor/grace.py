"""grace probe: the stop sequence nests, so a SIGTERM ends with a complete final checkpoint.

``checkpoint.sigterm_grace < launch.term_timeout < the scheduler's grace`` (see
`resctl.profile.grace`); the scheduler's grace is read from ``TERMINATION_GRACE_PERIOD_SECONDS``
when the deployment sets it (the Kubernetes kit does).

Verdicts:
  order  FAIL a pair does not nest (or TERMINATION_GRACE_PERIOD_SECONDS is not a number); PASS
         with what was compared, saying so when the scheduler's grace was not given.
"""

from __future__ import annotations

from resctl.doctor.context import Context
from resctl.doctor.result import Check, Status
from resctl.profile import grace


def run(ctx: Context) -> list[Check]:
    seconds, bad_env = grace.scheduler_grace(ctx.env)
    found = bad_env + grace.problems(ctx.profile, "profile", seconds)
    if found:
        return [Check("order", Status.FAIL, p.message, p.value if isinstance(p.value, str) else None, None, "", p.fix)
                for p in found]
    ckpt, term = ctx.profile.checkpoint, ctx.profile.launch.term_timeout
    chain = (f"final save {ckpt.sigterm_grace:g}s < " if ckpt.save_on_sigterm else "") + f"launcher {term:g}s"
    if seconds is None:
        return [Check("order", Status.PASS, f"{chain}; scheduler grace unknown (set {grace.GRACE_ENV} to check it)",
                      None, None)]
    return [Check("order", Status.PASS, f"{chain} < scheduler {seconds:g}s", f"{seconds:g}s", f"> {term:g}s")]
