"""Any program as a workload (docs/command.md): run once per repeat, its metrics read from what it writes.

* ``workload``        the command workload behind the :class:`~repro500.workloads.workload.Workload` interface
* ``recipe``          its recipe keys (``fixed.command``, ``metrics:``) as a :class:`CommandSpec`
* ``adhoc``           ``repro500 run --command -- ...``: the recipe a command line declares
* ``repeat``          one repeat: start, watch, stop, read its metrics
* ``process``         one child process group, its streams teed, stopped as a group
* ``metric_sources``  where a metric is read from (MLflow, MLPerf log, JSON, a regex on a stream)
* ``observe``         which files the command opened (the audit hook in ``childsite/``, or strace)
* ``provider_check``  whether MLflow in the command's Python loads repro500's run-context provider
* ``launchenv``       the environment the run was started with: what the command gets
"""
