"""``OUT/env`` built, step by step (see the package's docstring for the order), and recognised
when a finished rebuild of the same lock is there already.

Building the environment runs code the publication chose (a source distribution's build backend,
a wheel's ``.pth`` file at every start of the venv's Python): it is asked of
:func:`repro500.untrusted.consent` (``--run-code``) by :func:`check_mode`, before anything is
written, in the module that makes the venv.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from repro500 import untrusted
from repro500.errors import InvalidInput, UsageError
from repro500.publish.rebuild.fit import check_fit, target_tags
from repro500.publish.rebuild.install import (
    CACHE_DIR,
    install_own,
    install_pins,
    install_tool,
    tool_requirement,
    tool_wheel,
)
from repro500.publish.rebuild.installer import install_cmd, installer
from repro500.publish.rebuild.interpreter import find_python
from repro500.publish.rebuild.lock import Pins, minor_version
from repro500.publish.rebuild.serving import Serving, serving
from repro500.publish.rebuild.sizing import Download, download_size
from repro500.publish.rebuild.watch import Watch, seconds
from repro500.redact import redact_url
from repro500.rundir import names

ENV_DIR = "env"
MARKER = names.ENV_MARKER
MODES = ("current", "venv")
# what building a publication's environment runs of its choosing: the consent's sentence names it
BUILD_RUNS = ("chooses code that runs when --env venv builds its environment (a pinned source distribution's "
              "build backend, a wheel's .pth file at every start of the venv's Python)")
_INDEX_ARG = re.compile(r"^https?://[^\s/]+(?:/\S*)?$")


def build(pins: Pins, out: Path, *, with_tool: bool, find_links: list[Path], console: Any,
          indexes: list[str] | None = None, sandboxed: Callable[[str], list[str]] | None = None) -> Path:
    """``OUT/env`` holding the locked environment; its Python.  The caller has the reproducer's
    consent (:func:`check_mode`); *indexes*: those named with ``--index``; *sandboxed*: given the
    Python the venv is made from, the argv prefix that runs each install in the sandbox (the
    installs run the publication's build code), or None to run them as they are."""
    env = out / ENV_DIR
    env_python = env / "bin" / "python"
    marker = env / MARKER
    if marker.is_file() and untrusted.read_text(marker, "the environment's marker").strip() == f"{pins.digest} tool={with_tool}":
        console.print(f"environment: {env} already holds this publication's lock (rebuilt earlier); reusing it",
                      highlight=False, soft_wrap=True)
        return env_python
    python = find_python(pins.python)
    tags = target_tags(minor_version(pins.python))
    check_fit(pins, tags)
    tool = tool_requirement() if with_tool else ([], "")
    served = serving(pins, indexes)
    download = download_size(pins, tags, find_links, served) if pins.requirements else Download()
    # names and versions from the publication's lock: shown, never markup
    # repro500's own sentence (the paths and index in it are shown whole): the width of a sentence, not a field
    console.print(untrusted.shown(_plan(pins, env, python, served, download, tool[1]), untrusted.SENTENCE_CHARS),
                  highlight=False, soft_wrap=True)
    if env.exists():  # an unfinished or another lock's rebuild is never taken for this one
        shutil.rmtree(env)
    watch, started = Watch(), time.monotonic()  # the steps said on stderr as they happen: stdout stays the answer
    _create_venv(python, env, watch)
    prefix = sandboxed(python) if sandboxed is not None else []
    base = [*prefix, *install_cmd(env_python, find_links, indexes)]
    if pins.requirements:
        install_pins(base, pins, env, served, download, watch)
    install_own(base, pins, watch)
    if with_tool:
        # repro500 itself, and the build tools its install may fetch, from the reproducer's indexes only
        if sandboxed is not None:
            tool = tool_wheel(tool, out / CACHE_DIR / "tool", watch)
        install_tool([*prefix, *install_cmd(env_python, find_links)], tool, env, watch)
    marker.write_text(f"{pins.digest} tool={with_tool}\n", encoding="utf-8")  # last: the rebuild is complete
    watch.say(f"{env} rebuilt in {seconds(time.monotonic() - started)}")
    return env_python


def _create_venv(python: str, env: Path, watch: Watch) -> None:
    """A bare venv (no pip: the installer runs from outside it) of *python* at *env*."""
    created = watch.run([python, "-m", "venv", "--without-pip", str(env)], doing=f"creating the venv with {python}",
                        done="created the venv", waiting="creating the venv")
    if created.returncode != 0:
        raise InvalidInput(f"cannot create a venv with {python}: {created.stderr.strip()[-300:]}")


def _plan(pins: Pins, env: Path, python: str, served: Serving, download: Download, tool_label: str) -> str:
    """The plan line: the installer, the Python, how many distributions from which indexes, how much
    they download, and what is built from source here (its build code runs)."""
    left = f"; not installable, left out: {'; '.join(pins.unpinnable)}" if pins.unpinnable else ""
    own = f" + the experiment's own {', '.join(n for n, _ in pins.own)} from source/" if pins.own else ""
    sized = download.text() if pins.requirements else ""
    if pins.requirements:
        sized += ("; every file checked against the hashes recorded at publication" if pins.hashed_requirements()
                  else "; files not checked against recorded hashes (the publication has none for every pin)")
    # what the installer builds from source here runs its build code: named, as --run-code consented to it
    built = [*(f"{n} (sdist)" for n in download.sdists), *pins.from_source,
             *(f"{n} (the experiment's own)" for n, _ in pins.own)]
    from_source = f"; built from source here, running their build code: {', '.join(built)}" if built else ""
    return (f"environment: rebuilding in {env} with {installer()}: Python {minor_version(pins.python)} "
            f"({python}), {len(pins.requirements)} pinned distributions {served.text()}{sized}{own}"
            f"{' + ' + tool_label if tool_label else ''}{served.not_asked()}{left}{from_source}")


def check_mode(mode: str, find_links: list[str], *, run_code: bool, indexes: list[str] | None = None) -> list[Path]:
    """The ``--find-links`` folders, once the options of the environment are checked and, for
    ``--env venv``, the reproducer consented to the code its build runs; UsageError before
    anything is written otherwise."""
    if mode not in MODES:
        raise UsageError(f"--env {mode}: choose one of {', '.join(MODES)}")
    if find_links and mode != "venv":
        raise UsageError("--find-links serves a rebuilt environment: it goes with --env venv")
    if indexes and mode != "venv":
        raise UsageError("--index serves a rebuilt environment: it goes with --env venv")
    for url in indexes or []:
        if not _INDEX_ARG.match(url):
            raise UsageError(f"--index {untrusted.shown(redact_url(url))[:120]!r} is not an http(s) URL of a package index")
    if mode == "venv":
        installer()  # a bad or unmet REPRO500_INSTALLER stops the reproduction before anything is done
    folders = [Path(f) for f in find_links]
    for folder in folders:
        if not folder.is_dir():
            raise UsageError(f"--find-links {folder} is not a directory")
    if mode == "venv":
        untrusted.consent(run_code, BUILD_RUNS, review="its lock (environment.lock.json in the packed run)",
                          instead="reproduce with --env current")
    return [f.resolve() for f in folders]
