"""``reproduce --env venv`` picks its installer where repro500 is, refuses up front a lock whose
wheels cannot install here, and says in its plan line how much it will download."""

from __future__ import annotations

import base64
import hashlib
import json
import platform
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest
from helpers.runs import repro500
from helpers.venvs import path_with, venv_with
from packaging.tags import sys_tags
from rich.console import Console

from repro500.capture import lock
from repro500.errors import InvalidInput, UsageError
from repro500.publish import rebuild

HERE = f"cp{sys.version_info.major}{sys.version_info.minor}"
FOREIGN_TAG = f"{HERE}-{HERE}-macosx_11_0_arm64"  # a wheel built for macOS on Apple silicon
FOREIGN = "repro500-mac-only"
SCRIPT = "import repro500_mac_only as p\nprint('acc', 0.9 if p.VALUE else 0)\n"


def tagged_wheel(out: Path, name: str, version: str, tag: str) -> Path:
    """A real installable wheel (PEP 427) whose WHEEL file and name carry *tag*, built offline."""
    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": f"VALUE = {version!r}\n".encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n".encode(),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n".encode(),
    }
    lines = [f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
             for n, d in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*lines, f"{info}/RECORD,,"]) + "\n").encode()
    path = out / f"{module}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for n, d in files.items():
            archive.writestr(n, d)
    return path


# ----- the installer ------------------------------------------------------------------------------
def test_uv_beside_this_interpreter_is_found_without_path(monkeypatch):
    beside = Path(sys.executable).parent / "uv"
    if not beside.is_file():
        pytest.skip(f"no uv beside {sys.executable} (the test extra installs it)")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv(rebuild.INSTALLER_ENV, raising=False)
    assert rebuild.installer() == "uv"
    assert rebuild.install_cmd(Path("/x/bin/python"), [])[0] == str(beside)


def test_the_installer_can_be_forced(monkeypatch):
    monkeypatch.setenv(rebuild.INSTALLER_ENV, "pip")
    assert rebuild.installer() == "pip"
    assert rebuild.install_cmd(Path("/x/bin/python"), [])[:3] == [sys.executable, "-m", "pip"]
    monkeypatch.setenv(rebuild.INSTALLER_ENV, "uv")
    if rebuild.uv_binary():
        assert rebuild.installer() == "uv"
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(sys, "executable", "/nonexistent/bin/python")
    monkeypatch.setitem(sys.modules, "uv", None)  # no uv package either
    with pytest.raises(InvalidInput) as err:
        rebuild.installer()
    assert err.value.exit_code == 4 and "REPRO500_INSTALLER=uv" in str(err.value)
    monkeypatch.setenv(rebuild.INSTALLER_ENV, "conda")
    with pytest.raises(UsageError):
        rebuild.installer()


def test_a_bad_installer_choice_is_a_usage_error_before_anything_is_done(tmp_path):
    done = repro500("reproduce", "nowhere", "--env", "venv", "--out", str(tmp_path / "rep"), cwd=tmp_path,
                    env={rebuild.INSTALLER_ENV: "conda"})
    assert done.returncode == 2, done.stdout + done.stderr
    message = done.stderr.strip()
    assert len(message.splitlines()) == 1 and "REPRO500_INSTALLER='conda'" in message and "uv or pip" in message
    assert "Traceback" not in done.stderr and not (tmp_path / "rep").exists()


# ----- the platform the recorded wheels fit ---------------------------------------------------------
def test_the_lock_records_the_wheel_tags_of_another_venv(tmp_path):
    venv = tmp_path / "venv"
    native = next(iter(sys_tags()))
    tagged_wheel(tmp_path, "repro500-native", "1.0", str(native))
    venv_with(venv, tmp_path, "repro500-native==1.0")
    manifest = {"facets": {"environment": {
        "python": {"version": sys.version.split()[0], "prefix": str(venv)},
        "os": {"system": "Linux", "machine": "x86_64", "libc": "glibc 2.36"},
        "distributions": [{"name": "repro500-native", "version": "1.0"}, {"name": "egg-only", "version": "2"}]}}}
    doc = lock.build(manifest, environ={})
    assert doc["wheel_tags"] == {"repro500-native": [str(native)]}  # egg-only: nothing, not judged on rebuild
    assert doc["platform"]["sys_platform"] == sys.platform and doc["platform"]["tag"]


