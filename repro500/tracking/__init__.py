"""MLflow: everything repro500 logs there and reads back (docs/team.md, docs/contracts.md).

* ``client``   the :class:`Tracker`: one parent run per ``repro500 run``, one nested run per repeat
* ``process``  the logging process: the Tracker behind a socket, MLflow's cost off the run's path
* ``context``  the run-context provider MLflow loads in a wrapped script (its runs land under the repeat)
* ``store``    the tracking URI, the store's checks and its lock, artifacts' default place
* ``names``    experiment names, and the ``repro500.*`` tags and their meaning
* ``ui``       ``repro500 ui``: MLflow's own UI on the store

Submodules are imported where used: ``import repro500.tracking`` imports no MLflow.
"""
