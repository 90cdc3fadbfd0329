"""One comparison of two runs: each kind of change is named first, and the same way, by verify
(its Provenance section and where the runs part), diff, history and locate's cause; documented
non-differences are no differences; the words follow the impact.

One real reference run (tiny recipe, one epoch, two same-seed repeats) is made once for the module;
each rerun is a copy of it with one thing changed in its records, sealed again.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from helpers.runs import repro500, write_recipe

from repro500.capture.manifest import seal
from repro500.locate.plan import plan_locate
from repro500.rundir import sums
from repro500.verify import compare, diff, divergence, trend
from repro500.verify.rundir import load_run
from repro500.verify.verdict import verify_run


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("compare")
    write_recipe(cwd / "tiny.yaml", fixed__epochs=1, fixed__dataset__params__train_samples=128,
                 fixed__dataset__params__eval_samples=64)
    done = repro500("run", "tiny.yaml", "-n", "2", "--same-seed", "--deterministic", "--no-tracking", "--out", "runs",
                    "--run-id", "a-ref", cwd=cwd, env={"REPRO500_CACHE_DIR": str(cwd / "cache")})
    assert done.returncode in (0, 1, 3), done.stderr
    return cwd / "runs" / "a-ref"


def _json(path: Path, fn) -> None:
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc, indent=2))


def _at(doc: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        doc = doc.setdefault(key, {})
    doc[last] = value


def plant(reference: Path, where: Path, name: str, *, recipe: dict | None = None, manifest: dict | None = None,
          repeats: dict | None = None, loss_from: int | None = None) -> Path:
    """A copy of *reference* named *name* under *where*, with dotted changes to its recipe,
    manifest and repeat summaries (and every step's loss from *loss_from* on, nudged), sealed again."""
    run = where / name
    shutil.copytree(reference, run)
    (run / "chain.jsonl").unlink(missing_ok=True)  # the copy's records are edited: its chain would say so
    _json(run / "run.json", lambda d: d.update(run_id=name))
    if recipe:
        doc = yaml.safe_load((run / "recipe.yaml").read_text())
        for key, value in recipe.items():
            _at(doc, key, value)
        (run / "recipe.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    if manifest:
        doc = json.loads((run / "manifest.json").read_text())
        for key, value in manifest.items():
            _at(doc, key, value)
        (run / "manifest.json").write_text(json.dumps(seal(doc), indent=2))
    for k in (0, 1):
        for key, value in (repeats or {}).items():
            _json(run / "repeats" / str(k) / "summary.json", lambda d, key=key, value=value: _at(d, key, value))
        if loss_from is not None:
            path = run / "repeats" / str(k) / "metrics.jsonl"
            lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
            for r in lines:
                if r.get("kind") == "step" and r.get("step", 0) >= loss_from:
                    r["loss"] = r["loss"] * (1 + 1e-6 * r["step"])
            path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    sums.write_sums(run)
    return run


def named_first(ref: Path, rerun: Path) -> dict[str, object]:
    """What each command names first, and its counts."""
    verdict = verify_run(rerun, against=ref, across_benchmarks=True)  # epochs, evaluator: fixed keys
    prov = verdict.provenance
    top = [f"{r['facet']}.{r['key']}" if r["key"] else r["facet"] for r in prov.top]
    parted = verdict.divergence.first if verdict.divergence is not None else None
    from repro500.cli import cli

    out = CliRunner().invoke(cli, ["diff", str(ref), str(rerun), "--json"])
    rows = json.loads(out.output)["differences"]
    history = trend.build(str(ref.parent), "accuracy", 0.05, None)
    changes = history.rows[-1].changes
    return {"verify": top[0] if top else None, "verify_relevant": prov.result_relevant,
            "diff": (f"{rows[0]['facet']}.{rows[0]['key']}" if rows else None), "diff_exit": out.exit_code,
            "diff_relevant": sum(r["result_relevant"] for r in rows),
            "history": changes[0]["key"] if changes else None,
            "divergence": parted.causes[0]["key"] if parted is not None and parted.causes else None,
            "explanation": parted.explanation if parted is not None else None}


def _pair(reference: Path, tmp_path: Path, name: str, **changes) -> tuple[Path, Path]:
    where = tmp_path / "runs"
    where.mkdir()
    base = dict(changes.pop("base", {}))
    ref = plant(reference, where, "a-ref", **base) if base else shutil.copytree(reference, where / "a-ref")
    return ref, plant(ref, where, f"b-{name}", **changes)


def _all_name(got: dict, key: str, parts: bool = True) -> None:
    assert got["verify"] == key, got
    assert got["diff"] == key and got["diff_exit"] == 1, got
    assert got["history"] == key, got
    if parts:
        assert got["divergence"] == key and divergence.NO_CAUSE not in got["explanation"], got


DATA = "data.entries.data/train.h5"


@pytest.mark.parametrize(("kind", "changes", "key"), [
    ("learning-rate", {"recipe": {"mutable.optimizer.lr": 0.1001, "overrides": {"mutable.optimizer.lr": 0.1001}}},
     "recipe.mutable.optimizer.lr"),
    ("batch-size", {"recipe": {"mutable.batch_size": 16}}, "recipe.mutable.batch_size"),
    ("epochs", {"recipe": {"fixed.epochs": 2}}, "recipe.fixed.epochs"),
    ("evaluator", {"recipe": {"fixed.evaluate": "mylab.nets:Balanced"}}, "recipe.fixed.evaluate"),
    ("model-code", {"base": {"manifest": {"facets.experiment.source": {"tree_sha256": "a" * 64, "complete": True}}},
                    "manifest": {"facets.experiment.source": {"tree_sha256": "b" * 64, "complete": True}}},
     "experiment.source.tree_sha256"),
    ("data-value", {"base": {"manifest": {"facets.data.entries": [{"path": "data/train.h5", "md5": "1" * 32,
                                                                  "size": 1000, "kind": "file"}]}},
                    "manifest": {"facets.data.entries": [{"path": "data/train.h5", "md5": "2" * 32, "size": 1000,
                                                          "kind": "file"}]}}, f"{DATA}.md5"),
    ("data-file", {"base": {"manifest": {"facets.data.entries": [{"path": "data/train.h5", "md5": "1" * 32,
                                                                 "size": 1000, "kind": "file"}]}},
                   "manifest": {"facets.data.entries": [{"path": "data/train.h5", "md5": "3" * 32, "size": 2000,
                                                         "kind": "file"}]}}, DATA),
    ("thread-count", {"manifest": {"facets.runtime.torch.num_threads": 1}}, "runtime.torch.num_threads"),
    ("instruction-set", {"manifest": {"facets.environment.env.values.ATEN_CPU_CAPABILITY": "avx2"}},
     "environment.env.values.ATEN_CPU_CAPABILITY"),
])
def test_each_kind_of_change_is_named_first_by_every_command(reference, tmp_path, kind, changes, key):
    # every step agrees up to step 3, then the loss moves: the divergence explains it
    ref, rerun = _pair(reference, tmp_path, kind, loss_from=3, **changes)
    _all_name(named_first(ref, rerun), key)


def test_a_package_version_is_named_first(reference, tmp_path):
    def numpy_at(version: str) -> dict:
        manifest = json.loads((reference / "manifest.json").read_text())
        dists = manifest["facets"]["environment"]["distributions"]
        return {"facets.environment.distributions": [dict(d, version=version) if d["name"] == "numpy" else d
                                                     for d in dists]}
    ref, rerun = _pair(reference, tmp_path, "package", base={"manifest": numpy_at("2.0.0")},
                       manifest=numpy_at("2.1.0"), loss_from=1)
    _all_name(named_first(ref, rerun), "environment.distributions.numpy.version")


def test_a_pair_with_other_seeds_is_explained_by_them_first(reference, tmp_path):
    # seeds differ, and so does a thread count: the seeds come first, whatever the shape
    ref, rerun = _pair(reference, tmp_path, "seed", repeats={"seeds.torch": 12345},
                       manifest={"facets.environment.env.values.OMP_NUM_THREADS": "1"}, loss_from=1)
    a, b = load_run(rerun), load_run(ref)
    plan = plan_locate(a, b, same_run=False, repeat=0, other_repeat=1)
    assert plan.pair.shape == "first step" and plan.pair.causes[0]["key"] == "seeds.torch"
    cause = plan.explain({"found": True, "op": "(initial state)", "self_consistent": {"A": True}})
    assert cause["causes"][0]["key"] == "seeds.torch" and "the likely cause: seeds.torch" in cause["explanation"]


def test_a_control_has_no_result_relevant_difference(reference, tmp_path):
    ref, rerun = _pair(reference, tmp_path, "control")
    got = named_first(ref, rerun)
    assert got["verify_relevant"] == 0 and got["diff_relevant"] == 0 and got["diff_exit"] == 0, got
    assert got["history"] is None and got["divergence"] is None


def test_documented_non_differences_are_no_differences(reference, tmp_path):
    manifest = json.loads((reference / "manifest.json").read_text())
    dists = [d for d in manifest["facets"]["environment"]["distributions"] if d["name"] != "repro500"]
    env = manifest["facets"]["environment"]["env"]
    seeds = manifest["facets"]["seeds"]
    numa = [dict(n, memory_bytes=n["memory_bytes"] // 2) for n in manifest["facets"]["hardware"].get("numa") or []]
    more = {**seeds, "repeats": 4, "plan": seeds["plan"] + [dict(seeds["plan"][0], repeat=2),
                                                           dict(seeds["plan"][0], repeat=3)]}
    ref, rerun = _pair(reference, tmp_path, "same", manifest={
        "facets.environment.distributions": dists,  # repro500 absent from a command's own venv
        "facets.environment.env": {"values": {**env["values"], "REPRO500_FOREIGN_CODE": "refuse"},
                                   "names": env["names"] + ["REPRO500_FOREIGN_CODE"]},
        "facets.seeds": more,  # more repeats
        "created_utc": "2031-01-01T00:00:00Z",  # another capture time
        "facets.hardware.numa": numa,  # memory the kernel reports for a node
    }, recipe={"repeats": 4})
    found = compare.compare_runs(load_run(rerun), load_run(ref))
    assert found.differences == [], [compare.line(d) for d in found.differences]


def test_a_setting_equal_on_both_sides_is_no_cause(reference, tmp_path):
    # neither side --deterministic, one thread count differs: the thread count is the cause
    ref, rerun = _pair(reference, tmp_path, "threads", base={"recipe": {"mutable.deterministic": False}},
                       recipe={"mutable.deterministic": False},
                       manifest={"facets.environment.env.values.OMP_NUM_THREADS": "1"}, loss_from=2)
    got = named_first(ref, rerun)
    assert got["divergence"] == "environment.env.values.OMP_NUM_THREADS", got
    assert all("setting" not in str(c) for c in [got["verify"], got["diff"], got["history"]])


def test_declared_outputs_that_differ_part_for_verify_and_locate(reference, tmp_path):
    ref, rerun = _pair(reference, tmp_path, "outputs", base={"repeats": {"outputs": {"model.pt": "1" * 64}}},
                       repeats={"outputs": {"model.pt": "2" * 64}})
    verdict = verify_run(rerun, against=ref)
    assert verdict.divergence.status == "FOUND", verdict.divergence.reason
    assert verdict.divergence.first.shape == "final state" and "model.pt" in verdict.divergence.reason
    assert "declared outputs that differ" in verdict.exact_replay.reason  # one answer to "did they part"
    plan = plan_locate(load_run(rerun), load_run(ref), same_run=False)
    assert plan.pair.diverged and plan.steps is None


def test_the_words_follow_the_impact():
    """One threshold: a row is called result-relevant iff its impact reaches it, in every rule's words."""
    for pattern, impact, reason in diff.RULES:
        assert ("result-relevant" in reason) <= diff.is_result_relevant(impact), (pattern, reason)
        if not diff.is_result_relevant(impact):
            assert "result-relevant" not in reason and diff.relevance(impact) == "not result-relevant", pattern
    assert diff.relevance(diff.RELEVANT_IMPACT) == "result-relevant"
    assert diff.relevance(diff.RELEVANT_IMPACT - 1) == "not result-relevant"
    rows = [diff.Difference("environment", "env.values.FOO", "1", "2", *diff._impact("environment",
                                                                                     ("env", "values", "FOO")))]
    assert diff.counted(rows) == "1 difference(s), 0 result-relevant"
    assert "not result-relevant" in compare.line(rows[0])


def test_torchs_cpu_capability_line_alone_is_the_instruction_set_not_another_build():
    config = "PyTorch built with:\n  - GCC 13.3\n  - CPU capability usage: {}\n  - Build settings: x\n"

    def manifest(isa: str, env: dict) -> dict:
        return {"facets": {"runtime": {"torch": {"config": config.format(isa)}},
                           "environment": {"env": {"values": env, "names": sorted(env)}}}}
    found = compare.compare_manifests(manifest("AVX512", {}), manifest("AVX2", {"ATEN_CPU_CAPABILITY": "avx2"}))
    assert [compare.key_of(d) for d in found.relevant] == ["environment.env.values.ATEN_CPU_CAPABILITY",
                                                           "runtime.torch.config"]
    assert {d.impact for d in found.relevant} == {65}
    rebuilt = compare.compare_manifests(manifest("AVX2", {}), {"facets": {"runtime": {"torch": {
        "config": config.format("AVX2").replace("13.3", "14.1")}}, "environment": {"env": {"values": {}, "names": []}}}})
    assert rebuilt.first.impact == 100  # another build: the build line differs too
