"""Every command that vouches for a run refuses what ``repro500 verify`` calls INVALID, with its sentence.

Known answers: one finished tiny run (two repeats, one epoch on the CPU, made once for the module)
is copied and broken in each way verify detects; verify's first reason is the sentence written
here, and publish, pack, sign, export mlperf and reproduce of the packed run each exit 4 with that
same sentence and write nothing.  A second copy, signed, is broken through its attestation.
"""

from __future__ import annotations

import base64
import json
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.runs import invoke, write_recipe

from repro500.attest import keys
from repro500.attest.attestation import ATTESTATION_NAMES, ENVELOPE_NAME
from repro500.digest import file_digest
from repro500.errors import EXIT_INVALID
from repro500.rundir import sums as bundle
from repro500.verify.integrity import intact_problems
from repro500.verify.vouching import sign_run

SMALL_DATA = {"train_samples": 64, "eval_samples": 32, "size": "16x16", "noise": 0.04, "seed": 3}
PRINCIPAL = "alice@example.org"


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A real finished run with a repeat chain and MLPerf logs (export needs them); about 5 s."""
    from repro500.runner import RunOptions, run

    where = tmp_path_factory.mktemp("finished")
    recipe = write_recipe(where / "tiny.yaml", repeats=2, fixed__epochs=1, fixed__dataset__params=SMALL_DATA)
    outcome = run(RunOptions(recipe=str(recipe), tracking=False, run_id="tiny", out_dir=str(where / "runs")))
    root = outcome.run_dir
    assert (root / "chain.jsonl").is_file() and (root / "repeats/1/mllog.txt").is_file()
    assert intact_problems(root) == []  # the control: an untouched run passes the gate
    return root


@pytest.fixture(scope="module")
def key(tmp_path_factory) -> Path:
    """An OpenSSH Ed25519 private key, as ssh-keygen -t ed25519 writes it."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = tmp_path_factory.mktemp("key") / "id_ed25519"
    path.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def signed(finished, key, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("signed") / finished.name
    shutil.copytree(finished, root)
    sign_run(root, key, PRINCIPAL)
    assert intact_problems(root) == []  # a signed, untouched run passes: the attestation holds
    return root


# ------------------------------------------------------------------------------ ways to break a run


def _edit_json(path: Path, change: Callable[[dict], None]) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def _reseal_line(root: Path, rel: str) -> None:
    """Rewrite one file's line of SHA256SUMS, as someone who edited it by hand would."""
    sums = root / bundle.SUMS_NAME
    lines = [f"{file_digest(root / rel)}  {rel}" if line.endswith(f"  {rel}") else line
             for line in sums.read_text().splitlines()]
    sums.write_text("\n".join(lines) + "\n")


def edited_file(root: Path) -> None:
    with open(root / "repeats/0/metrics.jsonl", "a") as fh:
        fh.write('{"kind": "note"}\n')


def resealed_digest_list(root: Path) -> None:
    """A number of the aggregate changed and the whole digest list written again."""
    _edit_json(root / "summary.json", lambda d: d["metrics"]["accuracy"]["values"].__setitem__(0, 0.99))
    bundle.write_sums(root)


def dropped_repeat(root: Path) -> None:
    shutil.rmtree(root / "repeats" / "1")
    bundle.write_sums(root)


def replaced_repeat(root: Path) -> None:
    """The finding as reported: repeats/1/summary.json edited and its SHA256SUMS line rewritten."""
    _edit_json(root / "repeats/1/summary.json", lambda d: d["metrics"].update(accuracy=0.99))
    _reseal_line(root, "repeats/1/summary.json")


def envelope_edited(root: Path) -> None:
    path = root / ENVELOPE_NAME
    envelope = json.loads(path.read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["repeats"]["planned"] = 1
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    path.write_text(json.dumps(envelope) + "\n")


def resealed_after_signing(root: Path) -> None:
    edited_file(root)
    bundle.write_sums(root)


# (how, signed copy?, verify's first reason: the known answer)
BREAKS = [
    (edited_file, False, "files do not match SHA256SUMS (edited: repeats/0/metrics.jsonl)"),
    (resealed_digest_list, False, "summary.json: metrics.accuracy says [0.99, "),
    (dropped_repeat, False, "repeat 1 is missing: chain.jsonl records it (completed) but repeats/1/summary.json is gone"),
    (replaced_repeat, False, "repeat 1 was replaced: repeats/1/summary.json is not the summary chained when it finished"),
    (envelope_edited, True, "the signature in attestation.intoto.jsonl does not verify with the key it names: "
                            "the envelope was edited or forged"),
    (resealed_after_signing, True, "changed after signing (digest differs from the signed statement): "
                                   "SHA256SUMS, repeats/0/metrics.jsonl"),
]


def _packed(root: Path, archive: Path) -> Path:
    """The broken run as an archive; written directly, since ``repro500 pack`` refuses it now."""
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(root, arcname=root.name)
    return archive


def _attestation(root: Path) -> dict[str, bytes]:
    return {name: (root / name).read_bytes() for name in sorted(ATTESTATION_NAMES) if (root / name).is_file()}


@pytest.mark.parametrize(("breaks", "on_signed", "sentence"), BREAKS, ids=[b[0].__name__ for b in BREAKS])
def test_every_vouching_command_refuses_with_the_sentence_verify_prints(
        breaks, on_signed, sentence, finished, signed, key, in_tmp):
    tmp_path = in_tmp  # the working directory too: what a refusing command wrongly wrote there stays here
    root = tmp_path / finished.name
    shutil.copytree(signed if on_signed else finished, root)
    breaks(root)

    verdict = invoke("verify", root, "--no-write", "--json")
    assert verdict.exit_code == EXIT_INVALID, verdict.output
    first = json.loads(verdict.output)["reasons"][0]
    assert first.startswith(sentence), first
    if on_signed:  # verify --trust names the change once, though two of its checks see it
        trust = tmp_path / "allowed_signers"
        public = keys.openssh_public(keys.load_private_key(key).public_key())
        trust.write_text(f'{PRINCIPAL} namespaces="repro500" {public}\n')
        trusted = invoke("verify", root, "--no-write", "--json", "--trust", trust)
        reasons = json.loads(trusted.output)["reasons"]
        assert trusted.exit_code == EXIT_INVALID and len(reasons) == len(set(reasons)), reasons

    archive = _packed(root, tmp_path / "broken.tar.gz")
    attestation = _attestation(root)
    commands = {
        "publish": (("publish", root, "--out", tmp_path / "pub"), tmp_path / "pub"),
        "pack": (("pack", root, "-o", tmp_path / "run.tar.gz"), tmp_path / "run.tar.gz"),
        "sign --force": (("sign", root, "--key", key, "--principal", PRINCIPAL, "--force"), None),
        "export mlperf": (("export", "mlperf", root, "--out", tmp_path / "sub", "--no-check"), tmp_path / "sub"),
        "reproduce (packed run)": (("reproduce", archive, "--out", tmp_path / "rep"), tmp_path / "rep"),
    }
    present = set(tmp_path.iterdir())
    wrong = []
    for name, (args, written) in commands.items():
        result = invoke(*args)
        if result.exit_code != EXIT_INVALID or first not in result.text or "Traceback" in result.text:
            wrong.append(f"{name}: exit {result.exit_code}: {result.text[-300:]}")
        elif written is not None and written.exists():
            wrong.append(f"{name}: refused, but wrote {written}")
    assert _attestation(root) == attestation, "sign wrote its attestation into a run it refused"
    assert not wrong, "\n".join(wrong)
    assert set(tmp_path.iterdir()) == present  # no staging directory or partial output either
