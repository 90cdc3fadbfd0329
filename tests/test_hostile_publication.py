"""A hostile publication runs nothing and exhausts nothing.

Each attack is built as a malicious publisher would build it, from a genuine publication of a
tiny run (synthetic data, relative paths): files added and listed in its SHA256SUMS, links, YAML
bombs, absurd nesting, escape sequences in names.  Each is refused with one sentence and exit 4,
and no module of the publisher's runs (a planted module that writes a marker never does).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.runs import TINY_CLASSIFICATION, repro500, write_recipe

from repro500 import untrusted
from repro500.errors import InvalidInput

MARKER = "PUBLISHER-CODE-RAN"
PLANTED = f"from pathlib import Path\nPath({MARKER!r}).write_text('ran')\n"
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))


def _no_traceback(done: subprocess.CompletedProcess[str]) -> str:
    text = done.stdout + done.stderr
    assert "Traceback" not in text, text
    return text


def _list(pub: Path, name: str) -> None:
    """What a publisher does to smuggle a file in: list it in the publication's SHA256SUMS."""
    digest = hashlib.sha256((pub / name).read_bytes()).hexdigest()
    with (pub / "SHA256SUMS").open("a") as sums:
        sums.write(f"{digest}  {name}\n")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("publisher")
    write_recipe(root / "tiny.yaml", fixed__epochs=1)
    ran = repro500("run", "tiny.yaml", "--same-seed", "--no-tracking", "--out", "runs", "--run-id", "ref", cwd=root)
    assert ran.returncode in (0, 1, 3), ran.stdout + ran.stderr
    done = repro500("publish", "runs/ref", "--out", "pub", "--citation", "Test 2026", cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    return root


@pytest.fixture()
def pub(project: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "pub"
    shutil.copytree(project / "pub", copy)
    return copy


def test_a_module_listed_beside_the_publication_is_refused_and_never_imported(pub: Path, tmp_path: Path) -> None:
    (pub / "tabulate.py").write_text(PLANTED)
    _list(pub, "tabulate.py")
    victim = tmp_path / "victim"
    victim.mkdir()
    done = repro500("reproduce", str(pub), "--out", "OUT", cwd=victim)
    text = _no_traceback(done)
    assert done.returncode == 4, text
    assert "tabulate.py" in text and "never writes" in text
    assert not list(victim.rglob(MARKER)) and not list(victim.rglob("tabulate.py"))


def test_a_module_committed_beside_a_publication_in_git_never_runs(pub: Path, tmp_path: Path) -> None:
    (pub / "tabulate.py").write_text(PLANTED)
    _list(pub, "tabulate.py")
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e.org", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@e.org")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "publication"]):
        subprocess.run(["git", *args], cwd=pub, env=env, check=True, capture_output=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    done = repro500("reproduce", f"file://{pub}", "--out", "OUT", cwd=victim)
    _no_traceback(done)
    assert not list(victim.rglob(MARKER)) and not list(victim.rglob("tabulate.py")), done.stdout + done.stderr


def test_a_publication_file_linking_to_the_readers_files_is_refused_before_it_is_copied(pub: Path, tmp_path: Path) -> None:
    secret = tmp_path / "victims-notes.txt"
    secret.write_text((pub / "README.md").read_text())  # the same bytes, so the listed digest matches
    (pub / "README.md").unlink()
    (pub / "README.md").symlink_to(secret)
    victim = tmp_path / "victim"
    victim.mkdir()
    done = repro500("reproduce", str(pub), "--out", "OUT", cwd=victim)
    text = _no_traceback(done)
    assert done.returncode == 4 and "not a regular file" in text, text
    assert not (victim / "OUT" / "publication" / "README.md").exists()


@pytest.mark.slow
def test_reproduce_asks_consent_for_every_door_that_imports_code(project: Path, tmp_path: Path) -> None:
    # The publisher's dataset plug-in is installed (site-packages), so the run records no source of
    # its own; the recipe names it through fixed.dataset.name, a door the consent check must see.
    site = tmp_path / "lib" / "site-packages"
    site.mkdir(parents=True)
    (site / "evilplug.py").write_text(
        PLANTED + "from repro500.workloads import plugins\n"
        "def build(split, path=None, seed=0, **params):\n"
        "    return plugins.registered('dataset')['synthetic-classification'].load()(split, path=path, seed=seed, **params)\n")
    publisher = tmp_path / "publisher"
    publisher.mkdir()
    recipe = yaml.safe_load(yaml.safe_dump(TINY_CLASSIFICATION))
    recipe["fixed"]["epochs"] = 1
    recipe["repeats"] = 1
    recipe["fixed"]["dataset"]["name"] = "evilplug:build"
    (publisher / "tiny.yaml").write_text(yaml.safe_dump(recipe))
    env = {"PYTHONPATH": str(site)}
    ran = repro500("run", "tiny.yaml", "--no-tracking", "--out", "runs", "--run-id", "ref", cwd=publisher, env=env)
    assert ran.returncode in (0, 1, 3), ran.stdout + ran.stderr
    done = repro500("publish", "runs/ref", "--out", "pub", "--citation", "Test 2026", cwd=publisher, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    victim = tmp_path / "victim"
    victim.mkdir()
    done = repro500("reproduce", str(publisher / "pub"), "--out", "OUT", cwd=victim, env=env)
    text = _no_traceback(done)
    assert done.returncode == 2 and "fixed.dataset.name" in text and "--run-code" in text, text  # consent: a usage matter
    assert not (victim / "OUT" / "runs").exists() and not list(victim.rglob(MARKER))


@pytest.mark.parametrize("key", ["fixed__model", "fixed__evaluate"])
def test_a_run_without_consent_imports_no_module_callable_and_searches_no_directory(tmp_path: Path, key: str) -> None:
    (tmp_path / "nets.py").write_text(PLANTED + "def build(**kw):\n    raise SystemExit('imported')\n")
    write_recipe(tmp_path / "r.yaml", **{key: "nets:build"})
    done = repro500("run", "r.yaml", "--no-tracking", "--out", "runs", cwd=tmp_path,
                    env={untrusted.CODE_ENV: "refuse", "PYTHONSAFEPATH": "1"})
    text = _no_traceback(done)
    assert done.returncode == 4 and "would import the publication's own code" in text, text
    assert not (tmp_path / MARKER).exists()


def test_no_directory_is_searched_for_code_without_consent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from repro500.workloads import plugins

    monkeypatch.setenv(untrusted.CODE_ENV, "refuse")
    before = list(sys.path)
    assert plugins.search_paths([str(tmp_path)]) == []
    plugins.add_search_paths([str(tmp_path)])
    assert sys.path == before
    with pytest.raises(InvalidInput, match="--run-code"):
        plugins.resolve("model", "nets:build", key="fixed.model")
    recipe = {"fixed": {"model": "resnet20", "dataset": {"name": "evil:ds"},
                        "system": {"model": "m:build", "search_paths": ["."], "dataset": {"entry": "e:f"}}}}
    assert [key for key, _ in untrusted.import_refs(recipe)] == [
        "fixed.dataset.name", "fixed.system.model", "fixed.system.dataset.entry", "fixed.system.search_paths"]


def test_yaml_alias_bombs_are_refused_in_published_results_and_recipes(project: Path, tmp_path: Path) -> None:
    published = yaml.safe_load((project / "pub" / "published.yaml").read_text())
    text = yaml.safe_dump({k: v for k, v in published.items() if k != "notes"}) + "notes:\n" + "".join(
        f"  {line}\n" for line in BOMB.splitlines())
    (tmp_path / "bomb.yaml").write_text(text)
    done = repro500("verify", str(project / "runs" / "ref"), "--against", "bomb.yaml", "--no-write", cwd=tmp_path, timeout=60)
    assert done.returncode == 4 and "YAML bomb" in _no_traceback(done), done.stdout + done.stderr
    recipe = (tmp_path / "recipe.yaml")
    recipe.write_text(yaml.safe_dump(TINY_CLASSIFICATION) + "description:\n" + "".join(f"  {line}\n" for line in BOMB.splitlines()))
    done = repro500("run", "recipe.yaml", "--no-tracking", cwd=tmp_path, timeout=60)
    assert done.returncode == 4 and "YAML bomb" in _no_traceback(done), done.stdout + done.stderr
    with pytest.raises(InvalidInput, match="YAML bomb"):
        untrusted.load_yaml("a: &a [*a]\n", "recursive.yaml")


@pytest.mark.parametrize("target", ["/dev/zero", "../elsewhere/manifest.json"])
def test_published_results_read_no_file_but_their_own(project: Path, tmp_path: Path, target: str) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "manifest.json").write_text('{"facets": {"secret": {"token": "hunter2"}}}')
    (tmp_path / "refs").mkdir()
    published = yaml.safe_load((project / "pub" / "published.yaml").read_text())
    published["manifest"] = target
    (tmp_path / "refs" / "pub.yaml").write_text(yaml.safe_dump(published))
    done = repro500("verify", str(project / "runs" / "ref"), "--against", "refs/pub.yaml", "--no-write",
                    cwd=tmp_path, timeout=60)
    text = _no_traceback(done)
    assert done.returncode == 4 and "hunter2" not in text, text
    assert ("outside" in text) if target.startswith("..") else ("outside" in text or "not a regular file" in text)


def test_absurd_nesting_and_a_fifo_in_a_run_directory_are_sentences(project: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(project / "runs" / "ref", run)
    (run / "run.json").write_text("[" * 200_000 + "]" * 200_000)
    done = repro500("verify", str(run), "--no-write", cwd=tmp_path, timeout=60)
    assert done.returncode == 4, _no_traceback(done)
    (run / "run.json").unlink()
    os.mkfifo(run / "run.json")
    done = repro500("verify", str(run), "--no-write", cwd=tmp_path, timeout=60)
    assert done.returncode == 4, _no_traceback(done)
    with pytest.raises(InvalidInput, match="not a regular file"):
        untrusted.read_bytes(run / "run.json", "run.json")


def test_names_from_a_run_cannot_drive_the_terminal(project: Path, tmp_path: Path) -> None:
    published = yaml.safe_load((project / "pub" / "published.yaml").read_text())
    published.pop("manifest", None)
    metric = next(iter(published["metrics"]))
    evil = metric + "\x1b]52;c;ZXZpbA==\x07\x1b]0;owned\x07"
    published["metrics"] = {evil: published["metrics"][metric]}
    (tmp_path / "pub.yaml").write_text(yaml.safe_dump(published))
    done = repro500("verify", str(project / "runs" / "ref"), "--against", "pub.yaml", "--no-write", cwd=tmp_path)
    text = _no_traceback(done)
    assert "\x1b]" not in text and "\x07" not in text, repr(text)
    assert "\\x1b]52" in text  # shown, escaped, so the reader sees what the name holds


def test_a_file_name_that_is_not_utf8_and_an_absurd_number_are_sentences(project: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(project / "runs" / "ref", run)
    with open(os.fsencode(run) + b"/\xff\xfe.txt", "wb") as planted:
        planted.write(b"x")
    done = repro500("report", str(run), cwd=tmp_path)
    assert done.returncode == 4, _no_traceback(done)
    assert "\\xff\\xfe.txt" in (run / "report.html").read_text(encoding="utf-8")
    published = yaml.safe_load((project / "pub" / "published.yaml").read_text())
    published.pop("manifest", None)
    for metric in published["metrics"].values():
        metric.pop("values", None)
        metric["value"] = 1e308
    (tmp_path / "pub.yaml").write_text(yaml.safe_dump(published))
    done = repro500("verify", str(project / "runs" / "ref"), "--against", "pub.yaml", "--no-write", cwd=tmp_path)
    text = _no_traceback(done)
    assert done.returncode == 4 and "overflow" in text and "Warning" not in text, text
