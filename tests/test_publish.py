"""``repro500 publish`` and ``repro500 reproduce``, end to end with real runs, git and DVC.

One tiny run (2 repeats with the same seed, 1 epoch, CPU) is published once per module.
Its training data has no generator attribute (it stands for real data, tracked by DVC with a
local remote); its evaluation data is generated, so it can be regenerated from its attributes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from helpers import hostile
from helpers.runs import repro500

from repro500.rundir.dvcmetrics import verdict_metrics

TINY = {
    "schema": "repro500/recipe/v1",
    "name": "tiny",
    "fixed": {
        "workload": "classification",
        "model": "resnet20",
        "dataset": {"name": "classification-h5", "path": "data/train.h5", "eval_path": "data/eval.h5"},
        "target": {"metric": "accuracy", "value": 0.99, "direction": "higher"},
        "epochs": 1,
    },
    "mutable": {"batch_size": 64, "eval_batch_size": 64, "device": "cpu", "threads": 1},
    "acceptance": {"accuracy": {"target": 0.5, "direction": "higher", "tolerance": 0.05}},
    "repeats": 2,
    "seed": 11,
}
GIT_ID = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
          "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}


def _tool_env() -> dict[str, str]:
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                DVC_NO_ANALYTICS="1", **GIT_ID)


def _sh(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(args), cwd=cwd, env=env or _tool_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done


def _dvc(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return _sh(sys.executable, "-m", "dvc", *args, cwd=cwd)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git + DVC project with a finished tiny run and its publication in pubs/ref."""
    import h5py

    from repro500.data.generate import generate

    root = tmp_path_factory.mktemp("project")
    generate("classification", root / "data" / "train.h5", samples=128, seed=7, options={"noise": 0.04})
    with h5py.File(root / "data" / "train.h5", "a") as h5:
        del h5.attrs["generator"]  # now it looks like real data: no recorded way to regenerate it
    generate("classification", root / "data" / "eval.h5", samples=64, seed=7, split="eval", options={"noise": 0.04})
    (root / "tiny.yaml").write_text(yaml.safe_dump(TINY, sort_keys=False))
    _sh("git", "init", "-q", cwd=root)
    _dvc("init", "-q", cwd=root)
    _dvc("config", "core.analytics", "false", cwd=root)
    _dvc("remote", "add", "-d", "store", str(tmp_path_factory.mktemp("dvc-remote")), cwd=root)
    _dvc("add", "-q", "data/train.h5", cwd=root)
    _dvc("push", "-q", cwd=root)
    ran = repro500("run", "tiny.yaml", "--same-seed", "--no-tracking", "--out", "runs", "--run-id", "ref", cwd=root)
    assert ran.returncode in (0, 1, 3), ran.stdout + ran.stderr
    published = repro500("publish", "runs/ref", "--out", "pubs/ref", "--citation", "Test et al. 2026", cwd=root)
    assert published.returncode == 0, published.stdout + published.stderr
    (root / ".gitignore").write_text("/runs/\n")
    _sh("git", "add", "-A", cwd=root)
    _sh("git", "commit", "-q", "-m", "publication", cwd=root)
    return root


