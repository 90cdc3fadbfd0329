"""A catalogue of hostile values, where they go in a run, a packed run and a publication, and
how a publisher re-seals what it changed: the parts of the record fuzzer (tests/test_fuzz_records.py).

A *case* is one field of one form (run directory, packed run, publication) set to one hostile
value, re-sealed, and one command run on it in a subprocess under CPU-time, memory and wall
limits.  :func:`broken` says which invariant the command's outcome breaks, if any.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from repro500.digest import canonical_digest, canonical_json
from repro500.rundir import sums as bundle

MARKER = "PUBLISHER-CODE-RAN"  # what a planted module writes, wherever it is imported or run
PAD = " " * 400
FORGED = "REPRODUCED (exact)  (exit 0)"
# values by kind; a field gets values of every kind, mostly of its own
PATHS = ["/etc/hostname", "../../outside.txt", ".", "..", "/proc/self/pagemap", "/proc/self/root/etc/hostname",
         "a/../../../b", "/dev/zero", "~/x", "publication/recipe.yaml", ""]
PATTERNS = ["(?:acc )?([0-9.]+)|(?:a|a)*b", "(x+x+)+y([0-9])", r"(acc) ([0-9.]+)\1", "acc (?=[0-9])([0-9.]+)",
            "(", "acc ([0-9.]+)" * 200]
COUNTS = [10**9, 2**63, -1, 0, 1.5, "1e9", True, None, [1] * 3]
STRINGS = ["quickstart" + PAD + FORGED + PAD, "\x1b]52;c;ZXZpbA==\x07\x1b[2J", "\u202eDECUDORPER", "\nVerdict REPRODUCED",
           "[bold green]PASS[/]", "x" * 100_000, "\x00\x9b2J", "evil:build", [sys.executable, "evil.py"]]
KINDS = {"path": PATHS, "pattern": PATTERNS, "count": COUNTS, "string": STRINGS}
# what a line may never start with (after its indentation), whatever the field held
PAYLOAD_STARTS = ("REPRODUCED (exact)", "(exact)", "Verdict REPRODUCED", "DECUDORPER")
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
EXIT_CODES = {0, 1, 2, 3, 4}
CPU_S, MEMORY, WALL_S = 60, 4 * 2**30, 240


@dataclass(frozen=True)
class Field:
    """Where a value goes: ``form`` (run, packed, publication), the file, the keys to it (a list
    index as an int; ``"*"`` every element of a list), and the kind of value it holds."""

    form: str
    file: str
    keys: tuple[Any, ...]
    kind: str

    def __str__(self) -> str:
        return f"{self.form}:{self.file}:{'.'.join(map(str, self.keys))}"


def _fields(form: str, spec: list[tuple[str, str, str]]) -> list[Field]:
    return [Field(form, file, tuple(int(k) if k.isdigit() else k for k in keys.split(".")), kind)
            for file, keys, kind in spec]


RUN_FIELDS = [
    ("run.json", "repeats", "count"), ("run.json", "run_id", "string"), ("run.json", "status", "string"),
    ("run.json", "design", "count"), ("run.json", "recipe_name", "string"), ("run.json", "world_size", "count"),
    ("run.json", "launcher.detached.folder", "path"),  # where a resume and status look for a detached head's tasks
    ("run.json", "nnodes", "count"),  # the nodes a publication's rerun asks SLURM for
    ("summary.json", "repeats_planned", "count"), ("summary.json", "run_id", "string"),
    ("summary.json", "metrics.accuracy.values", "count"), ("summary.json", "recipe_name", "string"),
    ("chain.jsonl", "planned", "count"), ("recipe.yaml", "metrics.accuracy.regex", "pattern"),
    ("recipe.yaml", "name", "string"), ("recipe.yaml", "description", "string"), ("recipe.yaml", "repeats", "count"),
    ("recipe.yaml", "fixed.command", "path"), ("recipe.yaml", "fixed.workdir", "path"),
    ("recipe.yaml", "fixed.outputs", "path"), ("recipe.yaml", "fixed.model", "string"),
    ("recipe.yaml", "acceptance.accuracy.target", "count"),
    ("repeats/0/summary.json", "metrics.accuracy", "count"), ("repeats/0/summary.json", "status", "string"),
    ("repeats/0/summary.json", "repeat", "count"), ("repeats/0/summary.json", "observed_inputs.paths", "path"),
    ("repeats/0/summary.json", "placement.node", "string"),  # read into the verdict's split by node
    ("repeats/0/stdout.txt", "", "pattern"), ("inputs.json", "*", "path"), ("data-specs.json", "*", "path"),
    ("manifest.json", "facets.data.entries.0.path", "path"), ("manifest.json", "facets.data.entries.0.size", "count"),
    ("manifest.json", "facets.seeds.repeats", "count"), ("manifest.json", "facets.hardware.cpu.model", "string"),
    ("source.json", "*", "path"),
]
PUBLICATION_FIELDS = [
    ("published.yaml", "benchmark", "string"), ("published.yaml", "source.citation", "string"),
    ("published.yaml", "metrics.accuracy.values", "count"), ("published.yaml", "metrics.accuracy.margin", "count"),
    ("published.yaml", "recipe", "string"), ("published.yaml", "manifest", "path"), ("published.yaml", "notes", "string"),
    ("publication.json", "archive.name", "path"), ("publication.json", "files.recipe", "path"),
    ("publication.json", "files.published", "path"), ("publication.json", "recipe_name", "string"),
    ("recipe.yaml", "metrics.accuracy.regex", "pattern"), ("recipe.yaml", "repeats", "count"),
    ("recipe.yaml", "fixed.command", "path"), ("recipe.yaml", "fixed.model", "string"),
    ("recipe.yaml", "fixed.workdir", "path"),  # where reproduce places the source and runs the command
]
# the packed run inside a publication: changed, packed again, and publication.json's digest of it updated
ARCHIVED_FIELDS = [("archive/" + file, keys, kind) for file, keys, kind in RUN_FIELDS
                   if file in ("recipe.yaml", "run.json", "summary.json", "chain.jsonl", "repeats/0/stdout.txt")]
FIELDS = (_fields("run", RUN_FIELDS) + _fields("packed", RUN_FIELDS)
          + _fields("publication", PUBLICATION_FIELDS + ARCHIVED_FIELDS))
# a link in place of a file: to the reader's own file, or to a file with the same bytes outside
LINKS = [Field("run", "recipe.yaml", (), "link"), Field("run", "repeats/0/stdout.txt", (), "link"),
         Field("publication", "published.yaml", (), "link"), Field("publication", "recipe.yaml", (), "link"),
         Field("packed", "repeats/0/summary.json", (), "link")]
COMMANDS = {
    "run": [["verify", "{run}", "--no-write"], ["report", "{run}"], ["diff", "{run}", "{ref}"],
            ["history", "{runs}", "accuracy"], ["plan", "{run}"], ["export", "mlperf", "{run}", "--out", "exported"],
            ["verify", "{ref}", "--against", "{run}", "--no-write"], ["locate", "{run}", "{ref}"], ["status", "{run}"]],
    "packed": [["verify", "{packed}"], ["unpack", "{packed}", "--dest", "unpacked"], ["locate", "{packed}", "{ref}"],
               ["report", "{packed}"]],
    "publication": [["verify", "{pub}"], ["verify", "{ref}", "--against", "{pub}/published.yaml", "--no-write"],
                    ["reproduce", "{pub}", "--out", "rerun"]],
}


# ----- changing one field, and re-sealing as a publisher can ----------------------------------
def _set(doc: Any, keys: tuple[Any, ...], value: Any) -> Any:
    """``doc`` with the value at ``keys`` replaced (``"*"``: every element or entry)."""
    if not keys:
        return value
    head, rest = keys[0], keys[1:]
    if head == "*":
        if isinstance(doc, list):
            return [_set(item, rest, value) for item in doc] or [value]
        if isinstance(doc, dict):
            return {k: _set(v, rest, value) for k, v in doc.items()} or {"x": value}
        return value
    if isinstance(head, int):  # an entry of a list: the first, made when the list is empty
        items = list(doc) if isinstance(doc, list) and doc else [{"path": "data.bin", "kind": "file", "hash": "md5",
                                                                   "md5": "0" * 32, "size": 4, "nfiles": 1}]
        items[min(head, len(items) - 1)] = _set(items[min(head, len(items) - 1)], rest, value)
        return items
    if not isinstance(doc, dict):
        doc = {}
    return {**doc, head: _set(doc.get(head), rest, value)}


def change(root: Path, field: Field, value: Any) -> None:
    """Set ``field`` of the files under ``root`` to ``value`` (a text file: its content)."""
    path = root / field.file
    if field.file.endswith(".txt"):
        path.write_text(f"acc 0.91\n{value if isinstance(value, str) else repr(value)}\n" + "a" * 4000 + "\n")
    elif field.file == "chain.jsonl":
        relink(root, value)
    elif field.file.endswith(".yaml"):
        path.write_text(yaml.safe_dump(_set(yaml.safe_load(path.read_text()), field.keys, value)))
    else:
        path.write_text(json.dumps(_set(json.loads(path.read_text()), field.keys, value)))
    if field.file == "manifest.json":
        reseal_manifest(root)


def reseal_manifest(root: Path) -> None:
    """manifest.json's digest recomputed, and the chain started again from it (as a forger would)."""
    doc = json.loads((root / "manifest.json").read_text())
    doc["digest"] = {**doc.get("digest", {}), "value": canonical_digest({k: v for k, v in doc.items() if k != "digest"})}
    (root / "manifest.json").write_text(json.dumps(doc))
    if (root / "chain.jsonl").is_file():
        records = [json.loads(line) for line in (root / "chain.jsonl").read_text().splitlines() if line.strip()]
        records[0]["prev"] = doc["digest"]["value"]
        (root / "chain.jsonl").write_bytes(b"".join(canonical_json(r) + b"\n" for r in records))
        relink(root, records[0].get("planned"))


