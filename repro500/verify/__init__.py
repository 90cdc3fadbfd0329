"""Verification: decide with statistics whether a run holds or reproduces a reference.

One module per job (docs/verify.md):

* ``stats``           descriptive statistics, t and order-statistic intervals, TOST, repeats a question needs
* ``quantiles``       distribution-free intervals for any quantile
* ``rundir``          read a run directory into memory
* ``integrity``       digests, manifest, chain, attestation, aggregates, data re-hashing; the gate
                      every command that vouches for a run calls (``require_intact``)
* ``vouching``        signing a run and exporting it for MLPerf, each behind that gate
* ``bands``           acceptance criteria on confidence bounds
* ``equivalence``     REPRODUCED / NOT REPRODUCED / INCONCLUSIVE against a reference
* ``published``       the published-results file format (``repro500/published/v1``)
* ``reference``       resolve ``--against`` (run, packed run, published file) and "same benchmark"
* ``history``         references from history: earlier runs of the same benchmark on this system
* ``trend``           ``repro500 history``: one metric across a history, and what changed
* ``from_mlflow``     a run read back from an MLflow store alone (``mlflow:RUN_ID``)
* ``timing``          time-to-train: olympic mean, "converged suspiciously fast"
* ``determinism``     same seed, same parameters; where two repeats diverge
* ``divergence``      where two runs part: the first step from the per-step records, its likely cause
* ``sampling``        sampling bias: incomplete or biased epochs
* ``variance``        where the variance of a factorial run (``--vary``) comes from
* ``gains``           what a variant gains against its reference (throughput, Valid FLOPS)
* ``planning``        ``repro500 plan``: how many repeats a decision needs
* ``sequential``      stop repeating once decided (group-sequential levels)
* ``sequential_plan`` the ``--max-repeats`` a sequential run needs, by simulation
* ``diff``            compare two manifests, ranked by likely effect
* ``provenance``      the manifest diff shown with a verdict (uses ``diff``)
* ``flops``           Valid FLOPS with its inputs
* ``verdict``         joins the sections: ``verify_run``, ``write_verdict``
* ``render``          the one-screen terminal summary

Nothing here imports the training code: a verdict needs no trainer.  MLPerf's compliance section
is :mod:`repro500.mlperf.compliance`'s (MLPerf's rules live together in :mod:`repro500.mlperf`).
"""

from repro500.errors import UsageError


def check_comparison_options(margins: object, against: object, across_benchmarks: bool = False) -> None:
    """The one rule for options that compare with a reference (verify, report, run): they need one.

    Here, not in the verdict's module, so that a run checks its options before it pays for scipy."""
    if margins and not against:
        name = next(iter(margins)) if isinstance(margins, dict) else "METRIC"
        raise UsageError(f"--margin needs --against: --margin {name}=... is an equivalence margin against a "
                         "reference; give --against REF as well, or drop --margin")
    if across_benchmarks and not against:
        raise UsageError("--across-benchmarks needs --against: it lets a run be compared with a reference of "
                         "another benchmark")