def test_publish_writes_a_checkable_publication(project: Path) -> None:
    pub = project / "pubs" / "ref"
    names = {p.name for p in pub.iterdir()}
    assert {"publication.json", "ref.tar.gz", "published.yaml", "manifest.json", "recipe.yaml", "params.yaml",
            "dvc.yaml", "README.md", "SHA256SUMS"} <= names
    # coreutils alone checks the publication
    _sh("sha256sum", "--quiet", "-c", "SHA256SUMS", cwd=pub)
    summary = json.loads((project / "runs" / "ref" / "summary.json").read_text())
    published = yaml.safe_load((pub / "published.yaml").read_text())
    assert published["schema"] == "repro500/published/v1"
    assert published["source"]["citation"] == "Test et al. 2026"
    assert published["metrics"]["accuracy"]["values"] == summary["metrics"]["accuracy"]["values"]
    assert published["metrics"]["accuracy"]["margin"] == 0.05  # the acceptance tolerance
    params = yaml.safe_load((pub / "params.yaml").read_text())
    by_path = {d["path"]: d for d in params["data"]}
    assert by_path["data/train.h5"]["generate"] is None  # no generator attribute
    assert by_path["data/eval.h5"]["generate"][0]["seed"] == 7
    assert params["run"] == {"repeats": 2, "seed": 11}
    # the run recorded the same specs itself, while the data was there
    specs = json.loads((project / "runs" / "ref" / "data-specs.json").read_text())
    assert specs["schema"] == "repro500/data-specs/v1"
    assert {d["path"]: d["generate"] for d in specs["data"]} == {p: d["generate"] for p, d in by_path.items()}
    assert "data-specs.json" in (project / "runs" / "ref" / "SHA256SUMS").read_text()
    readme = (pub / "README.md").read_text()
    assert "repro500 reproduce" in readme and "repro500 verify runs/rerun --against published.yaml" in readme
    assert "--same-seed" in yaml.safe_load((pub / "dvc.yaml").read_text())["stages"]["run"]["cmd"]
    # the recipe in the publication is one repro500 run accepts
    from repro500.recipe import load as recipe

    assert recipe.load(pub / "recipe.yaml").seed == 11
    # the packed run verifies on its own, anchored by the digest the publication records
    index = json.loads((pub / "publication.json").read_text())
    verified = repro500("verify", "ref.tar.gz", "--expect-sums", index["sums_digest"], cwd=pub)
    assert verified.returncode in (0, 1, 3), verified.stdout + verified.stderr