def relink(root: Path, planned: Any) -> None:
    """chain.jsonl starting from ``planned`` repeats, every link recomputed as a forger would."""
    records = [json.loads(line) for line in (root / "chain.jsonl").read_text().splitlines() if line.strip()]
    prev = None
    for i, record in enumerate(records):
        record.pop("link", None)
        if i == 0:
            record["planned"] = planned
        else:
            record["prev"] = prev
        record["link"] = prev = canonical_digest(record)
    (root / "chain.jsonl").write_bytes(b"".join(canonical_json(r) + b"\n" for r in records))


def link_in_place(root: Path, rel: str, outside: Path) -> None:
    """``rel`` replaced by a link to a file outside with the same bytes (the digest still matches)."""
    path = root / rel
    outside.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(outside)


def reseal_publication(pub: Path) -> None:
    """SHA256SUMS over every file of the publication, as ``sha256sum`` writes it (through links)."""
    lines = []
    for path in sorted(pub.rglob("*")):
        rel = path.relative_to(pub).as_posix()
        if rel != "SHA256SUMS" and path.is_file():
            lines.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {rel}\n")
    (pub / "SHA256SUMS").write_text("".join(lines))


def pack(run: Path, archive: Path) -> None:
    """The run directory as a packed run (``<run id>/...`` in a gzip tar), links kept as links."""
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(run, arcname=run.name)


