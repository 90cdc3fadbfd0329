"""Heavy outputs: a command that writes checkpoints into its repeat directory is published with
``--exclude`` (the checkpoints left out, their digests sealed) and reproduced; pack, unpack and
publish show their progress, as a plain line per step off a terminal and a bar on one.

One small command run (2 repeats, each writing a checkpoint) is made and published once per module.
"""

from __future__ import annotations

import hashlib
import json
import os
import pty
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
from helpers.runs import repro500, write_recipe

from repro500.rundir import archive as archives
from repro500.rundir import sums as bundle

SCRIPT = '''
import os
import random

random.seed(int(os.environ["REPRO500_SEED"]))
out = os.environ["REPRO500_REPEAT_DIR"]
with open(os.path.join(out, "checkpoint.pt"), "wb") as fh:
    fh.write(random.randbytes(3000))
os.makedirs(os.path.join(out, "ckpt"), exist_ok=True)
with open(os.path.join(out, "ckpt", "epoch1.pt"), "wb") as fh:
    fh.write(random.randbytes(500))
with open(os.path.join(out, "notes.txt"), "w") as fh:
    fh.write("kept in the archive\\n")
print(f"Acc@1 {90 + random.random() / 20:.4f}")
'''
EXCLUDES = ("--exclude", "repeats/*/checkpoint.pt", "--exclude", "repeats/*/ckpt")
LEFT_OUT = [f"repeats/{k}/{name}" for k in (0, 1) for name in ("checkpoint.pt", "ckpt/epoch1.pt")]
PLAIN_LINE = r"{what}: [0-9.]+ (bytes|kB|MB)( in \d+ files)? \.\.\. done in [0-9.]+ s \([0-9.]+ (bytes|kB|MB)/s\)"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runs/heavy (a command run whose repeats wrote checkpoints) and pub/ (its publication without them)."""
    lab = tmp_path_factory.mktemp("lab")
    (lab / "train.py").write_text(textwrap.dedent(SCRIPT))
    write_recipe(lab / "exp.yaml", {
        "schema": "repro500/recipe/v1", "name": "heavy",
        "fixed": {"command": [sys.executable, "train.py"], "outputs": ["checkpoint.pt"]},
        "metrics": {"accuracy": {"regex": "Acc@1 ([0-9.]+)", "scale": 0.01}},
        "acceptance": {"accuracy": {"target": 0.9, "tolerance": 0.005}}, "repeats": 2, "seed": 4})
    ran = repro500("run", "exp.yaml", "--no-tracking", "--run-id", "heavy", cwd=lab)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    published = repro500("publish", "runs/heavy", "--out", "pub", *EXCLUDES, cwd=lab)
    assert published.returncode == 0, published.stdout + published.stderr
    assert "4 file(s) of the run (7.0 kB) are left out of the archive (--exclude)" in published.stdout
    return lab


def _resum(pub: Path) -> None:
    """What a careful forger does after editing a publication: rewrite its digest list."""
    names = sorted(bundle.read_sums(pub))
    (pub / "SHA256SUMS").write_text("".join(f"{hashlib.sha256((pub / n).read_bytes()).hexdigest()}  {n}\n"
                                            for n in names))


def test_publish_exclude_leaves_the_files_out_and_seals_their_digests(lab: Path) -> None:
    pub, run = lab / "pub", lab / "runs" / "heavy"
    with tarfile.open(pub / "heavy.tar.gz") as tar:
        names = {m.name.removeprefix("heavy/") for m in tar.getmembers()}
        packed_sums = tar.extractfile("heavy/SHA256SUMS").read()
    assert not set(LEFT_OUT) & names and not {"repeats/0/ckpt", "repeats/1/ckpt"} & names
    assert {"repeats/0/notes.txt", "repeats/0/summary.json", "repeats/1/stdout.txt", "source/train.py"} <= names
    # the run's SHA256SUMS travels unchanged (a signature over it stays valid) and still seals them
    assert packed_sums == (run / "SHA256SUMS").read_bytes()
    sealed = bundle.read_sums(run)
    index = json.loads((pub / "publication.json").read_text())
    assert index["not_carried"] == [{"path": p, "bytes": (run / p).stat().st_size, "sha256": sealed[p]}
                                    for p in LEFT_OUT]
    subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=pub, check=True)  # the index is covered
    readme = (pub / "README.md").read_text()
    assert "## Files left out of the packed run" in readme and sealed["repeats/1/checkpoint.pt"] in readme
    assert "repro500 verify heavy.tar.gz --expect-sums" in readme  # in place, it knows what was left out


def test_a_publication_with_files_left_out_reproduces(lab: Path, tmp_path: Path) -> None:
    done = repro500("reproduce", str(lab / "pub"), "--out", "rep", "--run-code", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((tmp_path / "rep" / "verdict.json").read_text())["status"] == "REPRODUCED"
    # what reproduce learned when it opened the publication: the left-out files, not missing ones
    from repro500.publish.opened import open_publication

    opened = open_publication(lab / "pub", tmp_path / "reference")
    check = opened.integrity.to_dict()
    assert check["ok"] and check["sums"]["missing"] == [] and check["sums"]["not_carried"] == LEFT_OUT
    assert [e["path"] for e in check["not_carried"]] == LEFT_OUT
    assert check["notes"][0].startswith("4 files (7.0 kB) not carried, digests recorded: repeats/0/checkpoint.pt")
    assert check["files_checked"] == len(bundle.read_sums(opened.reference)) - 4


def test_the_archive_alone_reports_them_missing_until_they_are_put_back(lab: Path, tmp_path: Path) -> None:
    unpacked = repro500("unpack", str(lab / "pub" / "heavy.tar.gz"), "--dest", "x", cwd=tmp_path)
    assert unpacked.returncode == 4 and "missing: repeats/0/checkpoint.pt" in unpacked.stderr
    run = tmp_path / "x" / "heavy"
    assert repro500("verify", str(run), "--no-write", cwd=tmp_path).returncode == 4
    for rel in LEFT_OUT:  # obtained elsewhere: checked against the sealed digests like any file
        (run / rel).parent.mkdir(exist_ok=True)
        shutil.copyfile(lab / "runs" / "heavy" / rel, run / rel)
    verified = repro500("verify", str(run), "--no-write", cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr


NOT_CARRIED = "4 files (7.0 kB) not carried, digests recorded: repeats/0/checkpoint.pt"


SLOW = pytest.mark.slow  # each form is a verify of its own (2-3 s): the first ones stay in make test


@pytest.mark.parametrize("args", [["pub"], ["pub/heavy.tar.gz"], ["runs/heavy", "--against", "pub"],
                                  pytest.param(["runs/heavy", "--against", "pub/heavy.tar.gz"], marks=SLOW)],
                         ids=["directory", "archive", "against-directory", "against-archive"])
def test_verify_of_a_publication_says_what_it_did_not_carry(lab: Path, args: list[str]) -> None:
    done = repro500("verify", *args, "--no-write", "--json", cwd=lab)
    assert done.returncode == 0, done.stdout + done.stderr
    verdict = json.loads(done.stdout)
    checked = verdict["reference_integrity" if "--against" in args else "integrity"]
    assert checked["ok"] and checked["sums"]["missing"] == [] and checked["sums"]["not_carried"] == LEFT_OUT
    assert [n for n in checked["notes"] if n.startswith(NOT_CARRIED)], checked["notes"]
    if "--against" not in args:  # the packed run's own chain is checked too, a publication directory's as well
        assert "repeat chain intact: every planned repeat is accounted for (chain.jsonl)" in checked["notes"]
    assert verdict["status"] == ("REPRODUCED" if "--against" in args else "PASS")
    if args == ["pub"]:  # and on the terminal, in the integrity section; the publication stays as published
        shown = repro500("verify", *args, cwd=lab)
        assert NOT_CARRIED in " ".join(shown.stdout.split()) and "missing" not in shown.stdout
        assert not (lab / "pub" / "verdict.json").exists()


def _repack(pub: Path, edit) -> None:
    """The publication's archive packed again with ``edit`` applied to the unpacked run, the index
    and the publication's SHA256SUMS brought in line: a forger who leaves no loose end."""
    archive = pub / "heavy.tar.gz"
    with tarfile.open(archive) as tar:
        tar.extractall(pub / "x", filter="data")
    edit(pub / "x" / "heavy")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(pub / "x" / "heavy", arcname="heavy")
    shutil.rmtree(pub / "x")
    _edit_index(pub, lambda index: index["archive"].update(sha256=hashlib.sha256(archive.read_bytes()).hexdigest()))
    _resum(pub)


