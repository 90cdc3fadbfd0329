"""The statuses repro500 writes into its records, and what a verdict's status exits with.

They are values of documented JSON fields (docs/contracts.md): a repeat's ``summary.json``, the
run's ``run.json`` and the verdict's ``verdict.json``.  Every layer reads or writes them, from the
trainer that ends a repeat to the report that colours a verdict, so they live here in the ground,
beside :mod:`repro500.errors` (whose exit codes the verdict statuses map to), and every other
module imports the constant.  Their own module rather than ``errors``: these are values of records,
not the exceptions a user's mistake raises.
"""

from __future__ import annotations

from repro500.errors import EXIT_FAIL, EXIT_INCONCLUSIVE, EXIT_INVALID, EXIT_OK

# ----- a repeat (repeats/<k>/summary.json "status") ------------------------------------------------
REPEAT_COMPLETED = "completed"
REPEAT_DIVERGED = "diverged"  # the loss went NaN or infinite: a result, not a crash
REPEAT_FAILED = "failed"
REPEAT_KILLED = "killed"  # Ctrl-C, SIGTERM or a timeout stopped it
REPEAT_STATUSES = (REPEAT_COMPLETED, REPEAT_FAILED, REPEAT_DIVERGED, REPEAT_KILLED)
# A finished repeat has a result (``--resume`` keeps it): completed, or diverged.
REPEAT_FINISHED = (REPEAT_COMPLETED, REPEAT_DIVERGED)

# ----- a run (run.json "status") -----------------------------------------------------------------
RUN_RUNNING = "running"
RUN_INTERRUPTED = "interrupted"  # stopped by Ctrl-C: what finished is kept, ``--resume`` continues
RUN_COMPLETED = "completed"
RUN_FAILED = "failed"
RUN_SUBMITTED = "submitted"  # --detach: its repeats are SLURM's tasks; ``--resume`` collects them and concludes
# A run in one of these did not finish: nothing sealed it, or a repeat failed.
RUN_UNFINISHED = (RUN_RUNNING, RUN_INTERRUPTED, RUN_FAILED, RUN_SUBMITTED)

# ----- a verdict (verdict.json "status"), and each of its checks' ----------------------------------
PASS = "PASS"  # the run met its acceptance bands
FAIL = "FAIL"
REPRODUCED = "REPRODUCED"  # equivalent to the reference within its margins
NOT_REPRODUCED = "NOT REPRODUCED"
INCONCLUSIVE = "INCONCLUSIVE"  # too few repeats, or the interval straddles the band
INVALID = "INVALID"  # missing, corrupt, tampered or unreadable input
SKIPPED = "SKIPPED"  # a check that could not run: neutral, it neither passes nor fails the verdict
VERDICT_STATUSES = (PASS, FAIL, REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, INVALID)
# A check that informs without deciding (sampling, MLPerf compliance, where two runs part): its words
OK = "OK"
WARN = "WARN"
FOUND = "FOUND"  # where the runs part: a first differing step was found
# The significance level a verdict's tests decide at unless --alpha says otherwise, and the level
# of repro500's other screens (a biased epoch, a timing's interval): one number for all of them.
DEFAULT_ALPHA = 0.05
# What ``repro500 verify`` exits with for each (docs/contracts.md, "Exit codes").
EXIT_CODES = {
    PASS: EXIT_OK, REPRODUCED: EXIT_OK, FAIL: EXIT_FAIL, NOT_REPRODUCED: EXIT_FAIL,
    INCONCLUSIVE: EXIT_INCONCLUSIVE, INVALID: EXIT_INVALID,
}