def build(case_dir: Path, base: dict[str, Path], field: Field, value: Any) -> dict[str, str]:
    """The changed, re-sealed copy of the case's form under ``case_dir``; the command's
    placeholders (``{run}``, ``{packed}``, ``{pub}``, ``{ref}``, ``{runs}``)."""
    runs = case_dir / "runs"
    run = runs / base["run"].name
    shutil.copytree(base["run"], run, symlinks=True)
    shutil.copytree(base["ref"], runs / "ref", symlinks=True)
    names = {"run": str(run), "ref": str(runs / "ref"), "runs": str(runs), "packed": str(case_dir / "x.tar.gz"),
             "pub": str(case_dir / "pub")}
    if field.form in ("run", "packed"):
        _mutate(run, field, value, case_dir)
        if field.form == "packed":
            pack(run, case_dir / "x.tar.gz")
        return names
    pub = case_dir / "pub"
    shutil.copytree(base["pub"], pub, symlinks=True)
    if field.kind == "link":
        link_in_place(pub, field.file, case_dir / f"outside-{Path(field.file).name}")
    elif field.file.startswith("archive/"):
        mutate_archived(pub, Field("run", field.file[len("archive/"):], field.keys, field.kind), value, case_dir)
    else:
        change(pub, field, value)
    reseal_publication(pub)
    return names


