"""One reader: every byte from a run directory, a packed run or a publication goes through
repro500/untrusted.py (regular files only, size caps, bounded JSON nesting and YAML aliases).

The structural test walks the syntax tree of the modules that read such input and fails on any
direct open or parse of a file there; the allow-list names the few that read something else, each
with its reason.  The attack tests build the files as an attacker would: a FIFO, a link to
/dev/zero, a document nested 200,000 deep, a sparse file of gigabytes.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.rundirs import make_run
from helpers.runs import repro500
from helpers.stores import mlflow_store

from repro500 import untrusted
from repro500.errors import InvalidInput

PACKAGE = Path(untrusted.__file__).parent
# The packages and modules that read someone else's run directory, packed run or publication
# (verify, report, publish, reproduce, sign and check, unpack, export, locate): they read it through
# repro500.untrusted, or not at all.
READERS = ("attest", "publish", "report", "rundir", "verify", "locate", "system/render.py", "mlperf/export.py")
# (module, call) -> why it may read without repro500.untrusted: none of these is a file of a run
# or a publication.
ALLOWED = {
    ("attest/keys.py", "read_bytes"): "the signer's own private key (repro500 sign --key), never a run's file",
    ("attest/keys.py", "read_text"): "the verifier's own allowed-signers file (--trust), never a run's file",
}
for _call in ("read_text", "json.loads"):
    ALLOWED["publish/rebuild/install.py", _call] = ("importlib.metadata's direct_url.json of the installed repro500: the "
                                             "reproducer's own software, not a file of the publication")
_PARSERS = {"json": {"load", "loads"}, "yaml": {"load", "safe_load", "full_load", "unsafe_load", "load_all",
                                                  "safe_load_all", "full_load_all", "unsafe_load_all", "compose",
                                                  "compose_all", "parse", "scan"},
            "pickle": {"load", "loads"}, "marshal": {"load", "loads"}, "tomllib": {"load", "loads"}}
_FORMAT_OPENERS = {"tarfile", "gzip", "bz2", "lzma", "zipfile", "h5py"}  # read a file object, or open a path


def _reads_mode(node: ast.Call, position: int) -> bool:
    """Whether an open call's mode (the argument at ``position``, or ``mode=``) may read."""
    mode = node.args[position] if len(node.args) > position else next(
        (k.value for k in node.keywords if k.arg == "mode"), None)
    if mode is None:
        return True
    if not isinstance(mode, ast.Constant) or not isinstance(mode.value, str):
        return True  # a mode chosen at run time may read
    return not any(c in mode.value for c in "wax") or "+" in mode.value


def direct_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, call) of every open or parse of a file that bypasses repro500.untrusted."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in _PARSERS:
            found += [(node.lineno, f"from {node.module} import {a.name}") for a in node.names
                      if a.name in _PARSERS[node.module]]
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "open" and _reads_mode(node, 1):
            found.append((node.lineno, "open"))
        if not isinstance(func, ast.Attribute):
            continue
        owner = func.value.id if isinstance(func.value, ast.Name) else None
        if owner == "untrusted":
            continue
        if func.attr in ("read_text", "read_bytes"):
            found.append((node.lineno, func.attr))
        elif owner in _PARSERS and func.attr in _PARSERS[owner]:
            found.append((node.lineno, f"{owner}.{func.attr}"))
        elif func.attr == "open" and owner in ("os", "io"):
            found.append((node.lineno, f"{owner}.open"))
        elif func.attr == "open" and owner in _FORMAT_OPENERS:
            # tarfile.open(fileobj=...) reads what untrusted.open_regular opened; a path is opened directly
            if node.args or any(k.arg in ("name", "filename", "file") for k in node.keywords):
                found.append((node.lineno, f"{owner}.open"))
        elif func.attr == "open":  # Path.open(); an opener's open(request) takes no mode first
            first = node.args[0] if node.args else None
            if (first is None or (isinstance(first, ast.Constant) and isinstance(first.value, str))) \
                    and _reads_mode(node, 0):
                found.append((node.lineno, "open"))
    return sorted(found)


def _reader_modules() -> list[Path]:
    out = []
    for name in READERS:
        path = PACKAGE / name
        out += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return out


def test_the_readers_of_runs_and_publications_open_and_parse_files_only_through_untrusted() -> None:
    seen: set[tuple[str, str]] = set()
    offending = []
    for module in _reader_modules():
        rel = module.relative_to(PACKAGE).as_posix()
        for line, call in direct_reads(ast.parse(module.read_text(encoding="utf-8"))):
            if (rel, call) in ALLOWED:
                seen.add((rel, call))
            else:
                offending.append(f"repro500/{rel}:{line}: {call}")
    assert not offending, ("read through repro500.untrusted (read_json, read_yaml, read_text, read_bytes, "
                           "open_regular, log_lines, json_record), or add (module, call) and a reason to ALLOWED:\n"
                           + "\n".join(offending))
    assert not set(ALLOWED) - seen, f"allow-list entries no longer needed: {sorted(set(ALLOWED) - seen)}"


