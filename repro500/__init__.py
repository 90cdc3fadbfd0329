"""repro500: deep-learning benchmark results you can check.

Every run records what exactly ran (code, environment, seeds, data, hardware), runs a
workload several times, and a verifier decides with statistics whether the result holds.
The command line (``repro500``) is a thin layer over the modules of this package.
"""

__version__ = "0.1.0"