@pytest.fixture(scope="module")
def mac_publication(tmp_path_factory) -> Path:
    """A publication of a command run by a venv holding a macOS-only wheel (installed by uv for that
    platform, for real: the WHEEL file says so, as it would on the publisher's Mac)."""
    uv = rebuild.uv_binary()
    if uv is None:
        pytest.skip("no uv here to install a wheel for another platform")
    root = tmp_path_factory.mktemp("mac")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    tagged_wheel(root, FOREIGN, "1.0", FOREIGN_TAG)
    subprocess.run([uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "--no-index",
                    "--find-links", str(root), "--python-platform", "aarch64-apple-darwin", f"{FOREIGN}==1.0"],
                   check=True, timeout=300, capture_output=True)
    proj = root / "proj"
    proj.mkdir()
    (proj / "s.py").write_text(SCRIPT)
    ran = repro500("run", "--command", "--metric", "acc=regex:acc ([0-9.]+)", "--accept", "acc>=0.5±0.05", "-n", "2",
                   "--no-tracking", "--run-id", "orig", "--", "python", "s.py", cwd=proj,
                   env=path_with(venv / "bin"), timeout=300)
    assert ran.returncode in (0, 3), ran.stdout + ran.stderr  # 3: two repeats may bound nothing
    locked = json.loads((proj / "runs" / "orig" / "environment.lock.json").read_text())
    assert locked["wheel_tags"][FOREIGN] == [FOREIGN_TAG]
    published = repro500("publish", "runs/orig", "--out", str(root / "pub"), cwd=proj, timeout=300)
    assert published.returncode == 0, published.stdout + published.stderr
    return root / "pub"


def test_wheels_for_another_platform_are_refused_before_anything_is_created(tmp_path, mac_publication):
    out = tmp_path / "rep"
    refused = repro500("reproduce", str(mac_publication), "--run-code", "--env", "venv", "--out", str(out),
                       cwd=tmp_path, timeout=600)
    assert refused.returncode == 4, refused.stdout + refused.stderr
    message = refused.stderr.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in refused.stderr
    assert f"{FOREIGN} (macosx_11_0_arm64)" in message and "--env current" in message
    assert f"this {platform.system()} {platform.machine()}" in message
    assert not (out / "env").exists()
    assert "environment: rebuilding" not in refused.stdout  # refused before the plan, the network and the venv


def test_an_old_lock_without_tags_and_a_pure_wheel_are_not_judged():
    pins = rebuild.Pins("3.11.7", ["a==1", "b==1"], None, [], [], set(), [], "d",
                        wheel_tags={"a": ["py2.py3-none-any"], "b": [str(next(iter(sys_tags())))]})
    rebuild.check_fit(pins, list(sys_tags()))  # fits: no exception
    pins.wheel_tags = {f"p{i}": ["cp311-cp311-win_amd64"] for i in range(7)}
    with pytest.raises(InvalidInput) as err:
        rebuild.check_fit(pins, list(sys_tags()))
    assert "p0 (win_amd64), p1 (win_amd64), p2 (win_amd64), p3 (win_amd64), p4 (win_amd64) and 2 more" \
        in str(err.value)


# ----- how much the plan downloads --------------------------------------------------------------------
SIX = ("six", "1.16.0")
SIX_WHEEL_BYTES = 11053  # six-1.16.0-py2.py3-none-any.whl on PyPI


def _pypi_reachable() -> str | None:
    try:
        urllib.request.urlopen("https://pypi.org/simple/six/", timeout=10).close()
    except OSError as err:
        return f"PyPI is not reachable from here ({err})"
    return None


def _lock_of(folder: Path, distributions: list[dict], index: str = lock.PYPI, wheel_tags: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"schema": lock.SCHEMA, "applies": True, "python": {"version": sys.version.split()[0]},
           "platform": {"system": "Linux", "machine": "x86_64"}, "index": {"url": index, "extra": []},
           "distributions": distributions, **({"wheel_tags": wheel_tags} if wheel_tags else {})}
    (folder / "environment.lock.json").write_text(json.dumps(doc))
    return folder


def test_the_plan_line_says_how_much_pypi_will_send(tmp_path):
    reason = _pypi_reachable()
    if reason:
        print(reason)
        pytest.skip(reason)
    name, version = SIX
    ref = _lock_of(tmp_path / "ref", [{"name": name, "version": version, "kind": "index",
                                      "requirement": f"{name}=={version}"}],
                   wheel_tags={name: ["py2.py3-none-any"]})
    pins = rebuild.read(ref, None)
    console = Console(record=True, width=400)
    rebuild.build(pins, tmp_path / "out", with_tool=False, find_links=[], console=console)
    plan = console.export_text()
    assert "1 pinned distributions from https://pypi.org/simple, up to 11.1 kB from the indexes " \
           "(what the installer's cache holds is not downloaded again)" in plan, plan
    assert rebuild.download_size(pins, list(sys_tags()), []).bytes_from_indexes == SIX_WHEEL_BYTES
    assert (tmp_path / "out" / "env" / ".repro500-built").is_file()


