"""A publication is data: what a reproduction checked is what it uses, and every path a record
names is resolved in one place (repro500.recorded_paths).

Each attack is built as a publisher builds it: their own run, whose records they write as they
like, published (so every digest list is sealed as repro500 seals it), or a genuine publication
edited afterwards.  Each is refused with one sentence and exit 4 before it reads or writes what
it names, and the reproducer's files stay as they were.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers.rundirs import make_manifest, make_run
from helpers.runs import PLUGIN, repro500

from repro500 import recorded_paths
from repro500.errors import InvalidInput
from repro500.rundir import ownership
from repro500.rundir import sums as bundle

ROOT = Path(__file__).resolve().parents[1]
# a recipe that runs the publisher's command: what the checked (built-in) recipe would be replaced by
FORGED = ("schema: repro500/recipe/v1\nname: forged\nfixed:\n  command: [sh, -c, 'touch PUBLISHER-CODE-RAN; echo acc 1.0']\n"
          "metrics:\n  accuracy: {regex: 'acc ([0-9.]+)'}\nacceptance:\n  accuracy: {target: 0.5, tolerance: 0.5}\n"
          "repeats: 1\nseed: 500\n")


def _said(done: subprocess.CompletedProcess[str]) -> str:
    text = done.stdout + done.stderr
    assert "Traceback" not in text, text
    return " ".join(text.split())  # rich wraps long lines on a narrow terminal


def _publication(base: Path, entries: list[dict], *, name: str = "pub") -> Path:
    """A publisher's publication of their own (fabricated) run whose manifest records ``entries``
    as its data paths: real data, so a reproduction looks for a copy under --data-root."""
    from repro500.publish.datafiles import SPECS_NAME, SPECS_SCHEMA
    from repro500.publish.publication import publish

    run = make_run(base / "runs", "ref", manifest=make_manifest(data={"entries": entries}))
    specs = [{"path": e["path"], "md5": e["md5"], "bytes": e.get("size"), "nfiles": e.get("nfiles"),
              "generate": None, "note": "real data"} for e in entries]
    (run / SPECS_NAME).write_text(json.dumps({"schema": SPECS_SCHEMA, "data": specs}))
    bundle.write_sums(run)
    # the publisher's own repro500 need not check what it publishes: the reproducer's must
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("repro500.publish.publication._check_data_paths", lambda *args: None)
        return publish(run, base / name).path


def _entry(path: str, content: bytes) -> dict:
    return {"path": path, "kind": "file", "hash": "md5", "md5": hashlib.md5(content).hexdigest(),
            "size": len(content), "nfiles": None}


# ----- check = use: the snapshot -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["recipe.yaml", "published.yaml"])
def test_a_data_path_landing_on_the_snapshot_is_refused_and_the_checked_file_stays(tmp_path: Path, name: str) -> None:
    forged = FORGED.encode()
    pub = _publication(tmp_path / "publisher", [_entry(f"publication/{name}", forged)])
    victim = tmp_path / "victim"
    (victim / "publication").mkdir(parents=True)  # the data root (.) holds the publisher's file
    (victim / "publication" / name).write_bytes(forged)
    done = repro500("reproduce", str(pub), "--out", "OUT", cwd=victim, timeout=120)
    text = _said(done)
    assert done.returncode == 4, text
    assert f"publication/{name}" in text and "publication's own files" in text, text
    snapshot = victim / "OUT" / "publication"
    if (snapshot / name).exists():
        assert (snapshot / name).read_bytes() == (pub / name).read_bytes()
    assert not list(victim.rglob("PUBLISHER-CODE-RAN"))


def test_the_snapshot_is_read_only_and_holds_only_the_publications_own_files(tmp_path: Path) -> None:
    from repro500.publish.opened import open_publication

    content = b"data"
    pub = _publication(tmp_path / "publisher", [_entry("data/real.bin", content)])
    (pub / "dvc.lock").write_text("beside it, not its own\n")  # what ran in a publication's directory
    opened = open_publication(pub, tmp_path / "check")
    assert opened.root == tmp_path / "check" / "publication"
    assert sorted(p.name for p in opened.root.iterdir()) == sorted([*bundle.read_sums(pub), bundle.SUMS_NAME])
    assert all(not os.stat(p).st_mode & 0o222 for p in [opened.root, *opened.root.iterdir()])
    assert not os.stat(opened.reference / "run.json").st_mode & 0o222


def test_verify_refuses_a_publication_whose_published_yaml_is_a_link(tmp_path: Path) -> None:
    pub = _publication(tmp_path, [])
    forged = tmp_path / "forged.yaml"
    forged.write_text((pub / "published.yaml").read_text().replace("0.93", "0.1"))
    (pub / "published.yaml").unlink()
    (pub / "published.yaml").symlink_to("../forged.yaml")
    done = repro500("verify", str(pub), cwd=tmp_path)
    text = _said(done)
    assert done.returncode == 4 and "published.yaml is not a regular file" in text, text
    assert "Integrity  ok" not in text
    against = repro500("verify", str(tmp_path / "runs" / "ref"), "--against", str(pub / "published.yaml"), cwd=tmp_path)
    text = _said(against)
    assert against.returncode == 4 and "not a regular file" in text, text
    assert "REPRODUCED" not in text


# ----- the path rule -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/proc/self/pagemap", "/proc/self/root/proc/self/pagemap"])
def test_a_kernel_file_as_a_data_path_is_refused_at_once_by_verify_and_publish(tmp_path: Path, path: str) -> None:
    run = make_run(tmp_path / "runs", "ref", manifest=make_manifest(data={"entries": [_entry(path, b"")]}))
    started = time.monotonic()
    done = repro500("verify", str(run), cwd=tmp_path, timeout=90)
    text = _said(done)
    assert done.returncode == 4 and "kernel file" in text and "data path" in text, text
    published = repro500("publish", str(run), "--out", str(tmp_path / "pub"), cwd=tmp_path, timeout=90)
    text = _said(published)
    assert published.returncode == 4 and "kernel file" in text, text
    assert time.monotonic() - started < 60  # hashing it would take minutes
    assert not (tmp_path / "pub").exists()


def test_a_data_path_of_dot_is_refused_without_reading_the_working_directory(tmp_path: Path) -> None:
    pub = _publication(tmp_path / "publisher", [_entry(".", b"")])
    victim = tmp_path / "victim"
    victim.mkdir()
    with open(victim / "huge.img", "wb") as handle:  # a terabyte of holes: minutes to hash, no disk
        handle.truncate(2**40)
    started = time.monotonic()
    done = repro500("reproduce", str(pub), "--out", "OUT", cwd=victim, timeout=120)
    text = _said(done)
    assert done.returncode == 4 and "whole directory" in text, text
    assert time.monotonic() - started < 60


@pytest.mark.parametrize(("text", "why"), [
    (".", "whole directory"), ("./", "whole directory"), ("a/../../x", "'..'"), ("/etc/passwd", "absolute"),
    ("", "not a path"), ("publication/recipe.yaml", "publication's own files"), ("publication", "own files"),
])
def test_the_resolver_refuses_each_kind_with_the_field_and_the_file(tmp_path: Path, text: str, why: str) -> None:
    (tmp_path / "publication").mkdir()
    with pytest.raises(InvalidInput) as err:
        recorded_paths.resolve(text, field="data[0].path", file="params.yaml", root=tmp_path,
                               never=[tmp_path / "publication"])
    assert why in str(err.value) and "data[0].path" in str(err.value) and "params.yaml" in str(err.value)


def test_the_resolver_follows_links_and_aliases_before_it_decides(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "escape").symlink_to(tmp_path)
    (tmp_path / "out" / "kernel").symlink_to("/proc/self")
    os.mkfifo(tmp_path / "out" / "fifo")
    for text, why in (("escape/x", "outside"), ("kernel/pagemap", "kernel file"), ("fifo", "FIFO")):
        with pytest.raises(InvalidInput, match=why):
            recorded_paths.resolve(text, field="f", file="r", root=tmp_path / "out")
    with pytest.raises(InvalidInput, match="kernel file"):
        recorded_paths.resolve("/proc/self/root/proc/self/pagemap", field="f", file="r", anywhere=True)
    with pytest.raises(InvalidInput, match="working directory"):
        recorded_paths.resolve(str(Path.cwd().parent), field="f", file="r", anywhere=True)
    assert recorded_paths.resolve("data/x.h5", field="f", file="r", root=tmp_path / "out") == tmp_path / "out/data/x.h5"


def test_hashing_stops_at_the_listed_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from repro500.capture import data

    path = tmp_path / "grows.bin"
    path.write_bytes(b"x" * 10)
    with pytest.raises(OSError, match="listed size"):
        data.md5_file(path, limit=4)


# ----- the structure: no recorded path becomes a filesystem path without the resolver --------------

# the modules that read someone else's records and use the paths they name
READERS = ["repro500/publish/reproduce.py", "repro500/publish/opened.py", "repro500/publish/datafiles.py",
           "repro500/publish/source.py", "repro500/publish/rebuild/lock.py", "repro500/verify/integrity.py",
           "repro500/capture/data.py", "repro500/locate/plan.py", "repro500/locate/pipeline.py"]


SANCTIONED = ("recorded_paths.resolve", "recorded_paths.relative", "untrusted.path_name")


def _walk_unsanctioned(node: ast.AST):
    """``ast.walk``, not entering the resolver's calls (what it returns is a checked path)."""
    stack = [node]
    while stack:
        sub = stack.pop()
        if isinstance(sub, ast.Call) and ast.unparse(sub.func) in SANCTIONED:
            continue
        yield sub
        stack.extend(ast.iter_child_nodes(sub))