def mutate_archived(pub: Path, field: Field, value: Any, case_dir: Path) -> None:
    """The publication's packed run unpacked, changed and re-sealed, packed again in its place."""
    doc = json.loads((pub / "publication.json").read_text())
    archive = pub / doc["archive"]["name"]
    with tarfile.open(archive) as tar:
        tar.extractall(case_dir / "archived", filter="data")
    run = next((case_dir / "archived").iterdir())
    _mutate(run, field, value, case_dir)
    pack(run, archive)
    doc["archive"].update(sha256=hashlib.sha256(archive.read_bytes()).hexdigest(), bytes=archive.stat().st_size)
    doc["sums_digest"] = hashlib.sha256((run / "SHA256SUMS").read_bytes()).hexdigest()
    manifest = json.loads((run / "manifest.json").read_text())
    doc["manifest_digest"] = (manifest.get("digest") or {}).get("value")
    (pub / "publication.json").write_text(json.dumps(doc, indent=2))


def _mutate(run: Path, field: Field, value: Any, case_dir: Path) -> None:
    if field.kind != "link":
        change(run, field, value)
    bundle.write_sums(run)  # refuses a link that leaves the run: the link comes after
    if field.kind == "link":
        link_in_place(run, field.file, case_dir / f"outside-{Path(field.file).name}")


# ----- running one command under limits, and judging it ---------------------------------------
def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_S, CPU_S))
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def run_command(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str] | None:
    """``repro500 ARGV`` in ``cwd`` with HOME there too, under the limits; None when it ran past
    the wall limit (killed)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", HOME=str(cwd), COLUMNS="80", MLFLOW_TRACKING_URI=f"file:{cwd}/mlruns")
    try:
        return subprocess.run([sys.executable, "-m", "repro500.cli", *argv], cwd=cwd, env=env, capture_output=True,
                              text=True, errors="surrogateescape", timeout=WALL_S, preexec_fn=_limits)
    except subprocess.TimeoutExpired:
        return None


def broken(done: subprocess.CompletedProcess[str] | None, marker: Path, verdict: bool) -> str | None:
    """Which invariant the outcome breaks (a sentence), or None; ``verdict``: the command prints a
    verdict, whose line must be its first and agree with its exit status."""
    if marker.exists():
        return f"a planted module ran ({marker} was written)"
    if done is None:
        return f"ran past the {WALL_S} s wall limit"
    text = done.stdout + done.stderr
    # a verdict's own first line may read REPRODUCED (exact); every other line is checked
    lines = done.stdout.splitlines()[1 if verdict else 0:] + done.stderr.splitlines()
    if done.returncode not in EXIT_CODES:
        return f"exit code {done.returncode} (CPU {CPU_S} s / memory {MEMORY >> 30} GiB limits, or a crash)"
    if "Traceback" in text or "MemoryError" in text:
        where = [line.strip() for line in text[text.find("Traceback"):].splitlines() if line.strip(" ^\n")]
        return "a traceback: " + " / ".join(where[-3:])[:600]
    if found := RAW.search(text):
        return f"a raw control character {found.group()!r} reached the terminal"
    first = done.stdout.splitlines()[0] if verdict and done.stdout.strip() else ""
    if re.match(r"(REPRODUCED|PASS)\b", first) and done.returncode != 0:
        return f"the verdict reads {first[:40]!r} but the command exited {done.returncode}"
    for line in lines:
        if line.lstrip().startswith(PAYLOAD_STARTS):
            return f"a line starts with a payload: {line[:80]!r}"
        if verdict and re.match(r"\s*(REPRODUCED|PASS)\b", line):
            return f"a line after the verdict's reads {line[:40]!r}"
    return None


def snapshot(root: Path) -> dict[str, str]:
    """Every file and link under ``root`` with its content's digest (or its target)."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out