def _alter_carried(run: Path) -> None:
    (run / "repeats" / "0" / "notes.txt").write_text("edited after publishing\n")


def _put_back_altered(run: Path) -> None:
    (run / "repeats" / "0" / "checkpoint.pt").write_bytes(b"not the checkpoint that ran")


@pytest.mark.parametrize("form, edit, said", [
    ("directory", _alter_carried, "edited: repeats/0/notes.txt"),
    pytest.param("archive", _alter_carried, "edited: repeats/0/notes.txt", marks=SLOW),
    pytest.param("against", _alter_carried, "edited: repeats/0/notes.txt", marks=SLOW),
    pytest.param("directory", _put_back_altered, "edited: repeats/0/checkpoint.pt", marks=SLOW),
], ids=["directory", "archive", "against", "left-out-file-put-back-altered"])
def test_a_carried_file_that_was_altered_is_still_invalid(lab: Path, tmp_path: Path, form: str, edit,
                                                          said: str) -> None:
    pub = tmp_path / "pub"
    shutil.copytree(lab / "pub", pub)
    _repack(pub, edit)
    args = {"directory": [str(pub)], "archive": [str(pub / "heavy.tar.gz")],
            "against": [str(lab / "runs" / "heavy"), "--against", str(pub)]}[form]
    done = repro500("verify", *args, "--no-write", cwd=tmp_path)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "INVALID" in done.stdout and said in " ".join(done.stdout.split())


