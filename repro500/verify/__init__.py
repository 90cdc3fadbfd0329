"""Verification: decide with statistics whether a run holds or reproduces a reference.

One module per job (docs/verify.md):

* ``stats``        descriptive statistics, t and order-statistic intervals, TOST, repeats needed
* ``rundir``       read a run directory into memory
* ``integrity``    digests, manifest, aggregate recomputation, data re-hashing
* ``bands``        acceptance criteria on confidence bounds
* ``equivalence``  REPRODUCED / NOT REPRODUCED / INCONCLUSIVE against a reference
* ``published``    the published-results file format (``repro500/published/v1``)
* ``reference``    resolve ``--against`` (run directory, packed bundle, published file)
* ``timing``       time-to-train: olympic mean, "converged suspiciously fast"
* ``determinism``  same seed, same parameters; where two repeats diverge
* ``provenance``   the manifest diff shown with a verdict (uses ``diff``)
* ``flops``        Valid FLOPS with its inputs
* ``verdict``      joins the sections: ``verify_run``, ``write_verdict``, ``render``
* ``render``       the one-screen terminal summary

Nothing here imports the workloads: a verdict needs no training code.
"""