def test_the_scan_sees_each_way_of_reading_a_file() -> None:
    source = """
import json, yaml
from json import loads
open(p)
open(p, "rb")
open(p, "w")
open(p, mode)
p.read_text()
p.read_bytes()
p.open()
p.open("a")
json.loads(s)
yaml.safe_load(s)
os.open(p, flags)
tarfile.open(p)
tarfile.open(fileobj=f)
opener.open(request, timeout=1)
untrusted.read_text(p, "x")
"""
    calls = [call for _, call in direct_reads(ast.parse(source))]
    assert calls == ["from json import loads", "open", "open", "open", "read_text", "read_bytes", "open",
                     "json.loads", "yaml.safe_load", "os.open", "tarfile.open"]


def test_caps_have_one_owner() -> None:
    """A cap on what someone else's file may make repro500 spend (bytes, characters, links
    followed, entries) is defined in untrusted.py only; other modules import it."""
    units = ("BYTES", "CHARS", "HOPS", "TAGS", "MEMBERS", "ENTRIES", "FILES", "DEPTH", "NODES", "RATIO")
    defined = []
    for module in sorted(PACKAGE.rglob("*.py")):
        if module.name == "untrusted.py":
            continue
        for node in ast.parse(module.read_text(encoding="utf-8")).body:
            if not isinstance(node, (ast.Assign, ast.AnnAssign)):
                continue
            value = node.value
            if isinstance(value, ast.Tuple):
                values = value.elts
            else:
                values = [value]
            if all(isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id == "untrusted"
                   for v in values if v is not None):
                continue  # a name for untrusted's own cap
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            names += [e.id for t in targets if isinstance(t, ast.Tuple) for e in t.elts if isinstance(e, ast.Name)]
            defined += [f"{module.relative_to(PACKAGE)}: {n}" for n in names
                        if n.lstrip("_").startswith("MAX_") and n.endswith(units)]
    assert not defined, defined


