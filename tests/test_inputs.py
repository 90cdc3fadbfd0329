"""The data a wrapped command reads is recorded, declared or not (docs/command.md, "The data a
command reads"): declared inputs hashed like data sets, observed ones found by the audit hook in
every Python process of the command (or strace), compared by diff, verify and reproduce."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from helpers.runs import repro500

from repro500.capture import inputs
from repro500.capture.data import digest_path
from repro500.workloads.command.observe import Watch

PY = sys.executable
ACC = ["--metric", "accuracy=regex:Acc ([0-9.]+)", "--accept", "accuracy>=0.5"]


def _project(root: Path, data: Path) -> Path:
    """A two-file experiment that reads a data file outside its directory."""
    proj = root / "proj"
    proj.mkdir()
    (proj / "helpers.py").write_text("def mean(path):\n    xs = [float(x) for x in open(path) if x.strip()]\n"
                                     "    return sum(xs) / len(xs)\n")
    (proj / "train.py").write_text(textwrap.dedent("""
        import sys
        import helpers
        print(f"Acc {helpers.mean(sys.argv[1]) / 10:.3f}")
    """))
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("6\n7\n8\n")
    return proj


# ----- which opened files are inputs ---------------------------------------------------------------
def test_select_keeps_files_read_and_never_written_outside_the_excluded_trees(tmp_path):
    data, out, source, tree = tmp_path / "data.csv", tmp_path / "out.txt", tmp_path / "proj", tmp_path / "py"
    for path in (data, out, source / "helpers.py", tree / "lib/os.py", tmp_path / "model.so"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    opened = inputs.Opened(read={str(data), str(out), str(source / "helpers.py"), str(tree / "lib/os.py"),
                                 str(tmp_path / "model.so"), "/etc/hostname", str(tmp_path / "gone.csv"), str(tmp_path)},
                           written={str(out)}, trees={str(tree)})
    assert inputs.select(opened, exclude=[source]) == [str(data)]


def test_many_files_of_a_directory_become_one_directory_digest_and_siblings_merge(tmp_path):
    files = []
    for cls in ("cat", "dog"):
        for i in range(inputs.DIR_MIN_FILES):
            path = tmp_path / "images" / "train" / cls / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(bytes([i]))
            files.append(str(path))
    few = tmp_path / "labels" / "a.txt"
    few.parent.mkdir()
    few.write_text("a")
    grouped = inputs.group(sorted([*files, str(few)]))
    assert grouped == [str(tmp_path / "images" / "train"), str(few)]
    entries, skipped = inputs.digest(grouped)
    assert skipped == [] and entries[0]["kind"] == "directory" and entries[0]["nfiles"] == 2 * inputs.DIR_MIN_FILES
    assert entries[0]["md5"] == digest_path(tmp_path / "images" / "train")["md5"]  # DVC's directory digest


def test_an_input_over_the_budget_is_listed_with_its_size_not_hashed(tmp_path):
    small, big = tmp_path / "small.bin", tmp_path / "big.bin"
    small.write_bytes(b"x" * 10)
    big.write_bytes(b"x" * 5000)
    entries, skipped = inputs.digest([str(small), str(big)], budget_bytes=1000)
    assert [e["path"] for e in entries] == [str(small)]
    assert skipped[0]["path"] == str(big) and skipped[0]["bytes"] == 5000 and "budget" in skipped[0]["reason"]


def test_strace_logs_are_read_with_flags_and_resolved_paths(tmp_path):
    (tmp_path / "strace.txt.101").write_text(textwrap.dedent("""\
        openat(AT_FDCWD, "data.csv", O_RDONLY|O_CLOEXEC) = 3</work/data.csv>
        openat(AT_FDCWD, "out.txt", O_WRONLY|O_CREAT|O_TRUNC, 0666) = 4</work/out.txt>
        openat(AT_FDCWD, "missing", O_RDONLY) = -1 ENOENT (No such file or directory)
    """))
    (tmp_path / "strace.txt.102").write_text(textwrap.dedent("""\
        open("/etc/ld.so.cache", O_RDONLY|O_CLOEXEC) = 3</etc/ld.so.cache>
        openat(AT_FDCWD, "odd\\x20name", O_RDONLY) = 5</work/odd\\x20name>
        creat("/work/made.txt", 0644) = 6</work/made.txt>
    """))
    opened = inputs.read_strace(sorted(tmp_path.glob("strace.txt.*")))
    assert opened.read == {"/work/data.csv", "/etc/ld.so.cache", "/work/odd name"}
    assert opened.written == {"/work/out.txt", "/work/made.txt"} and opened.processes == 2


def test_hidden_files_and_compiler_caches_are_never_inputs(tmp_path):
    secret, cache, data = tmp_path / ".aws" / "credentials", tmp_path / ".netrc", tmp_path / "data.csv"
    for path in (secret, cache, data):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    opened = inputs.Opened(read={str(secret), str(cache), str(data)})
    assert inputs.select(opened, exclude=[]) == [str(data)]


# ----- the audit hook in the command's Python processes -------------------------------------------------
def test_the_hook_sees_reads_of_the_script_its_forks_and_its_python_children(tmp_path):
    data = tmp_path / "elsewhere" / "values.csv"
    proj = _project(tmp_path, data)
    other = tmp_path / "elsewhere" / "other.txt"
    other.write_text("o")
    (proj / "main.py").write_text(textwrap.dedent(f"""
        import os, subprocess, sys
        import helpers
        helpers.mean({str(data)!r})
        open("written.txt", "w").write("w")
        if os.fork() == 0:
            open({str(other)!r}).read()
            os._exit(0)
        os.wait()
        subprocess.run([sys.executable, "-c", "open({str(tmp_path / 'elsewhere' / 'child.txt')!r}, 'w').write('c')"])
        subprocess.run([sys.executable, "-c", "open({str(tmp_path / 'elsewhere' / 'child.txt')!r}).read()"])
    """))
    watch = Watch("auto")
    env = watch.env({k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert env["PYTHONPATH"] == str(Path(inputs.__file__).parents[1] / "workloads" / "command" / "childsite")  # no empty entry
    subprocess.run([PY, "main.py"], cwd=proj, env=env, check=True)
    seen = watch.result(exclude=[proj])
    # the script's own files, what it wrote and the interpreter's trees are not inputs
    assert seen["paths"] == sorted([str(data), str(other)]) and seen["method"] == "audit-hook"
    assert seen["processes"] >= 4 and seen["note"] is None
    assert watch.dir is None  # its scratch directory is gone


def test_python_source_opened_as_code_is_never_an_input_wherever_it_lies(tmp_path):
    # a library installed in editable mode lives outside site-packages: its modules are imported,
    # and a warning it raises makes linecache read its source again; neither is data
    lib = tmp_path / "checkout" / "mylib"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("import warnings\n\ndef load(path):\n    warnings.warn('deprecated')\n"
                                     "    return open(path).read()\n")
    data = tmp_path / "data" / "values.csv"
    proj = _project(tmp_path, data)
    config = tmp_path / "data" / "settings.py"  # a .py file the script itself reads: data like any other
    config.write_text("lr = 0.1\n")
    (proj / "main.py").write_text(f"import mylib\nmylib.load({str(data)!r})\nopen({str(config)!r}).read()\n")
    watch = Watch("auto")
    env = watch.env({**os.environ, "PYTHONPATH": str(lib.parent), "PYTHONDONTWRITEBYTECODE": "1"})
    done = subprocess.run([PY, "-W", "always", "main.py"], cwd=proj, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "warnings.warn('deprecated')" in done.stderr, done.stderr  # linecache read it
    seen = watch.result(exclude=[proj])
    assert seen["paths"] == [str(config), str(data)]
    # repro500's own modules (an editable install too) are never inputs, imported or read
    own = Watch("auto")
    reader = "import repro500.errors, sys; open(sys.argv[1]).read()"
    subprocess.run([PY, "-c", reader, inputs.__file__], env=own.env(dict(os.environ)), check=True)
    assert own.result(exclude=[])["paths"] == []


def test_a_command_without_python_is_not_observed_and_the_record_says_so(tmp_path):
    watch = Watch("auto")
    subprocess.run(["sh", "-c", "cat /dev/null"], env=watch.env(dict(os.environ)), check=True)
    seen = watch.result(exclude=[])
    assert seen["paths"] == [] and "--input" in seen["note"] and "--trace-inputs" in seen["note"]


def test_the_hook_keeps_a_sitecustomize_it_shadows(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_LOADED'] = '1'\n")
    watch = Watch("auto")
    env = watch.env({**os.environ, "PYTHONPATH": str(site)})
    out = subprocess.run([PY, "-c", "import os, sys; print(os.environ.get('THEIRS_LOADED'), "
                                    "any('childsite' in p for p in sys.path))"],
                         env=env, capture_output=True, text=True, check=True)
    watch.close()
    assert out.stdout.split() == ["1", "False"]  # theirs ran, and repro500's directory left sys.path


# ----- through repro500 run: declared and observed, recorded, compared ------------------------------------
def test_a_run_records_declared_and_observed_inputs_and_diff_names_a_changed_one(tmp_path):
    data = tmp_path / "data" / "values.csv"
    proj = _project(tmp_path, data)
    args = ["run", "--command", *ACC, "-n", "1", "--no-tracking", "--input", str(data)]
    first = repro500(*args, "--run-id", "a", "--", PY, "train.py", str(data), cwd=proj)
    assert first.returncode == 3, first.stderr  # one repeat: no confidence bound, but a finished run
    run = proj / "runs" / "a"
    observed = json.loads((run / "inputs.json").read_text())
    assert observed["method"] == "audit-hook" and [e["path"] for e in observed["observed"]] == [str(data)]
    assert observed["observed"][0]["md5"] == digest_path(data)["md5"] and observed["observed"][0]["repeats"] == [0]
    manifest = json.loads((run / "manifest.json").read_text())
    assert [e["path"] for e in manifest["facets"]["data"]["inputs"]] == [str(data)]
    assert "inputs.json" in (run / "SHA256SUMS").read_text()

    data.write_text("6\n7\n9\n")
    second = repro500(*args, "--run-id", "b", "--", PY, "train.py", str(data), cwd=proj)
    assert second.returncode == 3, second.stderr
    shown = repro500("diff", str(run), str(proj / "runs" / "b"), "--json", cwd=proj)
    assert shown.returncode == 1
    keys = {(d["facet"], d["key"]) for d in json.loads(shown.stdout)["differences"] if d["result_relevant"]}
    assert keys == {("data", f"observed.{data}.md5"), ("data", f"inputs.{data}.md5")}


def _observed_by_a_run(proj: Path, *argv: str) -> dict:
    done = repro500("run", "--command", *ACC, "-n", "1", "--no-tracking", "--run-id", "o", "--", *argv, cwd=proj)
    assert done.returncode == 3, done.stdout + done.stderr  # one repeat: a finished run without a bound
    return json.loads((proj / "runs" / "o" / "inputs.json").read_text())


def test_a_python_shebang_script_run_as_a_program_has_its_reads_observed(tmp_path):
    data = tmp_path / "data" / "values.csv"
    proj = _project(tmp_path, data)
    script = proj / "train.py"
    script.write_text(f"#!{PY}\n" + script.read_text())
    script.chmod(0o755)
    observed = _observed_by_a_run(proj, "./train.py", str(data))
    assert observed["method"] == "audit-hook" and [e["path"] for e in observed["observed"]] == [str(data)]
    assert observed["observed"][0]["md5"] == digest_path(data)["md5"]


@pytest.mark.slow
def test_torchrun_workers_have_their_reads_observed(tmp_path):
    torchrun = Path(PY).parent / "torchrun"
    data = tmp_path / "data" / "values.csv"
    proj = _project(tmp_path, data)
    shard = tmp_path / "data" / "rank0.csv"  # read only by the worker, named by its rank
    shard.write_text("1\n")
    (proj / "train.py").write_text(textwrap.dedent(f"""
        import os, sys
        import helpers
        open(os.path.join({str(shard.parent)!r}, f"rank{{os.environ['RANK']}}.csv")).read()
        print(f"Acc {{helpers.mean(sys.argv[1]) / 10:.3f}}")
    """))
    observed = _observed_by_a_run(proj, str(torchrun), "--standalone", "--nproc-per-node", "1", "train.py", str(data))
    assert [e["path"] for e in observed["observed"]] == [str(shard), str(data)]  # the agent's own reads are not
    assert observed["method"] == "audit-hook"


@pytest.mark.parametrize(("extra", "message"), [
    (["--input", "nosuch.csv"], "fixed.inputs: {proj}/nosuch.csv does not exist"),
    (["--input", "data-{seed}.csv"], "uses {{seed}}; an input exists before the repeats run"),
])
def test_a_bad_declared_input_is_one_sentence_before_anything_is_written(tmp_path, extra, message):
    proj = _project(tmp_path, tmp_path / "data" / "values.csv")
    done = repro500("run", "--command", *ACC, "--no-tracking", *extra, "--", PY, "train.py", "x", cwd=proj)
    assert done.returncode == 4, done.stderr
    assert message.format(proj=proj) in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (proj / "runs").exists()


def test_a_declared_directory_over_the_budget_is_refused_before_the_run(tmp_path):
    proj = _project(tmp_path, tmp_path / "data" / "values.csv")
    recipe = {"schema": "repro500/recipe/v1", "name": "budget", "repeats": 1, "seed": 0,
              "fixed": {"workload": "command", "command": [PY, "train.py", "x"], "inputs": [str(tmp_path / "data")],
                        "inputs_budget_mb": 0.000001},
              "metrics": {"accuracy": {"regex": "Acc ([0-9.]+)"}},
              "acceptance": {"accuracy": {"target": 0.5, "direction": "higher", "tolerance": 0}}}
    (proj / "r.yaml").write_text(yaml.safe_dump(recipe))
    done = repro500("run", "r.yaml", "--no-tracking", cwd=proj)
    assert done.returncode == 4 and "over fixed.inputs_budget_mb" in done.stderr and not (proj / "runs").exists()


def test_inputs_past_the_size_or_time_budget_are_listed_and_the_run_says_so_in_one_line(tmp_path):
    known, fresh, big = tmp_path / "data" / "known.csv", tmp_path / "data" / "fresh.csv", tmp_path / "big" / "big.bin"
    proj = _project(tmp_path, known)
    fresh.write_text("1\n")
    big.parent.mkdir()
    big.write_bytes(b"\0" * 3 * 2**20)
    os.utime(known, (1e9, 1e9))  # older than the cache's racy window: a digest the cache keeps
    cache = {"REPRO500_CACHE_DIR": str(tmp_path / "cache")}
    with pytest.MonkeyPatch.context() as env:  # whatever cache the suite set stays set
        env.setenv("REPRO500_CACHE_DIR", cache["REPRO500_CACHE_DIR"])
        digest_path(known)  # hashed before: a cache lookup costs no time budget
    reads = "import sys\nfor p in sys.argv[1:]: open(p, 'rb').read()\nprint('Acc 0.9')\n"
    (proj / "reads.py").write_text(reads)
    recipe = {"schema": "repro500/recipe/v1", "name": "budgets", "repeats": 1, "seed": 0,
              "fixed": {"workload": "command", "command": [PY, "reads.py", str(known), str(fresh), str(big)],
                        "inputs_budget_mb": 1, "inputs_budget_s": 0},
              "metrics": {"accuracy": {"regex": "Acc ([0-9.]+)"}},
              "acceptance": {"accuracy": {"target": 0.5, "direction": "higher", "tolerance": 0}}}
    (proj / "r.yaml").write_text(yaml.safe_dump(recipe))
    done = repro500("run", "r.yaml", "--no-tracking", "--run-id", "b", cwd=proj, env=cache)
    assert done.returncode == 3, done.stdout + done.stderr
    recorded = json.loads((proj / "runs" / "b" / "inputs.json").read_text())
    assert [e["path"] for e in recorded["observed"]] == [str(known)]
    reasons = {e["path"]: e["reason"] for e in recorded["skipped"]}
    assert reasons[str(big)].startswith("over the hashing budget (1 MiB, fixed.inputs_budget_mb)")
    assert reasons[str(fresh)].startswith("not hashed within the time budget (0 s, fixed.inputs_budget_s)")
    said = [line for line in " ".join(done.stdout.split("\n")).split("note: ")[1:] if "not hashed" in line]
    assert len(said) == 1 and said[0].startswith("2 input(s) the command read were not hashed"), done.stdout
    assert f"{big} (3.1 MB, over the size budget)" in " ".join(said[0].split())
    assert f"{fresh} (2 bytes, past the time budget)" in " ".join(said[0].split())


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv to drop DAC override")
def test_an_unreadable_declared_input_is_one_sentence(tmp_path):
    proj = _project(tmp_path, tmp_path / "data" / "values.csv")
    secret = tmp_path / "secret.csv"
    secret.write_text("1\n")
    secret.chmod(0)
    cmd = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search",
           PY, "-m", "repro500.cli", "run", "--command", *ACC, "--no-tracking", "--input", str(secret),
           "--", PY, "train.py", str(secret)]
    done = subprocess.run(cmd, cwd=proj, capture_output=True, text=True, timeout=120)
    assert done.returncode == 4 and f"fixed.inputs: {secret} cannot be read" in done.stderr, done.stderr


# ----- strace, for programs that are not Python ---------------------------------------------------------
def _strace_works() -> str | None:
    if not shutil.which("strace"):
        return "strace is not installed (apt-get install strace; .ci/run installs it)"
    probe = subprocess.run(["strace", "-f", "-qq", "-e", "trace=none", "--", "true"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"strace cannot trace here: {probe.stderr.strip()[-200:]}"


@pytest.mark.skipif(_strace_works() is not None, reason=str(_strace_works()))
def test_trace_inputs_finds_what_a_shell_program_reads(tmp_path):
    data = tmp_path / "data" / "values.csv"
    proj = _project(tmp_path, data)
    done = repro500("run", "--command", "--metric", "accuracy=regex:Acc ([0-9.]+)", "--accept", "accuracy>=0",
                    "-n", "1", "--no-tracking", "--trace-inputs", "--run-id", "t",
                    "--", "sh", "-c", f"wc -l < {data} > /dev/null; echo Acc 1", cwd=proj)
    assert done.returncode == 3, done.stderr
    observed = json.loads((proj / "runs/t/inputs.json").read_text())
    assert observed["method"] == "strace" and [e["path"] for e in observed["observed"]] == [str(data)]


def test_trace_inputs_without_strace_is_one_sentence(tmp_path):
    proj = _project(tmp_path, tmp_path / "data" / "values.csv")
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("sh", "true"):
        (bare / tool).symlink_to(shutil.which(tool))
    done = repro500("run", "--command", *ACC, "--no-tracking", "--trace-inputs", "--", PY, "train.py", "x",
                    cwd=proj, env={"PATH": str(bare)})
    assert done.returncode == 4 and "needs strace, which is not installed" in done.stderr
    assert not (proj / "runs").exists()


# ----- the command's environment is the one the run started with ----------------------------------------
def test_nothing_repro500_sets_for_itself_reaches_the_command(in_tmp, monkeypatch):
    from repro500.runner import RunOptions, run

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delenv("KMP_DUPLICATE_LIB_OK", raising=False)
    monkeypatch.setenv("MLFLOW_RUN_ID", "f" * 32)  # a leftover in the user's shell: never handed on
    (in_tmp / "dump.py").write_text(textwrap.dedent("""
        import json, os
        json.dump(dict(os.environ), open(os.path.join(os.environ["REPRO500_REPEAT_DIR"], "env.json"), "w"))
        print("Acc 0.9")
    """))
    adhoc = {"schema": "repro500/recipe/v1", "name": "env", "repeats": 2, "seed": 1,
             "fixed": {"workload": "command", "command": [PY, "dump.py"]},
             "metrics": {"accuracy": {"regex": "Acc ([0-9.]+)"}},
             "acceptance": {"accuracy": {"target": 0.5, "direction": "higher", "tolerance": 0}}}
    outcome = run(RunOptions(adhoc=adhoc, run_id="e", tracking=False))
    assert outcome.exit_code == 0
    # the runner set CUBLAS_WORKSPACE_CONFIG for its own trainer; the verdict's imports ran during repeat 0
    for k in (0, 1):
        env = json.loads((in_tmp / f"runs/e/repeats/{k}/env.json").read_text())
        assert "CUBLAS_WORKSPACE_CONFIG" not in env and "MLFLOW_RUN_ID" not in env
        assert env["REPRO500_RUN_ID"] == "e" and env["REPRO500_REPEAT"] == str(k)
        assert all(key in os.environ or key.startswith("REPRO500_") or key in
                   ("PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONPATH") for key in env), set(env) - set(os.environ)
        assert os.environ.get("CUBLAS_WORKSPACE_CONFIG")  # repro500 did set it, for itself


def test_a_script_that_changes_directory_has_its_relative_reads_recorded_where_they_were(tmp_path):
    one, two = tmp_path / "one" / "labels.txt", tmp_path / "two" / "labels.txt"
    proj = _project(tmp_path, one)
    two.parent.mkdir()
    two.write_text("b")
    (proj / "walk.py").write_text(f"import os\nfor d in {[str(one.parent), str(two.parent)]!r}:\n"
                                  "    os.chdir(d)\n    open('labels.txt').read()\n")
    watch = Watch("auto")
    subprocess.run([PY, "walk.py"], cwd=proj, env=watch.env(dict(os.environ)), check=True)
    assert watch.result(exclude=[proj])["paths"] == [str(one), str(two)]  # the same name, two files


def test_a_process_reading_very_many_files_logs_their_directories_past_its_limit(tmp_path):
    images = tmp_path / "images"
    for cls in ("a", "b"):
        (images / cls).mkdir(parents=True)
        for i in range(1500):
            (images / cls / f"{i}.bin").write_bytes(b"x")
    proj = _project(tmp_path, tmp_path / "values.csv")
    (proj / "load.py").write_text(f"import os\nfor root, _, names in os.walk({str(images)!r}):\n"
                                  "    for n in names:\n        open(os.path.join(root, n)).read()\n")
    watch = Watch("auto")
    subprocess.run([PY, "load.py"], cwd=proj, env=watch.env(dict(os.environ)), check=True)
    logged = sum(len(p.read_text().splitlines()) for p in watch.dir.glob("opened-*.txt"))
    assert logged < 2100  # 2,000 paths, then one line per directory, not 3,000 paths
    assert watch.result(exclude=[proj])["paths"] == [str(images)]


def test_byte_code_and_library_reads_neither_fill_the_log_nor_spend_the_per_process_limit(tmp_path):
    # importing mlflow and scikit-learn opens thousands of byte-code files before a script reads
    # its data: the data must still be recorded as the file it is, not as its directory
    cache = tmp_path / "pycache"
    cache.mkdir()
    for i in range(2500):
        (cache / f"m{i}.cpython-311.pyc").write_bytes(b"x")
    data = tmp_path / "data" / "values.csv"
    proj = _project(tmp_path, data)
    (proj / "load.py").write_text(f"import os\nfor n in os.listdir({str(cache)!r}):\n"
                                  f"    open(os.path.join({str(cache)!r}, n), 'rb').read()\nopen({str(data)!r}).read()\n")
    watch = Watch("auto")
    subprocess.run([PY, "load.py"], cwd=proj, env=watch.env(dict(os.environ)), check=True)
    logged = sum(len(p.read_text().splitlines()) for p in watch.dir.glob("opened-*.txt"))
    assert logged < 50  # the byte code is not logged at all
    assert watch.result(exclude=[proj])["paths"] == [str(data)]


def test_data_inside_the_experiment_that_is_not_in_its_source_copy_is_an_input(tmp_path):
    proj = _project(tmp_path, tmp_path / "proj" / "data" / "values.csv")  # data/ inside the repository
    (proj / ".gitignore").write_text("data/\nruns/\n")  # as dvc add leaves it
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-qm", "x"]):
        subprocess.run(["git", *args], cwd=proj, check=True, capture_output=True)
    done = repro500("run", "--command", *ACC, "-n", "1", "--no-tracking", "--run-id", "g", "--",
                    PY, "train.py", "data/values.csv", cwd=proj)
    assert done.returncode == 3, done.stderr
    kept = json.loads((proj / "runs/g/source.json").read_text())
    assert sorted(f["path"] for f in kept["files"]) == ["helpers.py", "train.py"]
    observed = json.loads((proj / "runs/g/inputs.json").read_text())["observed"]
    assert [e["path"] for e in observed] == [str(proj / "data" / "values.csv")]  # the code is not, the data is
