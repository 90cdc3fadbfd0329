"""``repro500 capture`` as users run it: a real git repo, real files, a real subprocess."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import fixtures

from repro500.capture import registry
from repro500.capture.manifest import SCHEMA, build_manifest, load_manifest, seal, write_manifest
from repro500.digest import canonical_digest
from repro500.errors import InvalidInput

REPRO500 = str(Path(sys.executable).parent / "repro500")

# Fake credentials planted where a careless tool would pick them up.
PLANTED = {
    "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "GITHUB_TOKEN": "ghp_" + "Zy9Xw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0FeDcBa",
    "HF_TOKEN": "hf_" + "QwErTyUiOpAsDfGhJkLzXcVbNm123456",
    "MLFLOW_TRACKING_PASSWORD": "correct-horse-battery-staple",
    "TORCH_DIST_INIT": "tcp://bob:HunterPw2Secret@10.0.0.1:29500",  # allowlisted prefix
    # Allowlisted names (values are recorded) holding a credential: caught by content only.
    "TORCH_EXTRA": "ghp_" + "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0UvWxYz",
    "SLURM_JOB_COMMENT": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlMTIzNDU2Nzg",
}
REMOTE_PASSWORD = "Sup3rS3cretRemotePw"
DIFF_SECRET = "sk-proj-Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0Fe"
PEM_BODY = "MIIEowIBAAKCAQEAq7BFUpkGp3+LQmlQYx2eqzDV+xWZPlantedKeyLine0001"
PEM_BLOCK = f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n-----END RSA PRIVATE KEY-----\n"
SECRET_STRINGS = [*PLANTED.values(), "HunterPw2Secret", REMOTE_PASSWORD, DIFF_SECRET, PEM_BODY]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=Test", "-c", "user.email=t@example.com",
         "-c", "commit.gpgsign=false", *args],
        cwd=repo, check=True, capture_output=True, text=True,
    ).stdout


_own_cache = fixtures.own_cache


@pytest.fixture
def dirty_repo(tmp_path):
    """A repo with one commit, a modified tracked file and an untracked file."""
    repo = tmp_path / "proj"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "train.py").write_text("LR = 0.1\n")
    (repo / "config.py").write_text("BATCH = 32\n")
    (repo / ".gitignore").write_text("ignored.log\nout/\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "initial")
    git(repo, "remote", "add", "origin",
        f"https://alice:{REMOTE_PASSWORD}@github.com/org/proj.git")
    (repo / "train.py").write_text("LR = 0.2  # tuned\n")
    (repo / "config.py").write_text(f'BATCH = 32\nOPENAI_API_KEY = "{DIFF_SECRET}"\n')
    (repo / "new_module.py").write_text("def f():\n    return 1\n")
    (repo / "ignored.log").write_text("noise\n")
    return repo


def run_cli(args: list[str], cwd: Path, extra_env: dict[str, str] | None = None):
    env = {**os.environ, **(extra_env or {})}
    return subprocess.run([REPRO500, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_capture_records_dirty_repo_and_never_writes_a_secret(dirty_repo, tmp_path):
    data = dirty_repo / "out" / "data.bin"  # ignored directory, digested with --data
    data.parent.mkdir()
    data.write_bytes(b"\x00\x01" * 1000)
    out = run_cli(["capture", "-o", "out/m/manifest.json", "--data", "out/data.bin", "--json",
                   "--seed", "7", "--repeats", "2"], dirty_repo, PLANTED)
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)
    manifest = load_manifest(dirty_repo / "out" / "m")  # digest checked
    assert printed == manifest
    code = manifest["facets"]["code"]
    assert code["in_repo"] and code["dirty"] and code["branch"] == "main"
    assert code["commit"] == git(dirty_repo, "rev-parse", "HEAD").strip()
    assert code["remotes"] == [{"name": "origin",
                                "url": "https://[REDACTED]@github.com/org/proj.git"}]
    assert [u["path"] for u in code["untracked"]] == ["new_module.py"]  # ignored.log is not
    assert code["untracked"][0]["sha256"] == hashlib.sha256(
        (dirty_repo / "new_module.py").read_bytes()).hexdigest()
    diff_file = dirty_repo / "out" / "m" / "code.diff"
    diff = diff_file.read_bytes()
    assert code["diff"]["sha256"] == hashlib.sha256(diff).hexdigest()
    assert manifest["artifacts"]["code.diff"]["sha256"] == code["diff"]["sha256"]
    assert b"+LR = 0.2  # tuned" in diff and code["diff"]["redactions"] == 1
    # The recorded diff is a real patch: it applies to the commit (secret line redacted).
    git(dirty_repo, "stash", "-q")
    git(dirty_repo, "apply", "--check", str(diff_file))
    git(dirty_repo, "stash", "pop", "-q")
    assert manifest["facets"]["data"]["entries"][0]["md5"] == hashlib.md5(
        data.read_bytes()).hexdigest()
    assert len(manifest["facets"]["seeds"]["plan"]) == 2
    env = manifest["facets"]["environment"]["env"]
    assert "GITHUB_TOKEN" in env["names"] and "GITHUB_TOKEN" not in env["values"]
    assert env["values"]["TORCH_DIST_INIT"] == "tcp://[REDACTED]@10.0.0.1:29500"
    assert env["values"]["TORCH_EXTRA"] == env["values"]["SLURM_JOB_COMMENT"] == "[REDACTED]"
    assert manifest["facet_errors"] == {}
    written = [p for p in (dirty_repo / "out" / "m").rglob("*") if p.is_file()]
    assert {p.name for p in written} == {"manifest.json", "code.diff"}
    _assert_no_secret(tmp_path / "cache", dirty_repo / "out", texts=(out.stdout, out.stderr))


def _assert_no_secret(*roots: Path, texts: tuple[str, ...] = ()) -> None:
    """Grep every file under ``roots`` and every printed text for every planted secret."""
    files = [p for root in roots for p in root.rglob("*") if p.is_file()]
    assert files
    for name, blob in [(str(p), p.read_bytes()) for p in files] + [("output", t.encode()) for t in texts]:
        for secret in SECRET_STRINGS:
            assert secret.encode() not in blob, f"{secret} leaked into {name}"


def test_a_private_key_in_the_uncommitted_diff_never_reaches_a_file(dirty_repo, tmp_path):
    (dirty_repo / "train.py").write_text(f'LR = 0.2\nKEY = """\n{PEM_BLOCK}"""\n')
    out = run_cli(["capture", "-o", "out/pem", "--json"], dirty_repo, PLANTED)
    assert out.returncode == 0, out.stderr
    manifest = load_manifest(dirty_repo / "out" / "pem", check_artifacts=True)
    diff = (dirty_repo / "out" / "pem" / "code.diff").read_bytes()
    assert b"+LR = 0.2" in diff and b"[REDACTED]" in diff
    assert manifest["facets"]["code"]["diff"]["redactions"] >= 2  # the key and the API key
    _assert_no_secret(tmp_path / "cache", dirty_repo / "out", texts=(out.stdout, out.stderr))


def test_capture_summary_and_missing_data_path(dirty_repo):
    out = run_cli(["capture"], dirty_repo)
    assert out.returncode == 0, out.stderr
    for facet in ("code", "environment", "seeds", "data", "hardware"):
        assert facet in out.stdout
    assert "dirty" in out.stdout and "GPUs:" in out.stdout
    assert not (dirty_repo / "manifest.json").exists()  # without -o nothing is written

    bad = run_cli(["capture", "-o", "m.json", "--data", "no/such/dir"], dirty_repo)
    assert bad.returncode == 4
    assert bad.stderr.strip() == ("repro500: error: data path 'no/such/dir' does not exist: "
                                  "check the path")
    assert "Traceback" not in bad.stderr and not (dirty_repo / "m.json").exists()
    usage = run_cli(["capture", "--seed", "1", "--repeats", "0"], dirty_repo)
    assert usage.returncode == 2 and "--repeats" in usage.stderr and "Traceback" not in usage.stderr


def _one_line_exit_4(out, *needles: str) -> None:
    assert out.returncode == 4, (out.stdout, out.stderr)
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("repro500: error: "), out.stderr
    assert "Traceback" not in out.stderr
    for needle in needles:
        assert needle in out.stderr, out.stderr


def test_unwritable_output_is_one_line_exit_4(tmp_path):
    (tmp_path / "a_file").write_text("not a directory\n")
    for target in ("/dev/null/m.json", str(tmp_path / "a_file" / "m.json"), str(tmp_path / "a_file" / "run")):
        out = run_cli(["capture", "-o", target], tmp_path)
        _one_line_exit_4(out, "cannot write the manifest to", "choose a writable directory")
    assert (tmp_path / "a_file").read_text() == "not a directory\n"


def test_repo_that_does_not_exist_is_one_line_exit_4(tmp_path):
    out = run_cli(["capture", "--repo", str(tmp_path / "does" / "not" / "exist")], tmp_path)
    _one_line_exit_4(out, "--repo", "does not exist")
    with pytest.raises(InvalidInput, match="does not exist"):
        build_manifest(repo_dir=tmp_path / "gone")


def test_broken_link_in_data_directory_is_one_line_exit_4(tmp_path):
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "ok.bin").write_bytes(b"1")
    (ds / "dangling").symlink_to(tmp_path / "gone")
    out = run_cli(["capture", "--data", str(ds)], tmp_path)
    assert out.returncode == 4
    assert out.stderr.count("\n") == 1 and "broken symbolic link" in out.stderr


def test_outside_a_repo_is_recorded_not_an_error(tmp_path):
    manifest, artifacts = build_manifest(repo_dir=tmp_path)
    assert manifest["facets"]["code"]["in_repo"] is False
    assert "not inside a git work tree" in manifest["facets"]["code"]["reason"]
    assert artifacts == {}


def test_code_facet_in_a_subdirectory_a_detached_head_and_a_repository_without_commits(tmp_path):
    from repro500.capture.code import describe_repo

    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q", "-b", "trunk")
    (empty / "a.py").write_text("x = 1\n")
    facet, diff = describe_repo(empty)
    assert facet["in_repo"] and facet["commit"] is None and facet["commit_time"] is None
    assert facet["branch"] == "trunk" and not facet["detached"] and facet["remotes"] == []
    assert [u["path"] for u in facet["untracked"]] == ["a.py"] and diff == b""

    git(empty, "add", ".")
    git(empty, "commit", "-q", "-m", "one")
    (empty / "sub").mkdir()
    head = git(empty, "rev-parse", "HEAD").strip()
    git(empty, "checkout", "-q", "--detach", head)
    facet, _ = describe_repo(empty / "sub")  # asked from below the root, as a run in a subdirectory is
    when = git(empty, "show", "-s", "--format=%cI", "HEAD").strip()
    assert facet["root"] == str(empty) and facet["commit"] == head and facet["commit_time"] == when
    assert facet["detached"] and facet["branch"] is None and not facet["dirty"]
    assert facet["untracked"] == []  # an empty directory is nothing git would track


def test_a_failing_facet_is_recorded_and_the_capture_goes_on(monkeypatch, tmp_path):
    def broken(ctx):
        raise RuntimeError("sensor offline; see https://u:LeakyPw99@internal.example/x")

    monkeypatch.setitem(registry._REGISTRY, "thermals", registry.Facet("thermals", broken, True))
    manifest, _ = build_manifest(repo_dir=tmp_path)
    assert "thermals" not in manifest["facets"]
    assert manifest["facet_errors"]["thermals"].startswith("RuntimeError: sensor offline")
    assert "LeakyPw99" not in manifest["facet_errors"]["thermals"]
    assert {"code", "environment", "seeds", "data", "hardware"} <= set(manifest["facets"])


def test_manifest_shape_digest_and_round_trip(tmp_path):
    manifest, artifacts = build_manifest(
        repo_dir=tmp_path, extra_facets={"distributed": {"world_size": 2, "ranks": (0, 1)}})
    assert manifest["schema"] == SCHEMA and manifest["tool"]["name"] == "repro500"
    assert manifest["created_utc"].endswith("Z")
    body = {k: v for k, v in manifest.items() if k != "digest"}
    assert manifest["digest"] == {"algorithm": "sha256", "canonicalization": "repro500-c14n/v1",
                                  "value": canonical_digest(body)}
    path = write_manifest(manifest, {"extra.txt": b"hello\n"}, tmp_path / "run")
    assert path == tmp_path / "run" / "manifest.json"
    loaded = load_manifest(tmp_path / "run")
    assert loaded == manifest and loaded["facets"]["distributed"]["ranks"] == [0, 1]
    assert (tmp_path / "run" / "extra.txt").read_bytes() == b"hello\n"
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("content,message", [
    ('{"schema": "repro500/manifest/v1", "facets": {', "is not valid JSON"),
    ('{"schema": "something/else", "facets": {}}', "is not a repro500 manifest"),
    ("[1, 2]", "is not a repro500 manifest"),
    ('{"schema": "repro500/manifest/v1", "facets": {}}', "has no digest"),
])
def test_corrupt_manifests_are_invalid_input(tmp_path, content, message):
    bad = tmp_path / "manifest.json"
    bad.write_text(content)
    with pytest.raises(InvalidInput, match=message):
        load_manifest(bad)
    with pytest.raises(InvalidInput, match="does not exist"):
        load_manifest(tmp_path / "nope.json")
    (tmp_path / "run").mkdir()
    with pytest.raises(InvalidInput, match="has no manifest.json"):
        load_manifest(tmp_path / "run")


def test_an_edited_manifest_is_detected(tmp_path):
    manifest, _ = build_manifest(repo_dir=tmp_path)
    path = write_manifest(manifest, {}, tmp_path / "m.json")
    doc = json.loads(path.read_text())
    doc["facets"]["environment"]["torch_build"]["version"] = "9.9.9"
    path.write_text(json.dumps(doc))
    with pytest.raises(InvalidInput, match="edited after capture"):
        load_manifest(path)
    path.write_text(json.dumps(seal(doc)))  # re-sealed by its author: consistent again
    assert load_manifest(path)["facets"]["environment"]["torch_build"]["version"] == "9.9.9"


def test_environment_reads_torch_build_without_importing_torch(tmp_path):
    code = ("import sys, json; from repro500.capture.manifest import build_manifest;"
            f"m, _ = build_manifest(repo_dir={str(tmp_path)!r});"
            "print(json.dumps([m['facets']['environment']['torch_build'], 'torch' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    build, imported = json.loads(out.stdout)
    assert imported is False
    import importlib.metadata

    assert build["version"].split("+")[0] == importlib.metadata.version("torch")
    assert build["cuda"] and build["cudnn"] and build["nccl"]


def test_runtime_state_records_determinism_flags():
    import torch

    from repro500.capture.env import runtime_state

    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        state = runtime_state()
    finally:
        torch.use_deterministic_algorithms(before)
    det = state["determinism"]
    assert det["deterministic_algorithms"] is True and det["deterministic_warn_only"] is True
    assert det["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    assert state["torch"]["version"] == torch.__version__
    assert state["torch"]["num_threads"] == torch.get_num_threads()
    assert "PyTorch built with" in state["torch"]["config"]
    json.dumps(state)  # JSON-able as it is


# --- the environment facet ----------------------------------------------------------------

def test_environment_records_python_os_and_libc_as_the_system_reports_them(tmp_path):
    out = run_cli(["capture", "--json", "--repo", str(tmp_path)], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    env = json.loads(out.stdout)["facets"]["environment"]
    py, osi = env["python"], env["os"]
    # the console script runs the interpreter this test runs under
    assert py["version"] == "{}.{}.{}".format(*sys.version_info[:3])
    assert py["implementation"].lower() == sys.implementation.name
    assert Path(py["executable"]).resolve() == Path(sys.executable).resolve()
    assert py["virtualenv"] is (sys.prefix != sys.base_prefix)
    uname = os.uname()
    assert (osi["system"], osi["kernel"], osi["machine"]) == (
        uname.sysname, uname.release, uname.machine)
    if hasattr(os, "confstr") and "CS_GNU_LIBC_VERSION" in os.confstr_names:
        assert osi["libc"] == os.confstr("CS_GNU_LIBC_VERSION")  # e.g. "glibc 2.36"
    release = Path("/etc/os-release")
    if release.is_file():
        ids = dict(line.split("=", 1) for line in release.read_text().splitlines() if "=" in line)
        assert osi["distribution"]["ID"] == ids["ID"].strip('"')


def _repro500_source(distributions: list[dict]) -> dict | None:
    return next(d for d in distributions if d["name"] == "repro500").get("source")


def _editable_root() -> Path | None:
    """The project directory when repro500 is installed editable (as `make` installs it)."""
    from importlib import metadata

    # every copy: `python -m pytest` from the project finds the build's egg-info first, which
    # has no direct_url.json; the installer's .dist-info in the venv has it
    raws = [d.read_text("direct_url.json") for d in metadata.distributions()
            if (d.metadata["Name"] or "").lower() == "repro500"]
    info = next((json.loads(raw) for raw in raws if raw), {})
    if not info.get("dir_info", {}).get("editable"):
        return None
    return Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("where", ["console script elsewhere", "python -c in the project"])
def test_repro500_installed_editable_is_recorded_as_a_local_path(tmp_path, where):
    root = _editable_root()
    if root is None:
        pytest.skip("repro500 is not installed editable here")
    if where == "console script elsewhere":
        out = run_cli(["capture", "--json", "--repo", str(tmp_path)], cwd=tmp_path)
    else:  # the project directory is on sys.path, with the egg-info a build left there
        code = ("import json; from repro500.capture.env import distributions;"
                "print(json.dumps({'distributions': distributions()}))")
        out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                             text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    dists = doc["facets"]["environment"]["distributions"] if "facets" in doc else doc["distributions"]
    assert _repro500_source(dists) == {"kind": "local", "url": root.as_uri(), "editable": True}


def _fake_dist(site: Path, name: str, version: str, direct_url: dict | None,
               layout: str = "dist-info") -> None:
    meta = site / (f"{name}-{version}.dist-info" if layout == "dist-info" else f"{name}.egg-info")
    meta.mkdir(parents=True)
    (meta / ("METADATA" if layout == "dist-info" else "PKG-INFO")).write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if direct_url is not None:
        (meta / "direct_url.json").write_text(json.dumps(direct_url))


def test_vcs_local_and_archive_installs_are_marked_and_index_installs_are_not(tmp_path,
                                                                            monkeypatch):
    from repro500.capture.env import distributions

    site = tmp_path / "site"
    commit = "0123456789abcdef0123456789abcdef01234567"
    _fake_dist(site, "fromgit", "0.3.dev1", {
        "url": f"https://alice:{REMOTE_PASSWORD}@github.com/org/fromgit.git",
        "vcs_info": {"vcs": "git", "commit_id": commit, "requested_revision": "main"}})
    _fake_dist(site, "fromdir", "1.0", {"url": "file:///src/fromdir", "dir_info": {}})
    _fake_dist(site, "fromwheel", "2.0", {"url": "file:///w/fromwheel-2.0-py3-none-any.whl",
                                          "archive_info": {"hashes": {"sha256": "ab"}}})
    _fake_dist(site, "fromindex", "3.0", None)
    monkeypatch.syspath_prepend(str(site))
    by_name = {d["name"]: d for d in distributions()}
    vcs = by_name["fromgit"]["source"]
    assert (vcs["kind"], vcs["vcs"], vcs["commit"], vcs["requested_revision"]) == (
        "vcs", "git", commit, "main")
    assert REMOTE_PASSWORD not in vcs["url"] and vcs["url"].endswith("@github.com/org/fromgit.git")
    assert by_name["fromdir"]["source"] == {"kind": "local", "url": "file:///src/fromdir",
                                            "editable": False}
    assert by_name["fromwheel"]["source"]["kind"] == "archive"
    assert by_name["fromindex"] == {"name": "fromindex", "version": "3.0"}


def test_a_shadowing_egg_info_keeps_the_installers_source_only_for_the_same_version(
        tmp_path, monkeypatch):
    from repro500.capture.env import distributions

    installed, shadow = tmp_path / "site", tmp_path / "project"
    _fake_dist(installed, "mypkg", "1.0", {"url": "file:///src/mypkg",
                                           "dir_info": {"editable": True}})
    _fake_dist(installed, "otherpkg", "1.0", {"url": "file:///src/otherpkg", "dir_info": {}})
    _fake_dist(shadow, "mypkg", "1.0", None, layout="egg-info")
    _fake_dist(shadow, "otherpkg", "0.9", None, layout="egg-info")  # another install wins
    monkeypatch.syspath_prepend(str(installed))
    monkeypatch.syspath_prepend(str(shadow))  # first on sys.path, as a project directory is
    by_name = {d["name"]: d for d in distributions()}
    assert by_name["mypkg"]["source"] == {"kind": "local", "url": "file:///src/mypkg",
                                          "editable": True}
    assert by_name["otherpkg"] == {"name": "otherpkg", "version": "0.9"}


# --- the toolchain facet ------------------------------------------------------------------

def _script(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


@pytest.fixture
def fake_tools(tmp_path, monkeypatch):
    """A PATH holding only fake tools, and a fake CUDA toolkit as CUDA_HOME."""
    import shutil

    sleep = shutil.which("sleep")
    bin_dir, cuda = tmp_path / "bin", tmp_path / "cuda"
    bin_dir.mkdir()
    (cuda / "bin").mkdir(parents=True)
    (cuda / "include").mkdir()
    _script(bin_dir / "gcc", f"{sleep} 0.6; echo 'gcc (Fake 9.9.1-3) 9.9.1'; echo 'Copyright'")
    _script(bin_dir / "g++", f"{sleep} 0.6; echo 'g++ (Fake 9.9.1-3) 9.9.1'")
    _script(bin_dir / "cmake", f"{sleep} 0.6; echo 'cmake version 3.99.2'")
    _script(bin_dir / "clang", f"exec {sleep} 30")  # hangs: killed at the deadline
    _script(cuda / "bin" / "nvcc", f"touch {tmp_path / 'nvcc-ran'}\n"
            "echo 'Cuda compilation tools, release 12.4, V12.4.131'")
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("CUDA_HOME", str(cuda))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("CXX", "g++")
    return tmp_path


def test_toolchain_probes_concurrently_and_a_missing_or_hung_tool_is_no_error(fake_tools):
    import time

    from repro500.capture.toolchain import toolchain

    start = time.monotonic()
    facts = toolchain(deadline_s=1.5)
    assert time.monotonic() - start < 6  # the hung clang (30 s) was killed at the deadline
    tools = {t["name"]: t for t in facts["tools"]}
    # three probes of 0.6 s each all answered within one 1.5 s deadline: they ran at once
    assert (tools["gcc"]["version"], tools["g++"]["version"], tools["cmake"]["version"]) == (
        "9.9.1", "9.9.1", "3.99.2")
    assert tools["gcc"]["version_line"] == "gcc (Fake 9.9.1-3) 9.9.1"
    assert tools["cxx"]["command"] == "g++" and tools["cxx"]["version"] == "9.9.1"
    assert tools["clang"]["version"] is None and "no answer" in tools["clang"]["problem"]
    cuda = facts["cuda_toolkit"]
    assert (cuda["version"], cuda["release"], cuda["version_from"]) == (
        "12.4.131", "12.4", "nvcc --version")  # no version file: nvcc is asked


def test_toolchain_reads_the_cuda_version_file_instead_of_running_nvcc(fake_tools, monkeypatch):
    from repro500.capture.toolchain import toolchain

    (fake_tools / "cuda" / "version.json").write_text(json.dumps({
        "cuda": {"name": "CUDA SDK", "version": "12.4.1"},
        "cuda_nvcc": {"name": "CUDA NVCC", "version": "12.4.131"}}))
    monkeypatch.setenv("PATH", str(fake_tools / "nowhere"))  # no tool at all
    facts = toolchain(deadline_s=1.5)
    cuda = facts["cuda_toolkit"]
    assert (cuda["home"], cuda["version"], cuda["release"], cuda["version_from"]) == (
        str(fake_tools / "cuda"), "12.4.131", "12.4.1", "version.json")
    assert not (fake_tools / "nvcc-ran").exists()
    assert all(t["executable"] is None and t["version"] is None and "problem" not in t
               for t in facts["tools"])
    (fake_tools / "cuda" / "version.json").unlink()
    (fake_tools / "cuda" / "version.txt").write_text("CUDA Version 10.2.89\n")
    assert toolchain()["cuda_toolkit"]["version"] == "10.2.89"
    assert not (fake_tools / "nvcc-ran").exists()


def test_no_cuda_toolkit_is_recorded_as_absent(monkeypatch):
    import repro500.capture.toolchain
    from repro500.capture.toolchain import toolchain

    monkeypatch.setattr(repro500.capture.toolchain, "find_cuda_home", lambda: None)
    cuda = toolchain()["cuda_toolkit"]
    assert cuda["home"] is None and cuda["version"] is None and "problem" not in cuda


def test_toolchain_facet_matches_the_real_compilers(tmp_path):
    import shutil

    out = run_cli(["capture", "--json", "--repo", str(tmp_path)], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    manifest = json.loads(out.stdout)
    assert "toolchain" not in manifest["facet_errors"]
    tools = {t["name"]: t for t in manifest["facets"]["toolchain"]["tools"]}
    assert set(tools) == {"cxx", "gcc", "g++", "clang", "cmake"}
    for name, tool in tools.items():
        assert (tool["executable"] is None) == (shutil.which(tool["command"]) is None), name
    if tools["gcc"]["executable"]:  # gcc's own short form, a second route to the same fact
        dumped = subprocess.run(["gcc", "-dumpfullversion"], capture_output=True, text=True)
        assert tools["gcc"]["version"] == dumped.stdout.strip()
    cuda = manifest["facets"]["toolchain"]["cuda_toolkit"]
    if cuda["home"]:
        nvcc = subprocess.run([cuda["nvcc"], "--version"], capture_output=True, text=True)
        assert f"V{cuda['version']}" in nvcc.stdout