def test_an_unreachable_index_makes_the_size_unknown_and_find_links_is_local(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    tagged_wheel(wheels, "here-pkg", "1.0", "py3-none-any")
    entries = [{"name": n, "version": "1.0", "kind": "index", "requirement": f"{n}==1.0"}
               for n in ("here-pkg", "nowhere-pkg")]
    pins = rebuild.read(_lock_of(tmp_path / "ref", entries, index="https://127.0.0.1:9/simple"), None)
    download = rebuild.download_size(pins, list(sys_tags()), [wheels])
    assert (download.local, download.unknown, download.sized) == (1, 1, 0)
    assert download.text() == ", 1 from --find-links; download size unknown for 1 distributions"


def test_bad_wheel_tags_refuse_the_lock(tmp_path):
    ref = _lock_of(tmp_path / "ref", [{"name": "a", "version": "1", "kind": "index", "requirement": "a==1"}],
                   wheel_tags={"a": ["$(rm -rf /)"]})
    with pytest.raises(InvalidInput) as err:
        rebuild.read(ref, None)
    assert "are not wheel tags" in str(err.value)


# ----- the release hashes a publication records --------------------------------------------------
SIX_WHEEL_SHA256 = "8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254"  # PyPI's, for the wheel


def _six_lock(tmp_path: Path) -> tuple[Path, rebuild.Pins]:
    name, version = SIX
    ref = _lock_of(tmp_path / "ref", [{"name": name, "version": version, "kind": "index",
                                      "requirement": f"{name}=={version}"}])
    return ref, rebuild.read(ref, None)


def _hashes_file(path: Path, pins: rebuild.Pins, digests: list[str]) -> Path:
    path.write_text(json.dumps({"schema": rebuild.HASHES_SCHEMA, "lock_sha256": pins.digest,
                                "hashes": {SIX[0]: {"version": SIX[1], "sha256": digests}}, "not_answered": []}))
    return path


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_publish_asks_the_index_for_every_file_of_each_pinned_release_and_the_rebuild_checks_them(
        tmp_path, monkeypatch, installer):
    monkeypatch.setenv(rebuild.INSTALLER_ENV, installer)
    monkeypatch.setenv("REPRO500_CACHE_DIR", str(tmp_path / "cache"))  # asked of PyPI itself, not remembered
    reason = _pypi_reachable()
    if reason:
        print(reason)
        pytest.skip(reason)
    from repro500.publish import index

    ref, pins = _six_lock(tmp_path)
    releases = [(n, v, pins.indexes_for(own)) for n, v, own in pins.released]
    found, unanswered = index.release_hashes(releases)
    assert unanswered == [] and SIX_WHEEL_SHA256 in found["six"]["sha256"]  # the wheel's and the sdist's
    assert len(found["six"]["sha256"]) == 2
    # a second publish of the same environment within the day hears it from the cache, not the index
    monkeypatch.setattr(index.Pages, "files", lambda *a: (_ for _ in ()).throw(OSError("asked again")))
    assert index.release_hashes(releases) == (found, [])
    pins = rebuild.read(ref, None, _hashes_file(tmp_path / "hashes.json", pins, found["six"]["sha256"]))
    console = Console(record=True, width=400)
    rebuild.build(pins, tmp_path / "out", with_tool=False, find_links=[], console=console)
    assert "every file checked against the hashes recorded at publication" in console.export_text()
    written = (tmp_path / "out" / "env" / "requirements.repro500.txt").read_text()
    assert written.startswith("six==1.16.0 --hash=sha256:") and f"--hash=sha256:{SIX_WHEEL_SHA256}" in written

    # a file the index serves that is not the one recorded: refused, the venv left unfinished
    ref, pins = _six_lock(tmp_path / "again")
    pins = rebuild.read(ref, None, _hashes_file(tmp_path / "wrong.json", pins, ["0" * 64]))
    with pytest.raises(InvalidInput) as err:
        rebuild.build(pins, tmp_path / "out2", with_tool=False, find_links=[], console=Console(record=True))
    assert "does not match the hashes recorded when the publication was made" in str(err.value)
    assert "--env current" in str(err.value)
    assert not (tmp_path / "out2" / "env" / ".repro500-built").exists()


def test_release_hashes_that_do_not_fit_the_lock_are_refused(tmp_path):
    ref, pins = _six_lock(tmp_path)
    for bad in (["not-hex"], []):
        with pytest.raises(InvalidInput) as err:
            rebuild.read(ref, None, _hashes_file(tmp_path / "h.json", pins, bad))
        assert "do not fit the lock" in str(err.value)
    other = json.loads(_hashes_file(tmp_path / "h.json", pins, ["a" * 64]).read_text())
    other["lock_sha256"] = "b" * 64  # the hashes of another lock
    (tmp_path / "h.json").write_text(json.dumps(other))
    with pytest.raises(InvalidInput) as err:
        rebuild.read(ref, None, tmp_path / "h.json")
    assert "not the release hashes of this publication's lock" in str(err.value)
    # a pin the publication recorded no hash for: the rebuild installs, unchecked, and says so
    pins.hashes = {}
    assert pins.hashed_requirements() is None
