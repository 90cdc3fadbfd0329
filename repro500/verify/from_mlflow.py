"""A run read back from an MLflow store alone: ``repro500 verify mlflow:RUN_ID`` (or ``runs:/RUN_ID``).

The runner logs the sealed run directory as one archive on the parent run
(``run/<run-id>.tar.gz``, :meth:`repro500.tracking.client.Tracker.log_sealed`); this finds the repro500
parent of the MLflow run named (a repeat's run or a wrapped script's leads up to it), downloads
that archive and hands it to ``verify`` as a packed run: its ``SHA256SUMS`` decides whether what the
store kept is what the run sealed.  The store is ``MLFLOW_TRACKING_URI`` (else ``mlflow.db`` here).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from repro500 import untrusted
from repro500.errors import InvalidInput
from repro500.tracking import store as mlflow_store
from repro500.tracking.client import SEALED_PATH
from repro500.tracking.names import PARENT_TAG, REPEAT_RUN_TAG, REPEAT_TAG, RUN_ID_TAG

PREFIXES = ("mlflow:", "runs:/")


def is_reference(text: str | Path | None) -> bool:
    return text is not None and str(text).startswith(PREFIXES)


def run_id_of(text: str) -> str:
    """The MLflow run id in ``mlflow:ID``, ``runs:/ID`` or ``runs:/ID/anything``."""
    for prefix in PREFIXES:
        if text.startswith(prefix):
            rest = text.removeprefix(prefix).strip("/")
            run_id = rest.split("/", 1)[0]
            if run_id and run_id.isalnum():
                return run_id
    raise InvalidInput(f"{text!r} names no MLflow run: write mlflow:RUN_ID or runs:/RUN_ID (the id the MLflow UI shows)")


def _client(uri: str) -> Any:
    db = mlflow_store.sqlite_path(uri)
    if db is not None and not db.is_file():  # opening a missing SQLite store would create an empty one
        raise InvalidInput(f"the MLflow tracking store {mlflow_store.safe_uri(uri)} does not exist here: "
                           "set MLFLOW_TRACKING_URI to the store the run was logged to")
    mlflow_store.check_readable(uri)
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def _get(client: Any, run_id: str, uri: str) -> Any:
    run = mlflow_store.read_run(client, run_id, uri)
    if run is None:
        raise InvalidInput(f"there is no MLflow run {run_id} in {mlflow_store.safe_uri(uri)}")
    return run


def parent_run(client: Any, run_id: str, uri: str) -> Any:
    """The repro500 parent run of *run_id*: itself, or the run it nests under (a repeat's, a script's)."""
    run = _get(client, run_id, uri)
    for _ in range(3):  # a script's run -> its repeat's run -> the parent
        tags = run.data.tags
        if RUN_ID_TAG not in tags and REPEAT_RUN_TAG not in tags:
            raise InvalidInput(f"MLflow run {run_id} is not a repro500 run (it has no {RUN_ID_TAG} tag): name the run "
                               "`repro500 run` logged, or one of its repeats")
        if REPEAT_TAG not in tags and REPEAT_RUN_TAG not in tags:
            return run
        up = tags.get(REPEAT_RUN_TAG) or tags.get(PARENT_TAG)
        if not up:
            break
        run = _get(client, up, uri)
    raise InvalidInput(f"MLflow run {run_id} is a repro500 repeat whose parent run is not in the store")


def download(reference: str, dest: Path) -> Path:
    """Download the sealed run behind *reference* into *dest*; returns the archive's path.
    (``--check-tracking`` then reads the same store: see :func:`repro500.verify.judge.judge`.)"""
    from repro500.tracking.names import RUN_ID_TAG, SEALED_TAG

    run_id = run_id_of(reference)
    uri = mlflow_store.tracking_uri()
    client = _client(uri)
    parent = parent_run(client, run_id, uri)
    parent_id, name = parent.info.run_id, parent.data.tags.get(RUN_ID_TAG, "")
    try:
        with mlflow_store.patient_http():  # the store has answered: a busy one is slow, not gone
            archives = [a for a in client.list_artifacts(parent_id, SEALED_PATH) if a.path.endswith(".tar.gz")]
            if not archives and parent.data.tags.get(SEALED_TAG):
                raise InvalidInput(f"MLflow run {parent_id} ({name}) holds no sealed run: {parent.data.tags[SEALED_TAG]}")
            if not archives:
                raise InvalidInput(
                    f"MLflow run {parent_id} ({name}) holds no sealed run ({SEALED_PATH}/<run-id>.tar.gz): it did not "
                    "finish, or an older repro500 logged it; verify its run directory or a packed copy instead")
            from mlflow.artifacts import download_artifacts

            size = _checked_size(archives[0], parent_id, name)
            mlflow_store.quiet()
            with _no_progress_bar():  # repro500 says what it fetches; MLflow's bar would interleave with it
                local = _bounded(lambda: download_artifacts(run_id=parent_id, artifact_path=archives[0].path,
                                                            dst_path=str(dest), tracking_uri=uri),
                                 Path(dest), size, f"the sealed run of MLflow run {parent_id}")
    except InvalidInput:
        raise
    except Exception as err:  # noqa: BLE001 - a store or artifact repository failing is one sentence
        raise InvalidInput(f"the sealed run of MLflow run {parent_id} could not be downloaded from "
                           f"{mlflow_store.safe_uri(uri)} ({mlflow_store.reason(err)})") from None
    return Path(local)


@contextlib.contextmanager
def opened(reference: str) -> Iterator[Path]:
    """The run directory of the sealed run behind *reference* (``mlflow:ID``, ``runs:/ID``): downloaded
    and unpacked (checked as any packed run is) into a temporary directory removed when the block
    ends. For the commands that read a run directory (``diff``, ``report``) as ``verify`` reads the store."""
    import tempfile

    from repro500.rundir import archive

    with tempfile.TemporaryDirectory(prefix="repro500-mlflow-") as tmp:
        packed = download(reference, Path(tmp) / "download")
        yield archive.unpack(packed, Path(tmp) / "run")


def _checked_size(artifact: Any, parent_id: str, name: str) -> int:
    """The size the store lists for the sealed run, refused before a byte is downloaded when it is
    unknown or over the unpack cap (a store holding a 30 GB archive would otherwise fill the disk)."""
    size, cap = getattr(artifact, "file_size", None), untrusted.unpack_cap()
    where = f"MLflow run {parent_id} ({name})'s {artifact.path}"
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InvalidInput(f"{where} has no size in the artifact store, so it cannot be bounded: refused before "
                           "downloading (download it yourself and verify the archive)")
    if size > cap:
        raise InvalidInput(f"{where} is {size:,} bytes, over the {cap:,}-byte cap on a packed run "
                           f"({untrusted.UNPACK_ENV} raises it): refused before downloading")
    return size


def _bounded(fetch: Callable[[], str], dest: Path, size: int, what: str) -> str:
    """``fetch()`` run while the bytes it writes under ``dest`` are watched: a store that sends
    more than the size it listed is refused as soon as that is seen (the download is left to
    a daemon thread that dies with the process), and what it wrote is checked once it is done."""
    import threading

    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["path"] = fetch()
        except BaseException as err:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = err

    worker = threading.Thread(target=run, name="repro500-mlflow-download", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.2)
        if _bytes_under(dest) > size:
            raise InvalidInput(f"{what} sends more than the {size:,} bytes the store lists for it: refused")
    if "error" in outcome:
        raise outcome["error"]
    local = str(outcome["path"])
    if _bytes_under(dest) > size or not untrusted.regular_file(local) or Path(local).stat().st_size != size:
        raise InvalidInput(f"{what} is not the {size:,}-byte regular file the store lists for it: refused")
    return local


def _bytes_under(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for file in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, file)).st_size
    return total


@contextlib.contextmanager
def _no_progress_bar() -> Iterator[None]:
    """MLflow's artifact progress bar off for this process's download (read when it starts)."""
    key = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    before = os.environ.get(key)
    os.environ[key] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
