"""``repro500 diff``: ranked differences and the documented exit codes."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repro500.capture.manifest import build_manifest, seal, write_manifest
from repro500.verify.diff import (
    RELEVANT_IMPACT,
    diff_manifests,
    flatten,
    is_result_relevant,
    to_json,
)

REPRO500 = str(Path(sys.executable).parent / "repro500")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    with pytest.MonkeyPatch.context() as env:  # this module's cache only: later tests keep theirs
        env.setenv("REPRO500_CACHE_DIR", os.environ.get("REPRO500_CACHE_DIR") or str(tmp_path_factory.mktemp("cache")))
        manifest, _ = build_manifest(repo_dir=tmp_path_factory.mktemp("norepo"), seed=1)
    return manifest


def variant(manifest: dict, **changes) -> dict:
    """A re-sealed copy with ``a.b.c=value`` changes applied."""
    doc = copy.deepcopy(manifest)
    for dotted, value in changes.items():
        node = doc
        *parents, last = dotted.split("__")
        for key in parents:
            node = node[key]
        node[last] = value
    return seal(doc)


def test_identical_manifests_have_no_differences(base):
    assert diff_manifests(base, copy.deepcopy(base)) == []


def test_torch_version_ranks_above_hostname_and_only_it_is_relevant(base):
    other = variant(base, facets__environment__torch_build__version="2.13.0",
                    facets__environment__os__hostname="elsewhere", created_utc="2030-01-01T00:00:00Z")
    diffs = diff_manifests(base, other)
    keys = [(d.facet, d.key) for d in diffs]
    assert keys.index(("environment", "torch_build.version")) < keys.index(
        ("environment", "os.hostname"))
    assert diffs[0].key == "torch_build.version" and diffs[0].b == "2.13.0"
    relevant = [d for d in diffs if is_result_relevant(d)]
    assert [d.key for d in relevant] == ["torch_build.version"]
    assert "created_utc" not in {d.facet for d in diffs}  # a capture time is no difference (docs/verify.md)


def test_repro500s_own_interpreter_beside_a_commands_is_not_result_relevant(base):
    tool = {"python": {"version": "3.11.7"}, "distributions": {"torch": {"version": "2.14.1"}}}
    mine = variant(base, facets__environment__tool=tool)
    theirs = variant(base, facets__environment__tool={**tool, "distributions": {"torch": {"version": "2.13.0"}}})
    (only,) = [d for d in diff_manifests(mine, theirs) if d.facet == "environment"]
    assert only.key.startswith("tool.") and only.impact == 5 and not is_result_relevant(only)


def test_ranking_of_typical_changes(base):
    dists = copy.deepcopy(base["facets"]["environment"]["distributions"])
    for d in dists:
        if d["name"].lower() in ("numpy", "rich"):
            d["version"] = "0.0.1"
    other = variant(
        base,
        facets__environment__distributions=dists,
        facets__seeds__master_seed=2,
        facets__data={"entries": [{"path": "ds", "md5": "x.dir", "size": 1, "nfiles": 1}]},
        facets__environment__env__names=["NEW_VAR"],
    )
    impact = {(d.facet, d.key): d.impact for d in diff_manifests(base, other)}
    numpy_key = next(k for k in impact if k[1].lower().startswith("distributions.numpy"))
    rich_key = next(k for k in impact if k[1].lower().startswith("distributions.rich"))
    assert impact[numpy_key] > impact[rich_key] >= RELEVANT_IMPACT
    assert impact[("seeds", "master_seed")] >= RELEVANT_IMPACT
    assert impact[("data", "entries.ds")] >= 90  # a data entry on one side only: one row
    assert impact[("environment", "env.names")] < RELEVANT_IMPACT


def test_flatten_keys_records_by_identity():
    flat = flatten({"gpus": [{"index": 0, "name": "A"}, {"index": 1, "name": "A"}],
                    "d": [{"name": "torch", "version": "1"}], "flags": ["a", "b"], "e": {}})
    assert flat == {"gpus.0.index": 0, "gpus.0.name": "A", "gpus.1.index": 1,
                    "gpus.1.name": "A", "d.torch.name": "torch", "d.torch.version": "1",
                    "flags": ["a", "b"]}


def test_missing_facet_is_reported_once(base):
    other = seal({**base, "facets": {**base["facets"], "runtime": {"torch": {"version": "x"}}}})
    diffs = diff_manifests(base, other)
    assert [(d.facet, d.key, d.a, d.b) for d in diffs] == [("runtime", "", "<absent>", "present")]
    assert is_result_relevant(diffs[0])
    doc = to_json(diffs, "a.json", "b.json")
    assert doc["schema"] == "repro500/diff/v1" and doc["result_relevant"] is True
    json.dumps(doc)


def run_diff(*args: str):
    return subprocess.run([REPRO500, "diff", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "200"})


def test_cli_exit_codes_table_and_json(base, tmp_path):
    a = write_manifest(base, {}, tmp_path / "a")  # a run directory
    same_host = write_manifest(variant(base, facets__environment__os__hostname="h2"), {},
                               tmp_path / "b.json")
    newer = write_manifest(variant(base, facets__environment__torch_build__cuda="12.1"), {},
                           tmp_path / "c.json")
    ok = run_diff(str(tmp_path / "a"), str(same_host))
    assert ok.returncode == 0, ok.stderr
    assert "hostname" in ok.stdout and "0 result-relevant" in ok.stdout
    bad = run_diff(str(a), str(newer), "--json")
    assert bad.returncode == 1, bad.stderr
    doc = json.loads(bad.stdout)
    assert doc["result_relevant"] is True
    assert doc["differences"][0]["key"] == "torch_build.cuda"
    assert doc["differences"][0]["a"] == base["facets"]["environment"]["torch_build"]["cuda"]
    table = run_diff(str(a), str(newer))
    assert table.returncode == 1 and "torch_build.cuda" in table.stdout
    assert "1 result-relevant" in table.stdout


def test_cli_unreadable_or_tampered_input_exits_4(base, tmp_path):
    good = write_manifest(base, {}, tmp_path / "good.json")
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text(good.read_text()[:200])
    tampered = tmp_path / "tampered.json"
    doc = json.loads(good.read_text())
    doc["facets"]["seeds"]["master_seed"] = 99
    tampered.write_text(json.dumps(doc))
    for other, phrase in ((corrupt, "is not valid JSON"), (tampered, "edited after capture"),
                          (tmp_path / "absent.json", "does not exist")):
        out = run_diff(str(good), str(other))
        assert out.returncode == 4
        assert out.stderr.startswith("repro500: error: manifest") and phrase in out.stderr
        assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


def _untracked(manifest: dict, *files: tuple[str, int, str]) -> dict:
    code = copy.deepcopy(manifest["facets"]["code"])
    code["untracked"] = [{"path": p, "bytes": n, "sha256": h} for p, n, h in files]
    return variant(manifest, facets__code=code)


def test_a_record_counts_once_however_many_fields_differ(base):
    a = _untracked(base, ("train.py", 10, "a" * 64))
    added = _untracked(base, ("train.py", 10, "a" * 64), ("new.py", 3, "b" * 64))
    diffs = [d for d in diff_manifests(a, added) if d.facet == "code"]
    assert [(d.key, d.a, d.b) for d in diffs] == [
        ("untracked.new.py", "<absent>", {"path": "new.py", "bytes": 3, "sha256": "b" * 64})]
    assert is_result_relevant(diffs[0])  # new source file
    edited = _untracked(base, ("train.py", 12, "c" * 64))
    diffs = [d for d in diff_manifests(a, edited) if d.facet == "code"]
    assert [(d.key, d.a, d.b) for d in diffs] == [
        ("untracked.train.py", {"bytes": 10, "sha256": "a" * 64}, {"bytes": 12, "sha256": "c" * 64})]
    same_size = _untracked(base, ("train.py", 10, "c" * 64))  # one field: keyed by the field
    assert [d.key for d in diff_manifests(a, same_size) if d.facet == "code"] == ["untracked.train.py.sha256"]
    data = _untracked(base, ("notes.md", 1, "d" * 64))
    assert [(d.key, d.impact < RELEVANT_IMPACT) for d in diff_manifests(base, data) if d.facet == "code"] == [
        ("untracked.notes.md", True)]


def test_cli_counts_an_untracked_file_once(base, tmp_path):
    old = ("train.py", 10, "a" * 64)
    a = write_manifest(_untracked(base, old), {}, tmp_path / "a.json")
    b = write_manifest(_untracked(base, old, ("new_module.py", 3, "b" * 64)), {}, tmp_path / "b.json")
    out = run_diff(str(a), str(b))
    assert out.returncode == 1, out.stderr
    assert "1 difference(s), 1 result-relevant" in out.stdout


@pytest.mark.parametrize("field,value,phrase", [
    ("facets", "oops", "'facets' is a string, expected an object"),
    ("facets", None, "'facets' is missing or null"),
    ("facet_errors", ["x"], "'facet_errors' is a list"),
    ("artifacts", {"code.diff": "abc"}, "artifact 'code.diff' is a string"),
])
def test_cli_structurally_wrong_manifest_exits_4(base, tmp_path, field, value, phrase):
    good = write_manifest(base, {}, tmp_path / "good.json")
    doc = copy.deepcopy(base)
    doc[field] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(seal(doc)))  # digest recomputed: only the structure is wrong
    out = run_diff(str(good), str(bad))
    assert out.returncode == 4, (out.stdout, out.stderr)
    assert out.stderr.startswith("repro500: error: manifest") and "malformed" in out.stderr
    assert phrase in out.stderr and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


def test_a_record_whose_name_extends_another_keeps_its_own_row(base):
    dists = [{"name": "backports", "version": "1.0"},
             {"name": "backports.tarfile", "version": "1.0.0"}]
    a = variant(base, facets__environment__distributions=dists)
    b = variant(base, facets__environment__distributions=[
        {"name": "backports.tarfile", "version": "1.2.0"}])
    rows = {d.key: (d.a, d.b) for d in diff_manifests(a, b) if d.facet == "environment"}
    assert rows == {
        "distributions.backports": ({"name": "backports", "version": "1.0"}, "<absent>"),
        "distributions.backports.tarfile.version": ("1.0.0", "1.2.0"),
    }


def test_untracked_files_a_and_a_py_are_told_apart(base):
    a = _untracked(base, ("a", 1, "a" * 64), ("a.py", 10, "b" * 64))
    b = _untracked(base, ("a.py", 12, "c" * 64))
    diffs = {d.key: d for d in diff_manifests(a, b) if d.facet == "code"}
    assert set(diffs) == {"untracked.a", "untracked.a.py"}
    assert diffs["untracked.a"].b == "<absent>" and diffs["untracked.a"].a["path"] == "a"
    assert not is_result_relevant(diffs["untracked.a"])  # not a source file
    assert (diffs["untracked.a.py"].a, diffs["untracked.a.py"].b) == (
        {"bytes": 10, "sha256": "b" * 64}, {"bytes": 12, "sha256": "c" * 64})
    assert is_result_relevant(diffs["untracked.a.py"])  # a source file changed


def _toolchain(base: dict, **versions: str | None) -> dict:
    """``base`` with tool (``gcc=...``) or CUDA toolkit (``cuda=...``) versions changed."""
    chain = copy.deepcopy(base["facets"].get("toolchain") or {})
    chain.setdefault("cuda_toolkit", {"home": "/usr/local/cuda", "version": "13.0.88"})
    chain.setdefault("tools", [])
    for name, version in versions.items():
        if name == "cuda":
            chain["cuda_toolkit"]["version"] = version
            continue
        tool = next((t for t in chain["tools"] if t["name"] == name), None)
        if tool is None:
            tool = {"name": name, "command": name, "executable": f"/usr/bin/{name}"}
            chain["tools"].append(tool)
        tool["version"], tool["version_line"] = version, f"{name} (Vendor) {version}"
    return variant(base, facets__toolchain=chain)


def test_toolchain_differences_rank_by_what_they_compile(base):
    a = _toolchain(base, cuda="12.4.131", cxx="12.2.0", gcc="12.2.0", cmake="3.25.1")
    b = _toolchain(base, cuda="13.0.88", cxx="13.1.0", gcc="13.1.0", cmake="3.28.0")
    impact = {d.key: d.impact for d in diff_manifests(a, b) if d.facet == "toolchain"}
    assert impact["cuda_toolkit.version"] >= 80  # nvcc builds the custom CUDA operators
    assert impact["tools.cxx"] >= RELEVANT_IMPACT  # the compiler the CPU operators use
    assert RELEVANT_IMPACT > impact["tools.gcc"] >= 40  # medium: matters if it builds code
    assert impact["tools.cmake"] < impact["tools.gcc"]
    assert impact["cuda_toolkit.version"] > impact["tools.cxx"] > impact["tools.gcc"]
    rows = [d.key for d in diff_manifests(a, b) if d.facet == "toolchain"]
    assert len(rows) == 4  # one row per tool, not one per field


def test_a_manifest_from_before_the_toolchain_facet_is_not_a_relevant_difference(base):
    old = seal({**base, "facets": {k: v for k, v in base["facets"].items() if k != "toolchain"}})
    diffs = diff_manifests(old, base)
    assert [(d.facet, d.a, d.b) for d in diffs] == [("toolchain", "<absent>", "present")]
    assert not is_result_relevant(diffs[0])


def test_the_rank_plan_ranks_layout_and_gpu_high_and_host_names_low(base):
    def planned(host: str, device: str, gpu: str | None) -> dict:
        doc = copy.deepcopy(base)
        doc["facets"]["distributed"] = {"engine": "ddp", "world_size": 2, "rank_plan": {
            str(r): {"node_rank": 0, "local_rank": r, "host": host, "device": f"{device}{r}", "gpu": gpu}
            for r in (0, 1)}}
        return seal(doc)

    a = planned("node-a", "cuda:", "NVIDIA H100")
    hosts_only = diff_manifests(a, planned("node-b", "cuda:", "NVIDIA H100"))
    assert hosts_only and not any(is_result_relevant(d) for d in hosts_only)
    gpus = diff_manifests(a, planned("node-a", "cuda:", "NVIDIA A100"))
    assert [d.key for d in gpus] == ["rank_plan.0.gpu", "rank_plan.1.gpu"]
    assert all(d.impact >= 95 for d in gpus)
    layout = diff_manifests(a, planned("node-a", "cpu", None))
    assert any(is_result_relevant(d) for d in layout)


def _hardware_with(manifest: dict, numa_bytes: int | None = None, total_bytes: int | None = None) -> dict:
    doc = copy.deepcopy(manifest)
    hardware = doc["facets"]["hardware"]
    hardware["numa"] = [{"node": 0, "cpus": "0-7", "memory_bytes": 64 * 2**30, "distances": [10]}]
    hardware.setdefault("memory", {})["total_bytes"] = 64 * 2**30
    if numa_bytes is not None:
        hardware["numa"][0]["memory_bytes"] = numa_bytes
    if total_bytes is not None:
        hardware["memory"]["total_bytes"] = total_bytes
    return seal(doc)


def test_memory_the_kernel_counts_differently_on_one_machine_is_no_difference(base):
    a = _hardware_with(base)
    drift = _hardware_with(base, numa_bytes=64 * 2**30 - 300 * 2**20, total_bytes=64 * 2**30 - 200 * 2**20)
    assert diff_manifests(a, drift) == []
    # a node's memory is what the kernel reports, no difference: the topology is the CPUs and distances;
    # the machine's total beyond the drift is shown, low
    other = _hardware_with(base, numa_bytes=32 * 2**30, total_bytes=32 * 2**30)
    rows = {d.key: d for d in diff_manifests(a, other)}
    assert "numa.0.memory_bytes" not in rows
    assert rows["memory.total_bytes"].impact == 20
    moved = variant(a, facets__hardware__numa=[{"node": 0, "cpus": "0-3", "memory_bytes": 64 * 2**30,
                                                "distances": [10]}])
    assert [d.key for d in diff_manifests(a, moved)] == ["numa.0.cpus"]


def test_an_empty_list_against_nothing_recorded_is_no_row(base):
    none = variant(base, facets__data={"entries": []})
    one = variant(base, facets__data={"entries": [{"path": "train.h5", "md5": "ab" * 16, "size": 3}]})
    rows = diff_manifests(none, one)
    assert [(d.key, d.a) for d in rows] == [("entries.train.h5", "<absent>")]
    assert is_result_relevant(rows[0])
    older = variant(base, facets__data={})  # a manifest that did not record the list at all
    assert diff_manifests(none, older) == []