@pytest.mark.slow
def test_reproduce_a_publication_directory_round_trips(project: Path, in_tmp: Path) -> None:
    done = repro500("reproduce", str(project / "pubs" / "ref"), "--out", "rep", "--data-root", str(project),
                    cwd=in_tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "REPRODUCED" in done.stdout
    assert "data/eval.h5: regenerated from its generator parameters" in done.stdout
    assert f"data/train.h5: copied from {project / 'data' / 'train.h5'}" in done.stdout
    verdict = json.loads((in_tmp / "rep" / "verdict.json").read_text())
    assert verdict["status"] == "REPRODUCED" and verdict["against"]["kind"] == "published"
    assert verdict["provenance"]["available"] is True
    # CPU runs with the same seeds end with bitwise-identical parameters
    assert verdict["determinism"]["cross_run"] and all(p["identical"] for p in verdict["determinism"]["cross_run"])
    assert (in_tmp / "rep" / "publication" / "ref.tar.gz").is_file()
    flat = verdict_metrics(verdict)
    assert flat["status"] == "REPRODUCED" and flat["accuracy"]["reproduced"]["status"] == "REPRODUCED"


@pytest.mark.slow
def test_reproduce_from_git_clones_bare_pulls_with_dvc_and_runs_no_hook_or_filter(
        project: Path, in_tmp: Path) -> None:
    # A user whose git config installs hooks and a filter that the source's .gitattributes names:
    # a normal clone runs them (the control below); repro500 reproduce must not.
    hooks = in_tmp / "hooks"
    hooks.mkdir()
    for name in ("post-checkout", "reference-transaction", "post-merge"):
        (hooks / name).write_text(f"#!/bin/sh\ntouch {in_tmp}/hook-ran\n")
        (hooks / name).chmod(0o755)
    smudge = in_tmp / "smudge.sh"
    smudge.write_text(f"#!/bin/sh\ntouch {in_tmp}/filter-ran\ncat\n")
    smudge.chmod(0o755)
    gitconfig = in_tmp / "gitconfig"
    gitconfig.write_text(f"[core]\n\thooksPath = {hooks}\n[filter \"evil\"]\n\tsmudge = {smudge}\n\trequired = true\n")
    (project / ".gitattributes").write_text("*.yaml filter=evil\n")
    _sh("git", "add", ".gitattributes", cwd=project)
    _sh("git", "commit", "-q", "-m", "attributes", cwd=project)
    # and a dvc/ package in the source's tree: `python -m dvc` run there would import it
    evil = project / "dvc"
    evil.mkdir()
    for name in ("__init__.py", "__main__.py"):
        (evil / name).write_text(f"open({str(in_tmp / 'shadow-ran')!r}, 'w').close()\n")
    _sh("git", "add", "dvc", cwd=project)
    _sh("git", "commit", "-q", "-m", "a package named dvc", cwd=project)
    shutil.rmtree(evil)  # committed, but out of the way of this module's own dvc commands
    env = {"GIT_CONFIG_GLOBAL": str(gitconfig)}
    _sh("git", "clone", "-q", str(project), "control", cwd=in_tmp, env={**_tool_env(), **env})
    assert (in_tmp / "hook-ran").exists() and (in_tmp / "filter-ran").exists()  # the control: they do run
    (in_tmp / "hook-ran").unlink()
    (in_tmp / "filter-ran").unlink()

    done = repro500("reproduce", str(project), "--out", "rep", cwd=in_tmp, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "data/train.h5: pulled with DVC" in done.stdout
    assert "data/eval.h5: regenerated" in done.stdout
    assert not (in_tmp / "hook-ran").exists() and not (in_tmp / "filter-ran").exists()
    assert not (in_tmp / "shadow-ran").exists()
    assert json.loads((in_tmp / "rep" / "verdict.json").read_text())["status"] == "REPRODUCED"


def _tamper(pub: Path, resum: bool) -> None:
    path = pub / "published.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["metrics"]["accuracy"]["values"][0] += 0.25
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    if resum:  # a careful forger also rewrites the digest list
        lines = []
        for line in (pub / "SHA256SUMS").read_text().splitlines():
            digest, name = line.split("  ", 1)
            if name == "published.yaml":
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            lines.append(f"{digest}  {name}\n")
        (pub / "SHA256SUMS").write_text("".join(lines))


@pytest.mark.parametrize("resum", [False, True], ids=["edited", "edited-and-resummed"])
def test_reproduce_a_tampered_publication_exits_4_before_running(project: Path, in_tmp: Path, resum: bool) -> None:
    pub = in_tmp / "pub"
    shutil.copytree(project / "pubs" / "ref", pub)
    _tamper(pub, resum)
    done = repro500("reproduce", str(pub), "--out", "rep", "--data-root", str(project), cwd=in_tmp)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    expected = "differ from the packed run" if resum else "was changed after repro500 publish wrote it"
    assert expected in done.stderr and "published.yaml" in done.stderr
    assert not (in_tmp / "rep" / "runs").exists()  # nothing ran


@pytest.mark.parametrize(("nnodes", "code", "said"), [
    (2, 2, "the published run ran each repeat on 2 nodes (world size 1), and its rerun needs as many: rerun it on "
           "a SLURM cluster with --launcher slurm, whose tasks span 2 nodes each"),
    (10**9, 4, "run.json: nnodes is 1,000,000,000, over the 100,000 repro500 accepts from a record: refused"),
])
def test_a_publication_whose_repeats_ran_on_several_nodes_is_rerun_as_slurm_tasks_or_refused(
        project: Path, in_tmp: Path, nnodes: int, code: int, said: str) -> None:
    pub = in_tmp / "pub"
    shutil.copytree(project / "pubs" / "ref", pub)
    # the packed run's run.json says its repeats were tasks of several nodes (re-sealed, as a publisher's is)
    hostile.mutate_archived(pub, hostile.Field("run", "run.json", ("nnodes",), "count"), nnodes, in_tmp)
    hostile.reseal_publication(pub)
    done = repro500("reproduce", str(pub), "--out", "rep", "--data-root", str(project), cwd=in_tmp)
    assert done.returncode == code, done.stdout + done.stderr
    assert said in " ".join(done.stderr.split()) and "Traceback" not in done.stderr
    assert not (in_tmp / "rep" / "runs").exists()  # nothing ran


def _evil_archive(path: Path) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in (("ref/SHA256SUMS", b""), ("../escaped.txt", b"owned\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            import io

            tar.addfile(info, io.BytesIO(data))
    return path


def test_reproduce_refuses_an_archive_with_a_path_escape(project: Path, in_tmp: Path) -> None:
    work = in_tmp / "work"
    work.mkdir()
    archive = _evil_archive(in_tmp / "evil.tar.gz")
    done = repro500("reproduce", str(archive), "--out", "rep", cwd=work)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "unsafe to unpack" in done.stderr and "Traceback" not in done.stderr
    # the same archive inside an otherwise consistent publication
    pub = in_tmp / "pub"
    shutil.copytree(project / "pubs" / "ref", pub)
    shutil.copyfile(archive, pub / "ref.tar.gz")
    index = json.loads((pub / "publication.json").read_text())
    index["archive"]["sha256"] = hashlib.sha256(archive.read_bytes()).hexdigest()
    (pub / "publication.json").write_text(json.dumps(index))
    sums = "".join(f"{hashlib.sha256((pub / n).read_bytes()).hexdigest()}  {n}\n"
                   for n in sorted(p.name for p in pub.iterdir() if p.name != "SHA256SUMS"))
    (pub / "SHA256SUMS").write_text(sums)
    done = repro500("reproduce", str(pub), "--out", "rep2", cwd=work)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "unsafe to unpack" in done.stderr
    assert not any(p.name == "escaped.txt" for p in in_tmp.rglob("escaped.txt"))


@pytest.mark.slow
def test_reproduce_a_packed_run_publishes_it_on_the_fly(project: Path, in_tmp: Path) -> None:
    done = repro500("reproduce", str(project / "pubs" / "ref" / "ref.tar.gz"), "--out", "rep", "--repeats", "2",
                    "--data-root", str(project), cwd=in_tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (in_tmp / "rep" / "publication" / "publication.json").is_file()
    assert json.loads((in_tmp / "rep" / "verdict.json").read_text())["status"] == "REPRODUCED"


@pytest.mark.slow  # make test stays under 10 minutes on 2 cores; CI runs make test-slow
def test_reproduce_a_packed_run_without_its_data_regenerates_it(in_tmp: Path) -> None:
    """Someone else's packed run, on a machine that never had its (generated) data."""
    from repro500.data.generate import generate

    origin = in_tmp / "origin"
    generate("classification", origin / "data" / "train.h5", samples=128, seed=7, options={"noise": 0.04})
    generate("classification", origin / "data" / "eval.h5", samples=64, seed=7, split="eval", options={"noise": 0.04})
    (origin / "tiny.yaml").write_text(yaml.safe_dump(TINY, sort_keys=False))
    ran = repro500("run", "tiny.yaml", "--same-seed", "--no-tracking", "--out", "runs", "--run-id", "gen", cwd=origin)
    assert ran.returncode in (0, 1, 3), ran.stdout + ran.stderr
    packed = repro500("pack", "runs/gen", "--out", str(in_tmp / "gen.tar.gz"), cwd=origin)
    assert packed.returncode == 0, packed.stdout + packed.stderr
    md5s = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in (origin / "data").iterdir()}
    shutil.rmtree(origin)  # the data, the run, everything but the archive
    work = in_tmp / "elsewhere"
    work.mkdir()
    done = repro500("reproduce", str(in_tmp / "gen.tar.gz"), "--out", "rep", cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "REPRODUCED" in done.stdout
    for name in ("train.h5", "eval.h5"):
        assert f"data/{name}: regenerated from its generator parameters" in done.stdout
        assert hashlib.md5((work / "rep" / "data" / name).read_bytes()).hexdigest() == md5s[name]
    assert json.loads((work / "rep" / "verdict.json").read_text())["status"] == "REPRODUCED"


def test_publish_refuses_recorded_specs_that_write_outside_their_path(project: Path, in_tmp: Path) -> None:
    run = in_tmp / "ref"
    shutil.copytree(project / "runs" / "ref", run)
    specs = json.loads((run / "data-specs.json").read_text())
    eval_entry = next(d for d in specs["data"] if d["path"] == "data/eval.h5")
    eval_entry["generate"][0]["out"] = "data/elsewhere.h5"
    (run / "data-specs.json").write_text(json.dumps(specs))
    from repro500.rundir import sums as bundle

    bundle.write_sums(run)  # a consistent forgery: only the checks of the specs catch it
    done = repro500("publish", str(run), "--out", "pub", cwd=in_tmp)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "data-specs.json" in done.stderr and "writes outside data/eval.h5" in done.stderr
    assert not (in_tmp / "pub").exists()


def test_reproduce_names_what_it_cannot_recreate(project: Path, in_tmp: Path) -> None:
    # a publication directory (not git), data that is not generated and not under --data-root
    done = repro500("reproduce", str(project / "pubs" / "ref"), "--out", "rep", cwd=in_tmp)
    assert done.returncode == 4
    assert "data data/train.h5" in done.stderr and "cannot be recreated" in done.stderr


def test_publish_refuses_a_tampered_run_and_an_existing_directory(project: Path, in_tmp: Path) -> None:
    run = in_tmp / "ref"
    shutil.copytree(project / "runs" / "ref", run)
    done = repro500("publish", str(run), "--out", str(project / "pubs" / "ref"), cwd=in_tmp)
    assert done.returncode == 4 and "already exists" in done.stderr
    summary = run / "repeats" / "0" / "summary.json"
    summary.write_text(summary.read_text().replace('"epochs_run": 1', '"epochs_run": 2'))
    done = repro500("publish", str(run), "--out", "pub", cwd=in_tmp)
    assert done.returncode == 4 and "would not verify (repeat 0 was replaced" in done.stderr
    assert not (in_tmp / "pub").exists()


@pytest.mark.slow  # make test stays under 10 minutes on 2 cores; CI runs make test-slow
def test_the_publications_own_dvc_pipeline_reproduces_it(project: Path, in_tmp: Path) -> None:
    pub = in_tmp / "pub"
    shutil.copytree(project / "pubs" / "ref", pub)
    (pub / "data").mkdir()
    shutil.copyfile(project / "data" / "train.h5", pub / "data" / "train.h5")  # real data: not generated
    _dvc("init", "--no-scm", "-q", cwd=pub)
    ran = _dvc("repro", cwd=pub).stdout
    assert "Running stage 'generate'" in ran and "Running stage 'verify'" in ran
    metrics = json.loads((pub / "metrics" / "verdict.json").read_text())
    assert metrics["status"] == "REPRODUCED" and metrics["accuracy"]["reproduced"]["status"] == "REPRODUCED"
    # dvc plots show draws accuracy per repeat and at each epoch of each repeat (DVC's own reading)
    shown = json.loads(_dvc("plots", "show", "--json", cwd=pub).stdout)["data"]
    per_repeat, per_epoch = ([p for plot in shown[f"plots/{name}"] for p in plot["content"]["data"]["values"]]
                             for name in ("repeats.json", "epochs.json"))
    assert sorted(p["repeat"] for p in per_repeat) == sorted({p["repeat"] for p in per_epoch}) and per_repeat
    assert all(0.0 <= p["accuracy"] <= 1.0 for p in per_repeat + per_epoch) and {p["epoch"] for p in per_epoch} >= {1}