def test_verify_refuses_a_publication_changed_after_publish(lab: Path, tmp_path: Path) -> None:
    pub = tmp_path / "pub"
    shutil.copytree(lab / "pub", pub)
    _edit_index(pub, _drop_first)  # the publication's own SHA256SUMS no longer matches
    done = repro500("verify", str(pub), "--no-write", cwd=tmp_path)
    assert done.returncode == 4 and "was changed after repro500 publish wrote it" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


@pytest.mark.parametrize("glob, said", [
    ("*.json", "--exclude '*.json' matches data-specs.json, one of repro500's own records of the run"),
    ("checkpoints/*", "--exclude 'checkpoints/*' matches no file of run heavy"),
])
def test_publish_refuses_an_exclude_of_a_record_or_of_nothing_before_writing(lab: Path, glob: str, said: str) -> None:
    done = repro500("publish", "runs/heavy", "--out", "pub-refused", "--exclude", "*.pt", "--exclude", glob, cwd=lab)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(f"repro500: error: {said}") and done.stderr.count("\n") == 1
    assert not (lab / "pub-refused").exists() and not list(lab.glob(".pub-refused*"))


@pytest.mark.parametrize("glob", ["repeats/*/summary.json", "repeats/1/stdout.txt", "repeats/*/stderr.txt",
                                  "source/*", "source.json", "SHA256SUMS", "chain.jsonl", "manifest.json",
                                  "repeats/0", "*"])
def test_what_repro500_reads_is_never_left_out(lab: Path, glob: str) -> None:
    from repro500.errors import UsageError
    from repro500.rundir.excluded import required, select

    with pytest.raises(UsageError, match="one of repro500's own records"):
        select(lab / "runs" / "heavy", [glob])
    # and what this run happens not to hold: a trained repeat's records, a signature
    assert all(map(required, ["repeats/2/metrics.jsonl", "repeats/0/params.jsonl", "repeats/0/metrics.json",
                              "repeats/0/mllog.txt", "repeats/0/ranks.json", "attestation.sig", "run.json"]))
    assert not any(map(required, ["repeats/0/model.pt", "repeats/0/ckpt/summary.json"]))


def _edit_index(pub: Path, edit) -> None:
    index = json.loads((pub / "publication.json").read_text())
    edit(index)
    (pub / "publication.json").write_text(json.dumps(index))


def _drop_first(index: dict) -> None:
    del index["not_carried"][0]


def _other_digest(index: dict) -> None:
    index["not_carried"][0]["sha256"] = "0" * 64


def _a_record(index: dict) -> None:
    index["not_carried"].append({"path": "repeats/0/summary.json", "bytes": 1, "sha256": "0" * 64})


@pytest.mark.parametrize("edit, resum, said", [
    (_drop_first, False, "was changed after repro500 publish wrote it (edited: publication.json)"),
    (_drop_first, True, "is not what the run wrote: files do not match SHA256SUMS (missing: repeats/0/checkpoint.pt)"),
    (_other_digest, True, "not_carried[0]: repeats/0/checkpoint.pt is not a file the packed run's SHA256SUMS seals"),
    (_a_record, True, "not_carried[4]: repeats/0/summary.json is a file every publication carries"),
], ids=["edited", "entry-dropped", "digest-changed", "record-listed"])
def test_an_edited_not_carried_list_is_caught_before_anything_runs(lab: Path, tmp_path: Path, edit, resum: bool,
                                                                  said: str) -> None:
    pub = tmp_path / "pub"
    shutil.copytree(lab / "pub", pub)
    _edit_index(pub, edit)
    if resum:
        _resum(pub)
    done = repro500("reproduce", str(pub), "--out", "rep", "--run-code", cwd=tmp_path)
    assert done.returncode == 4, done.stdout + done.stderr
    assert said in " ".join(done.stderr.split()) and "Traceback" not in done.stderr
    assert not (tmp_path / "rep" / "runs").exists()  # nothing ran