def _from_record(node: ast.AST) -> bool:
    """Whether an expression takes a value out of a record: ``x["path"]`` or ``x.get("path")``."""
    for sub in _walk_unsanctioned(node):
        if isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Constant) and isinstance(sub.slice.value, str):
            return True
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "get" \
                and sub.args and isinstance(sub.args[0], ast.Constant) and isinstance(sub.args[0].value, str):
            return True
    return False


def _unresolved(tree: ast.AST) -> list[int]:
    """Lines where a value from a record becomes a path without the resolver: ``Path(rec[...])``,
    ``os.path.*(rec.get(...))`` or ``root / rec[...]``."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            owner = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
            if (name in ("Path", "PurePosixPath") or owner == "os.path") and any(_from_record(a) for a in node.args):
                lines.append(node.lineno)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _from_record(node.right):
            lines.append(node.lineno)
    return lines


def test_no_reader_turns_a_recorded_path_into_a_filesystem_path_without_the_resolver() -> None:
    found = []
    for rel in READERS:
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
        found += [f"{rel}:{line}" for line in _unresolved(tree)]
    assert not found, f"recorded paths used without repro500.recorded_paths.resolve: {found}"


def test_the_structural_check_finds_what_it_looks_for() -> None:
    for bad in ('Path(entry["path"])', 'root / entry.get("path")', 'os.path.exists(e["path"])',
                'PurePosixPath(item.get("out"))'):
        assert _unresolved(ast.parse(bad)), bad
    assert not _unresolved(ast.parse('Path(recorded_paths.resolve(entry["path"], field="f", file="r", root=root))'))


# ----- trust follows the run -----------------------------------------------------------------------
MARKER_ENV = "CONSENT_MARKER"
EVIL = ("import os\nos.environ.get('CONSENT_MARKER') and open(os.environ['CONSENT_MARKER'], 'w').write('ran')\n"
        + PLUGIN)


@pytest.fixture(scope="module")
def packed_plugin_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A publisher's packed run of a plug-in model whose module writes the marker when imported,
    made on the publisher's machine (their own repro500 state directory)."""
    proj = tmp_path_factory.mktemp("publisher")
    (proj / "evilmod.py").write_text(EVIL)
    recipe = {
        "schema": "repro500/recipe/v1", "name": "evil",
        "fixed": {"workload": "classification", "model": "evilmod:build", "model_options": {"width": 8},
                  "dataset": {"entry": "evilmod:make", "params": {"samples": 32, "seed": 1}},
                  "target": {"metric": "accuracy", "value": 0.999}, "epochs": 1},
        "mutable": {"batch_size": 16, "eval_batch_size": 32, "optimizer": {"name": "sgd", "lr": 0.1}, "threads": 1},
        "acceptance": {"accuracy": {"target": 0.5, "tolerance": 0.5}}, "repeats": 2, "seed": 5,
    }
    (proj / "evil.yaml").write_text(yaml.safe_dump(recipe))
    env = {"REPRO500_STATE_DIR": str(proj / "publisher-state")}
    ran = repro500("run", "evil.yaml", "--same-seed", "--no-tracking", "--run-id", "r", cwd=proj, env=env)
    assert ran.returncode in (0, 1, 3), ran.stdout + ran.stderr
    packed = repro500("pack", "runs/r", "-o", str(proj / "r.tar.gz"), cwd=proj, env=env)
    assert packed.returncode == 0, packed.stdout + packed.stderr
    return proj / "r.tar.gz"


