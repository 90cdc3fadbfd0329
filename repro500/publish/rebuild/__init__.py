"""``reproduce --env venv``: the publication's locked environment, rebuilt in ``OUT/env``.

One module a step, in the order a rebuild takes them:

* lock.py: the publication's lock, read and checked (untrusted input: nothing in it is executed
  or handed to a shell; every requirement is rebuilt from checked parts);
* interpreter.py: the recorded Python ``major.minor`` found here, else exit 4 naming both;
* fit.py: every pin whose recorded wheels cannot install here, named up front (exit 4);
* installer.py: uv or pip (``REPRO500_INSTALLER``), and its command line;
* serving.py: which index serves what (the reproducer's own; the lock's only with ``--index``);
* sizing.py: how much the installer will download, for the plan line;
* install.py: the pins checked with ``--dry-run`` then installed, the
  experiment's own package from ``OUT/source``, and repro500 itself for a built-in recipe;
* build.py: ``--env``, ``--find-links`` and ``--index`` checked, and the reproducer's consent
  (``--run-code``) to the code the build runs, before anything is written; then the steps above
  in order: the plan line, the venv made, the installs, and ``OUT/env/.repro500-built`` written last
  (holding the lock's digest): a rebuild interrupted before it is found unfinished next time and
  redone from scratch; a finished one for the same lock is reused as it is;
* watch.py: what the steps are doing, said on stderr as it happens (the installer's own lines
  relayed short), so that minutes of installing are not minutes of silence;
* activate.py: the environment the rerun runs in, the venv activated.

What the rest of repro500 uses is here, under the names it has always had.
"""

from __future__ import annotations

from repro500.publish.rebuild.activate import activated
from repro500.publish.rebuild.build import BUILD_RUNS, ENV_DIR, MARKER, MODES, build, check_mode
from repro500.publish.rebuild.fit import check_fit, target_tags
from repro500.publish.rebuild.installer import (
    INSTALLER_ENV,
    INSTALLERS,
    install_cmd,
    installer,
    uv_binary,
)
from repro500.publish.rebuild.interpreter import find_python
from repro500.publish.rebuild.lock import HASHES_SCHEMA, Pins, read, read_hashes
from repro500.publish.rebuild.serving import Serving, configured_indexes, serving
from repro500.publish.rebuild.sizing import Download, download_size

__all__ = [
    "BUILD_RUNS", "ENV_DIR", "HASHES_SCHEMA", "INSTALLERS", "INSTALLER_ENV", "MARKER", "MODES", "Download", "Pins",
    "Serving", "activated", "build", "check_fit", "check_mode", "configured_indexes", "download_size",
    "find_python", "install_cmd", "installer", "read", "read_hashes", "serving", "target_tags", "uv_binary",
]
