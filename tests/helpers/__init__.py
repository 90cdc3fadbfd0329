"""Helpers the tests share (imported as ``helpers.<module>``; tests/ is on the test session's path).

* ``runs``        tiny recipes and the real ``repro500`` command in a subprocess
* ``rundirs``     run directories fabricated exactly by the contract (docs/contracts.md)
* ``teamserver``  a real PostgreSQL and ``mlflow server`` for the team tests
* ``keys``        OpenSSH signing keys and allowed_signers files for the trust tests
"""