def _victim(tmp_path: Path, packed: Path) -> tuple[Path, dict[str, str]]:
    env = {"REPRO500_STATE_DIR": str(tmp_path / "victim-state"), MARKER_ENV: str(tmp_path / "MARKER")}
    done = repro500("unpack", str(packed), "--dest", "u", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return tmp_path / "u" / "r", env


def test_the_runner_records_the_runs_it_makes_as_this_machines_own(packed_plugin_run: Path) -> None:
    from repro500 import untrusted

    state = packed_plugin_run.parent / "publisher-state"
    assert list((state / "own-runs").iterdir())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("REPRO500_STATE_DIR", str(state))
        assert ownership.origin_of(packed_plugin_run.parent / "runs" / "r") == untrusted.OWN_RUN


def test_an_unpacked_run_stays_foreign_locate_asks_the_same_consent(tmp_path: Path, packed_plugin_run: Path) -> None:
    run, env = _victim(tmp_path, packed_plugin_run)
    done = repro500("locate", str(run), "--steps", "1", cwd=tmp_path, env=env)
    text = _said(done)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, text
    assert "did not make" in text and "evilmod.py" in text and "--run-code" in text, text
    assert not (tmp_path / "MARKER").exists()


def test_resuming_an_unpacked_run_asks_the_consent_before_anything_runs(tmp_path: Path, packed_plugin_run: Path) -> None:
    run, env = _victim(tmp_path, packed_plugin_run)
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, "status": "interrupted"}))  # as a publisher may ship it
    before = (run / "run.json").read_text()
    done = repro500("run", "--resume", str(run), "--no-tracking", cwd=tmp_path, env=env)
    text = _said(done)
    assert done.returncode == 2 and "did not make" in text and "--run-code" in text, text
    assert not (tmp_path / "MARKER").exists() and (run / "run.json").read_text() == before