def test_a_file_the_archive_lacks_that_the_list_does_not_name_is_missing(lab: Path, tmp_path: Path) -> None:
    pub = tmp_path / "pub"
    shutil.copytree(lab / "pub", pub)
    archive = pub / "heavy.tar.gz"
    archives.pack(lab / "runs" / "heavy", archive, force=True, leave_out=[*LEFT_OUT, "repeats/1/notes.txt"])
    _edit_index(pub, lambda index: index["archive"].update(sha256=hashlib.sha256(archive.read_bytes()).hexdigest()))
    _resum(pub)
    done = repro500("reproduce", str(pub), "--out", "rep", "--run-code", cwd=tmp_path)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "(missing: repeats/1/notes.txt)" in " ".join(done.stderr.split())


# ----------------------------------------------------------------------------------------- progress


def test_pack_unpack_and_publish_print_a_plain_line_per_step_off_a_terminal(lab: Path, tmp_path: Path) -> None:
    run = str(lab / "runs" / "heavy")
    quiet = repro500("pack", run, "-o", "quiet.tar.gz", cwd=tmp_path)  # a small run stays quiet
    assert quiet.returncode == 0 and quiet.stderr == ""
    shown = {"REPRO500_PROGRESS_MIN_BYTES": "0"}
    packed = repro500("pack", run, "-o", "run.tar.gz", cwd=tmp_path, env=shown)
    assert packed.returncode == 0, packed.stderr
    assert re.fullmatch(PLAIN_LINE.format(what="packing heavy") + "\n", packed.stderr), packed.stderr
    unpacked = repro500("unpack", "run.tar.gz", "--dest", "x", cwd=tmp_path, env=shown)
    assert unpacked.returncode == 0, unpacked.stderr
    assert re.fullmatch(PLAIN_LINE.format(what="unpacking run.tar.gz") + "\n", unpacked.stderr), unpacked.stderr
    # a step that fails ends its line, so the error is a line of its own
    again = repro500("unpack", "run.tar.gz", "--dest", "x", cwd=tmp_path, env=shown)
    assert again.returncode == 4
    first, second = again.stderr.splitlines()
    assert re.fullmatch(r"unpacking run\.tar\.gz: [0-9.]+ kB \.\.\. stopped", first)
    assert second.startswith("repro500: error: x/heavy already exists")
    # publishing a packed run unpacks it, then packs it again without the checkpoints: a line each
    published = repro500("publish", "run.tar.gz", "--out", "pub", *EXCLUDES, cwd=tmp_path, env=shown)
    assert published.returncode == 0, published.stderr
    lines = published.stderr.splitlines()
    assert len(lines) == 2 and re.fullmatch(PLAIN_LINE.format(what="unpacking run.tar.gz"), lines[0])
    assert re.fullmatch(PLAIN_LINE.format(what="packing heavy"), lines[1]), lines
    assert json.loads((tmp_path / "pub" / "publication.json").read_text())["not_carried"][0]["path"] == LEFT_OUT[0]
    bad = repro500("pack", run, "-o", "bad.tar.gz", cwd=tmp_path, env={"REPRO500_PROGRESS_MIN_BYTES": "lots"})
    assert bad.returncode == 2 and bad.stderr.startswith("repro500: error: REPRO500_PROGRESS_MIN_BYTES='lots'")
    assert not (tmp_path / "bad.tar.gz").exists()


def test_on_a_terminal_the_progress_is_a_bar_that_goes_away(lab: Path, tmp_path: Path) -> None:
    main, child = pty.openpty()
    env = dict(os.environ, REPRO500_PROGRESS_MIN_BYTES="0", COLUMNS="100", TERM="xterm")
    proc = subprocess.Popen([sys.executable, "-m", "repro500.cli", "pack", str(lab / "runs" / "heavy"), "-o",
                             "run.tar.gz"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=child)
    os.close(child)
    seen = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        seen += chunk
    os.close(main)
    assert proc.wait(timeout=60) == 0
    text = seen.decode("utf-8", "replace")
    assert "packing" in text and "kB" in text  # the bar, with bytes done / total
    assert " done in " not in text  # not the plain line
    assert "\x1b[?25h" in text and text.endswith("\x1b[2K")  # transient: the cursor given back, the bar erased
