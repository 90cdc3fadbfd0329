"""MLPerf, in one place (docs/mlperf.md): what repro500 logs in MLPerf's format and how MLPerf's
own tools judge it.

* ``logger``      ``mllog.txt`` through mlperf-logging, and the one rule for a run's division
* ``hparams``     the optimizer and schedule records MLPerf's rules ask for
* ``check``       MLPerf's compliance checker on one log, under the benchmark's ruleset
* ``compliance``  the verdict's MLPerf section: every finished repeat's log judged
* ``export``      ``repro500 export mlperf``: a submission tree
* ``checkers``    package_checker, result_summarizer and rcp_checker on that tree
"""