def test_a_run_is_ones_own_only_as_this_machine_sealed_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from repro500 import untrusted
    from repro500.rundir import layout

    monkeypatch.setenv("REPRO500_STATE_DIR", str(tmp_path / "state"))
    run = make_run(tmp_path / "runs", "mine")
    (run / "source").mkdir()
    (run / "source" / "nets.py").write_text("WIDTH = 8\n")
    assert ownership.origin_of(run) == untrusted.FOREIGN_RUN  # sealed by a helper, not by repro500 run
    layout.RunDir(run).seal()
    assert ownership.origin_of(run) == untrusted.OWN_RUN
    (run / "source" / "nets.py").write_text("import os\n")  # the code changed since the seal
    assert ownership.origin_of(run) == untrusted.FOREIGN_RUN
    (run / "source" / "nets.py").write_text("WIDTH = 8\n")
    (run / "source" / "extra.py").write_text("import os\n")  # a module added beside it
    assert ownership.origin_of(run) == untrusted.FOREIGN_RUN
    (run / "source" / "extra.py").unlink()
    assert ownership.origin_of(run) == untrusted.OWN_RUN
    monkeypatch.setenv("REPRO500_STATE_DIR", str(tmp_path / "elsewhere"))  # another machine
    assert ownership.origin_of(run) == untrusted.FOREIGN_RUN


