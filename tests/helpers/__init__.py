"""Helpers the tests share (imported as ``helpers.<module>``; tests/ is on the test session's path).

* ``runs``        tiny recipes, the real ``repro500`` command in a subprocess (``repro500``,
                  with ``tool_env`` for dvc and mlflow beside it) or in process (``invoke``)
* ``fixtures``    fixtures several modules share: ``native`` (the C++ operators), ``own_cache``
* ``rundirs``     run directories fabricated exactly by the contract (docs/contracts.md)
* ``teamserver``  a real PostgreSQL and ``mlflow server`` for the team tests
* ``keys``        OpenSSH signing keys and allowed_signers files for the trust tests
"""