# ----- the attacks, as they were built ---------------------------------------------------------------
def _cli(*args: str, cwd: Path, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    done = repro500(*args, cwd=cwd, timeout=timeout, env=env)
    text = done.stdout + done.stderr
    assert "Traceback" not in text and "MemoryError" not in text and "RecursionError" not in text, text[-3000:]
    assert time.monotonic() - started < timeout
    return done


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    return make_run(tmp_path, "run")


def test_report_of_a_run_whose_run_json_is_a_fifo_ends_at_once(run: Path, tmp_path: Path) -> None:
    (run / "run.json").unlink()
    os.mkfifo(run / "run.json")
    done = _cli("report", str(run), cwd=tmp_path)
    assert done.returncode == 4, done.stderr


def test_report_of_a_run_whose_run_json_links_to_dev_zero_reads_nothing(run: Path, tmp_path: Path) -> None:
    (run / "run.json").unlink()
    (run / "run.json").symlink_to("/dev/zero")
    done = _cli("report", str(run), cwd=tmp_path)
    assert done.returncode == 4, done.stderr


def test_an_oversize_stored_verdict_is_refused_not_read(run: Path, tmp_path: Path) -> None:
    with open(run / "verdict.json", "wb") as sparse:  # verdict.json is not sealed: anyone can plant one
        sparse.truncate(untrusted.MAX_DOCUMENT_BYTES + 1)
    done = _cli("report", str(run), cwd=tmp_path)
    assert done.returncode == 4 and "verdict.json" in done.stderr and "cap" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_run_recipe_that_is_a_fifo_is_refused(run: Path, tmp_path: Path) -> None:
    from repro500.verify.rundir import load_run

    (run / "recipe.yaml").unlink()
    os.mkfifo(run / "recipe.yaml")
    with pytest.raises(InvalidInput, match="not a regular file"):
        load_run(run)


def test_logs_with_absurd_lines_are_read_line_by_line(run: Path) -> None:
    from repro500.rundir import layout
    from repro500.verify.determinism import read_params

    metrics = run / "repeats" / "0" / "metrics.jsonl"
    with metrics.open("a") as log:
        log.write("[" * 200_000 + "\n")
        log.write('{"kind": "step", "step": 99, "loss": 0.1}\n')
    records, skipped = layout.metric_records(metrics)
    assert skipped == 1 and records[-1]["step"] == 99
    params = run / "repeats" / "0" / "params.jsonl"
    with params.open("a") as log:
        log.write("{" * 200_000 + "\n")
    assert read_params(params)  # the good lines still count


@pytest.fixture(scope="module")
def publication(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("publisher")
    make_run(root / "runs", "ref")
    done = repro500("publish", "runs/ref", "--out", "pub", "--citation", "Test 2026", cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    return root / "pub"


def test_verify_of_a_publication_nested_200000_deep_is_one_sentence(publication: Path, tmp_path: Path) -> None:
    pub = tmp_path / "pub"
    shutil.copytree(publication, pub)
    (pub / "publication.json").write_text("[" * 200_000 + "]" * 200_000)
    done = _cli("verify", str(pub), "--no-write", cwd=tmp_path)
    assert done.returncode == 4, done.stderr
    assert "publication.json" in done.stderr and "nested too deeply" in done.stderr, done.stderr


def test_verify_of_a_publication_whose_index_is_a_fifo_ends_at_once(publication: Path, tmp_path: Path) -> None:
    pub = tmp_path / "pub"
    shutil.copytree(publication, pub)
    (pub / "publication.json").unlink()
    os.mkfifo(pub / "publication.json")
    done = _cli("verify", str(pub), "--no-write", cwd=tmp_path)
    assert done.returncode == 4, done.stderr


# ----- a sealed run downloaded from MLflow ------------------------------------------------------------
def test_a_download_is_refused_before_it_starts_when_its_size_is_unknown_or_over_the_cap(monkeypatch) -> None:
    from types import SimpleNamespace

    from repro500.verify import from_mlflow

    with pytest.raises(InvalidInput, match="no size"):
        from_mlflow._checked_size(SimpleNamespace(path="run/x.tar.gz", file_size=None), "abc", "x")
    monkeypatch.setenv(untrusted.UNPACK_ENV, "1000")
    with pytest.raises(InvalidInput, match="over the 1,000-byte cap.*refused before downloading"):
        from_mlflow._checked_size(SimpleNamespace(path="run/x.tar.gz", file_size=30 * 2**30), "abc", "x")
    assert from_mlflow._checked_size(SimpleNamespace(path="run/x.tar.gz", file_size=999), "abc", "x") == 999


def test_a_store_sending_more_than_it_listed_is_cut_off_while_streaming(tmp_path: Path) -> None:
    import threading

    from repro500.verify import from_mlflow

    stop = threading.Event()

    def endless() -> str:
        with open(tmp_path / "x.tar.gz", "wb") as out:
            while not stop.is_set():
                out.write(b"\0" * 65536)
                time.sleep(0.001)
        return str(tmp_path / "x.tar.gz")

    try:
        with pytest.raises(InvalidInput, match="sends more than the 1,000,000 bytes"):
            from_mlflow._bounded(endless, tmp_path, 1_000_000, "the sealed run")
    finally:
        stop.set()
    assert (tmp_path / "x.tar.gz").stat().st_size < 200 * 2**20

    def short() -> str:
        (tmp_path / "y.tar.gz").write_bytes(b"x" * 10)
        return str(tmp_path / "y.tar.gz")

    (tmp_path / "x.tar.gz").unlink()
    with pytest.raises(InvalidInput, match="is not the 11-byte regular file"):
        from_mlflow._bounded(short, tmp_path, 11, "the sealed run")


@pytest.mark.skipif(sys.platform != "linux", reason="a sparse file of gigabytes needs a file system that has them")
@pytest.mark.slow
def test_verify_mlflow_refuses_a_sealed_run_of_30_gb_before_downloading_it(tmp_path: Path) -> None:
    env = {"MLFLOW_TRACKING_URI": mlflow_store(tmp_path / "mlflow.db")}
    done = repro500("run", "--repeats", "1", "--run-id", "big", "--metric", "accuracy=regex:Acc ([0-9.]+)",
                    "--accept", "accuracy>=0.5", "--command", "--", sys.executable, "-c", "print('Acc 1')",
                    cwd=tmp_path, env=env, timeout=300)
    assert done.returncode in (0, 3), done.stderr[-2000:]
    parent_id = json.loads((tmp_path / "runs/big/run.json").read_text())["mlflow"]["parent_run_id"]
    (stored,) = [p for p in tmp_path.rglob("big.tar.gz") if parent_id in str(p)]
    with open(stored, "r+b") as sparse:  # what a hostile store holds: 30 GB that take no disk
        sparse.truncate(30 * 2**30)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    refused = _cli("verify", f"mlflow:{parent_id}", cwd=tmp_path, env={**env, "TMPDIR": str(scratch)})
    assert refused.returncode == 4, refused.stderr
    assert "refused before downloading" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert not list(scratch.rglob("*.tar.gz"))