def test_a_run_killed_before_its_seal_is_still_ones_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from repro500 import untrusted

    monkeypatch.setenv("REPRO500_STATE_DIR", str(tmp_path / "state"))
    run = make_run(tmp_path / "runs", "mine")
    (run / "SHA256SUMS").unlink()  # killed before the runner sealed it
    (run / "source").mkdir()
    (run / "source" / "nets.py").write_text("WIDTH = 8\n")
    digest = hashlib.sha256(b"WIDTH = 8\n").hexdigest()
    (run / "source.json").write_text(json.dumps({"files": [{"path": "nets.py", "sha256": digest, "copied": True}]}))
    assert ownership.origin_of(run) == untrusted.FOREIGN_RUN
    ownership.record_own_run(run)  # what the runner does once the manifest is written
    assert ownership.origin_of(run) == untrusted.OWN_RUN
    (run / "source" / "nets.py").write_text("import os\n")
    assert ownership.origin_of(run) == untrusted.FOREIGN_RUN


@pytest.mark.slow
def test_from_git_a_dvc_remote_inside_the_repository_cannot_replace_the_checked_recipe(tmp_path: Path) -> None:
    """The same attack from a git source: the forged recipe arrives by dvc pull from a remote the
    repository itself holds."""
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e.org", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@e.org", DVC_NO_ANALYTICS="1")

    def sh(*args: str) -> None:
        done = subprocess.run(list(args), cwd=repo, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"

    repo = tmp_path / "repo"
    (repo / "publication").mkdir(parents=True)
    forged = FORGED.encode()
    (repo / "publication" / "recipe.yaml").write_bytes(forged)
    sh("git", "init", "-q")
    for args in (["init", "-q"], ["remote", "add", "-d", "store", "dvcstore"], ["add", "-q", "publication/recipe.yaml"],
                 ["push", "-q"]):
        sh(sys.executable, "-m", "dvc", *args)
    _publication(repo, [_entry("publication/recipe.yaml", forged)], name="pubs/ref")
    (repo / ".gitignore").write_text("/runs/\n")
    sh("git", "add", "-A")
    sh("git", "commit", "-qm", "publication and its data remote")
    victim = tmp_path / "victim"
    victim.mkdir()
    done = repro500("reproduce", f"file://{repo}", "--path", "pubs/ref", "--out", "OUT", cwd=victim, timeout=180)
    text = _said(done)
    assert done.returncode == 4 and "publication/recipe.yaml" in text and "publication's own files" in text, text
    assert not list(victim.rglob("PUBLISHER-CODE-RAN"))
    if (victim / "OUT" / "publication" / "recipe.yaml").exists():
        assert (victim / "OUT" / "publication" / "recipe.yaml").read_bytes() == (repo / "pubs/ref/recipe.yaml").read_bytes()


def test_a_data_root_holding_the_publication_never_serves_its_own_files_as_data(tmp_path: Path) -> None:
    """Standing in the publication (the default --data-root . is then the publication itself), a
    data path naming one of its own files is refused, not copied from there."""
    first = _publication(tmp_path / "dry", [])
    recipe = (first / "recipe.yaml").read_bytes()  # what publish will write again for the same run
    pub = _publication(tmp_path / "publisher", [_entry("recipe.yaml", recipe)])
    assert (pub / "recipe.yaml").read_bytes() == recipe
    done = repro500("reproduce", ".", "--out", str(tmp_path / "OUT"), cwd=pub, timeout=120)
    text = _said(done)
    assert done.returncode == 4 and "publication's own files" in text, text
    assert not (tmp_path / "OUT" / "recipe.yaml").exists()
