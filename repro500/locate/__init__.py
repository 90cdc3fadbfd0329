"""``repro500 locate``: the first step and the first operator where two runs part, and why
(docs/verify.md, "The first operator").

* ``plan``         the runs it opens, the pair of repeats and the step the replays stop at
* ``environment``  what each replay runs in (recorded kernel settings, a rebuilt interpreter)
* ``pipeline``     :func:`locate`: open, plan, ask consent, replay, explain; a :class:`Located`
* ``render``       the answer as the terminal shows it

A driver of its own: it asks verify where the records part (:mod:`repro500.verify.divergence`)
and has the workloads replay the steps (:mod:`repro500.workloads.trainer.replay`); verify imports
no other driver, so the two meet here.
"""

from __future__ import annotations

from repro500.locate.pipeline import Located, locate

__all__ = ["Located", "locate"]
