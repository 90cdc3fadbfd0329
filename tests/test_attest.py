"""Signed in-toto attestations and the repeat chain (repro500.attest, `repro500 sign`, `verify --trust`).

Keys are made by the real ``ssh-keygen``; run directories are fabricated (helpers/rundirs.py),
so nothing here trains.  Each hostile case names the problem it must produce.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.keys import make_key, ssh_keygen, trust_line, write_trust
from helpers.rundirs import edit_json, make_run
from helpers.runs import invoke
from helpers.stores import mlflow_store

from repro500 import cli
from repro500.attest import chain, keys, sshsig
from repro500.attest.attestation import (
    ATTESTATION_NAMES,
    ENVELOPE_NAME,
    SSHSIG_NAME,
    verify_signature,
)
from repro500.errors import InvalidInput
from repro500.rundir import archive as archives
from repro500.rundir import sums as bundle
from repro500.verify.integrity import check_run
from repro500.verify.vouching import sign_run


@pytest.fixture(autouse=True)
def attestation_uncovered(monkeypatch):
    """The attestation signs SHA256SUMS, so SHA256SUMS must not cover it (bundle.DERIVED_NAMES)."""
    assert ATTESTATION_NAMES <= bundle.DERIVED_NAMES
    monkeypatch.delenv(keys.PASSPHRASE_ENV, raising=False)
    monkeypatch.delenv(keys.KEY_ENV, raising=False)


def chained_run(parent: Path, name: str = "run-a", **kwargs) -> Path:
    """A fabricated run whose chain was written as the runner writes it: start, one link a repeat."""
    root = make_run(parent, name, **kwargs)
    manifest = json.loads((root / "manifest.json").read_text())
    planned = json.loads((root / "run.json").read_text())["repeats"]
    chain.start(root, manifest["digest"]["value"], planned)
    for k in range(planned):
        chain.append(root, k, bundle.repeat_dir(root, k) / "summary.json")
    bundle.write_sums(root)
    return root


@pytest.fixture
def signed(tmp_path):
    key = make_key(tmp_path)
    root = chained_run(tmp_path)
    sign_run(root, key, "alice@example.org")
    return root, key, write_trust(tmp_path, trust_line(key))


def _statement(root: Path) -> bytes:
    return base64.b64decode(json.loads((root / ENVELOPE_NAME).read_text())["payload"])


# ---------------------------------------------------------------------------- round trip


def test_sign_then_verify_names_the_signer(signed):
    root, key, trust = signed
    result = verify_signature(root, trust)
    assert result.valid, result.problems
    assert result.principal == "alice@example.org"
    printed = subprocess.run([ssh_keygen(), "-l", "-f", str(key.with_suffix(".pub"))], capture_output=True, text=True)
    assert result.fingerprint == printed.stdout.split()[1]
    assert bundle.check_sums(root).ok  # the attestation is not a file SHA256SUMS should list


def test_statement_is_in_toto_v1_with_every_sealed_file_as_subject(signed):
    root, _, _ = signed
    statement = json.loads(_statement(root))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    names = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    assert names == {**bundle.read_sums(root), "SHA256SUMS": bundle.file_digest(root / "SHA256SUMS")}
    assert "chain.jsonl" in names
    predicate = statement["predicate"]
    assert predicate["repeats"] == {"planned": 3, "finished": 3,
                                    "status": {"0": "completed", "1": "completed", "2": "completed"}}
    assert predicate["chain"]["head"] == chain.head(root)
    assert predicate["manifest"]["digest"]["sha256"] == json.loads((root / "manifest.json").read_text())["digest"]["value"]
    attestation = pytest.importorskip("in_toto_attestation.v1.statement")
    from google.protobuf import json_format
    from in_toto_attestation.v1 import statement_pb2

    attestation.Statement.copy_from_pb(json_format.ParseDict(statement, statement_pb2.Statement())).validate()


def test_envelope_verifies_with_securesystemslib_alone(signed):
    from cryptography.hazmat.primitives.serialization import load_ssh_public_key
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import SSlibKey

    root, key, _ = signed
    envelope = Envelope.from_dict(json.loads((root / ENVELOPE_NAME).read_text()))
    assert envelope.payload_type == "application/vnd.in-toto+json"
    public = SSlibKey.from_crypto(load_ssh_public_key(key.with_suffix(".pub").read_bytes()))
    assert list(envelope.verify([public], 1)) == [public.keyid]


def test_ssh_keygen_verifies_what_repro500_signs(signed, tmp_path):
    root, _, trust = signed
    command = [ssh_keygen(), "-Y", "verify", "-f", str(trust), "-I", "alice@example.org", "-n", "repro500",
               "-s", str(root / SSHSIG_NAME)]
    good = subprocess.run(command, input=_statement(root), capture_output=True)
    assert good.returncode == 0, good.stderr
    assert b'Good "repro500" signature for alice@example.org' in good.stdout
    bad = subprocess.run(command, input=_statement(root).replace(b"completed", b"Completed", 1), capture_output=True)
    assert bad.returncode != 0


def test_sshsig_reads_what_ssh_keygen_signs(tmp_path):
    key = make_key(tmp_path)
    message = tmp_path / "msg"
    message.write_bytes(b"hello")
    subprocess.run([ssh_keygen(), "-Y", "sign", "-f", str(key), "-n", "repro500", str(message)],
                   check=True, capture_output=True)
    armored = (tmp_path / "msg.sig").read_text()
    public = sshsig.verify(armored, b"hello")
    assert keys.openssh_public(public) == " ".join(key.with_suffix(".pub").read_text().split()[:2])
    with pytest.raises(ValueError, match="does not match"):
        sshsig.verify(armored, b"hellO")
    with pytest.raises(ValueError, match="namespace"):
        sshsig.verify(armored, b"hello", namespace="git")


# ---------------------------------------------------------------------------- hostile inputs


def test_forged_envelope_payload_edited(signed):
    root, _, trust = signed
    path = root / ENVELOPE_NAME
    envelope = json.loads(path.read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["repeats"]["planned"] = 2
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    path.write_text(json.dumps(envelope))
    result = verify_signature(root, trust)
    assert not result.valid
    assert "does not verify: the envelope was edited or forged" in result.problems[0]


def test_signature_by_an_untrusted_key(tmp_path):
    alice, mallory = make_key(tmp_path, "alice"), make_key(tmp_path, "mallory")
    root = chained_run(tmp_path)
    sign_run(root, mallory, "alice@example.org")
    result = verify_signature(root, write_trust(tmp_path, trust_line(alice)))
    assert not result.valid
    fp = keys.fingerprint(keys.load_private_key(mallory).public_key())
    assert result.problems == [f"the run is signed by key {fp} (it names itself 'alice@example.org'), "
                               f"which {tmp_path / 'allowed_signers'} does not trust"]


def test_subject_digest_swapped_after_signing(signed):
    root, _, trust = signed
    edit_json(root / "repeats" / "1" / "summary.json", lambda d: d["metrics"].update(accuracy=0.99))
    result = verify_signature(root, trust)
    assert result.problems == ["changed after signing (digest differs from the signed statement): repeats/1/summary.json"]
    bundle.write_sums(root)  # a forger re-seals: SHA256SUMS itself is then not the signed one
    result = verify_signature(root, trust)
    assert any("repeats/1/summary.json" in p and "SHA256SUMS" in p for p in result.problems), result.problems


def test_subjects_must_equal_the_sha256sums_set(signed):
    root, _, trust = signed
    (root / "notes.txt").write_text("added later\n")
    bundle.write_sums(root)
    problems = verify_signature(root, trust).problems
    assert "listed in SHA256SUMS but not signed: notes.txt" in problems[0]


def test_chain_link_removed_and_resealed(signed):
    root, _, trust = signed
    path = root / chain.CHAIN_NAME
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[1], lines[3]]) + "\n")
    bundle.write_sums(root)
    problems = chain.check(root)
    assert problems == ["chain.jsonl line 3 (repeat 2) does not follow the line before it: "
                        "a link was removed, reordered or inserted",
                        "repeat 1 has a summary.json but no link in chain.jsonl: it was added or replaced after it ran"]
    assert not verify_signature(root, trust).valid


def test_repeat_dropped_and_resealed_is_caught_by_chain_and_signature(signed):
    root, _, trust = signed
    shutil.rmtree(root / "repeats" / "2")

    def drop(doc):
        doc["repeats"].pop("2")
        doc["repeats_planned"] = 2
    edit_json(root / "summary.json", drop)
    bundle.write_sums(root)
    assert bundle.check_sums(root).ok
    assert "repeat 2 is missing: chain.jsonl records it (completed) but repeats/2/summary.json is gone" in chain.check(root)
    assert not verify_signature(root, trust).valid
    # the forger also cuts the last link: the planned count still accounts for repeat 2
    path = root / chain.CHAIN_NAME
    path.write_text("\n".join(path.read_text().splitlines()[:-1]) + "\n")
    edit_json(root / "summary.json", lambda d: d.update(repeats_planned=3))
    bundle.write_sums(root)
    assert chain.check(root) == ["repeat 2 was planned but is not accounted for: no link in chain.jsonl and no summary"]


def test_chain_catches_replaced_reordered_extra_and_miscounted_repeats(tmp_path):
    root = chained_run(tmp_path)
    assert chain.check(root) == []
    edit_json(root / "repeats" / "0" / "summary.json", lambda d: d["metrics"].update(accuracy=0.5))
    assert chain.check(root) == ["repeat 0 was replaced: repeats/0/summary.json is not the summary chained when it finished"]

    root = chained_run(tmp_path, "reordered")
    path = root / chain.CHAIN_NAME
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[2], lines[1], lines[3]]) + "\n")
    assert [p.split(" does")[0] for p in chain.check(root)] == [
        "chain.jsonl line 2 (repeat 1)", "chain.jsonl line 3 (repeat 0)", "chain.jsonl line 4 (repeat 2)"]

    root = chained_run(tmp_path, "extra")
    shutil.copytree(root / "repeats" / "2", root / "repeats" / "3")
    edit_json(root / "run.json", lambda d: d.update(repeats=2))
    assert chain.check(root) == ["chain.jsonl says 3 repeats were planned, run.json says 2",
                                 "repeat 3 is extra: only 3 repeats were planned"]

    root = chained_run(tmp_path, "edited-line")
    path = root / chain.CHAIN_NAME
    path.write_text(path.read_text().replace('"completed"', '"diverged"', 1))
    assert chain.check(root)[0] == "chain.jsonl line 2 (repeat 0) was edited: its link digest does not match its content"


def test_rerun_repeat_appends_and_the_latest_link_wins(tmp_path):
    root = make_run(tmp_path, statuses=["completed", "killed", "completed"])
    digest = json.loads((root / "manifest.json").read_text())["digest"]["value"]
    chain.start(root, digest, 3)
    for k in range(3):
        chain.append(root, k, bundle.repeat_dir(root, k) / "summary.json")
    assert chain.start(root, digest, 3)["kind"] == "start"  # a resumed run keeps its chain
    edit_json(root / "repeats" / "1" / "summary.json", lambda d: d.update(status="completed"))
    assert chain.check(root) == ["repeat 1 was replaced: repeats/1/summary.json is not the summary chained when it finished"]
    chain.append(root, 1, bundle.repeat_dir(root, 1) / "summary.json")
    assert chain.check(root) == []
    assert len((root / chain.CHAIN_NAME).read_text().splitlines()) == 5
    with pytest.raises(InvalidInput, match="not the one being resumed"):
        chain.start(root, digest, 4)


def test_interrupted_run_need_not_account_for_repeats_never_started(tmp_path):
    root = make_run(tmp_path)
    edit_json(root / "run.json", lambda d: d.update(status="interrupted"))
    shutil.rmtree(root / "repeats" / "2")
    chain.start(root, json.loads((root / "manifest.json").read_text())["digest"]["value"], 3)
    for k in range(2):
        chain.append(root, k, bundle.repeat_dir(root, k) / "summary.json")
    assert chain.check(root) == []
    edit_json(root / "run.json", lambda d: d.update(status="completed"))
    assert chain.check(root) == ["repeat 2 was planned but is not accounted for: no link in chain.jsonl and no summary"]


def test_ssh_signature_that_disagrees_with_the_envelope(signed, tmp_path):
    root, _, trust = signed
    other = make_key(tmp_path, "other")
    (root / SSHSIG_NAME).write_text(sshsig.sign(_statement(root), keys.load_private_key(other)))
    assert "attestation.sig is signed by another key" in verify_signature(root, trust).problems[0]
    (root / SSHSIG_NAME).write_text(sshsig.sign(b"something else", keys.load_private_key(other)))
    assert "does not sign the attested statement" in verify_signature(root, trust).problems[0]
    (root / SSHSIG_NAME).unlink()
    result = verify_signature(root, trust)
    assert result.valid and "ssh-keygen -Y verify cannot check" in result.notes[0]


def test_claimed_principal_must_be_one_the_key_is_trusted_for(tmp_path):
    key = make_key(tmp_path)
    root = chained_run(tmp_path)
    sign_run(root, key, "bob@example.org")
    result = verify_signature(root, write_trust(tmp_path, trust_line(key)))
    assert "is trusted for alice@example.org, not for the principal 'bob@example.org'" in result.problems[0]


def test_unsigned_run(tmp_path):
    root = chained_run(tmp_path)
    key = make_key(tmp_path)
    result = verify_signature(root, write_trust(tmp_path, trust_line(key)))
    assert result.problems == ["the run is not signed: attestation.intoto.jsonl is missing (sign it with `repro500 sign`)"]


def test_an_unsigned_runs_verdict_needs_no_signature_machinery_and_a_lone_signature_is_still_caught(tmp_path):
    root = chained_run(tmp_path)
    probe = ("import sys; from repro500.verify.judge import verdict_for; verdict_for(sys.argv[1]); "
             "print(sorted({'cryptography', 'securesystemslib'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe, str(root)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]"]
    (root / "attestation.sig").write_text("-----BEGIN SSH SIGNATURE-----\n")  # half a signature is still looked at
    result, _ = check_run(root)
    assert result.problems == ["attestation.intoto.jsonl is missing beside attestation.sig: the attestation is incomplete"]


# ---------------------------------------------------------------------------- keys


def test_passphrase_key(tmp_path, monkeypatch):
    key = make_key(tmp_path, passphrase="correct horse")
    root = chained_run(tmp_path)
    with pytest.raises(InvalidInput, match="is protected by a passphrase: set REPRO500_SIGNING_KEY_PASSPHRASE"):
        sign_run(root, key)
    monkeypatch.setenv(keys.PASSPHRASE_ENV, "wrong")
    with pytest.raises(InvalidInput, match="the passphrase in REPRO500_SIGNING_KEY_PASSPHRASE is wrong"):
        sign_run(root, key)
    monkeypatch.setenv(keys.PASSPHRASE_ENV, "correct horse")
    sign_run(root, key)
    assert verify_signature(root, write_trust(tmp_path, trust_line(key))).valid


def test_keys_that_cannot_sign_are_one_sentence(tmp_path):
    rsa = make_key(tmp_path, "rsa", kind="rsa")
    with pytest.raises(InvalidInput, match="is an RSA key, not Ed25519: make one with ssh-keygen -t ed25519"):
        keys.load_private_key(rsa)
    with pytest.raises(InvalidInput, match=r"is a public key: give the private key \(the file without .pub\)"):
        keys.load_private_key(rsa.with_suffix(".pub"))
    with pytest.raises(InvalidInput, match=r"signing key /dev/null/key cannot be read \(Not a directory\)"):
        keys.load_private_key("/dev/null/key")
    (tmp_path / "junk").write_text("not a key\n")
    with pytest.raises(InvalidInput, match="is not a private key repro500 can read"):
        keys.load_private_key(tmp_path / "junk")


def test_allowed_signers_format(tmp_path):
    alice, bob = make_key(tmp_path, "alice"), make_key(tmp_path, "bob")
    rsa = make_key(tmp_path, "rsa", kind="rsa")
    pub = {k: " ".join(p.with_suffix(".pub").read_text().split()[:2]) for k, p in
           {"alice": alice, "bob": bob, "rsa": rsa}.items()}
    path = write_trust(
        tmp_path,
        "# team keys",
        "",
        f'alice@example.org,"a.l.ice@lab.example" namespaces="git,repro500" {pub["alice"]} alice laptop',
        f'*@example.org,!mallory@example.org {pub["bob"]}',
        f'carol@example.org {pub["rsa"]}',
        f'ca@example.org cert-authority {pub["alice"]}',
        f'old@example.org valid-before="20200101" {pub["alice"]}',
        f'git-only@example.org namespaces="git" {pub["bob"]}',
    )
    entries = keys.parse_allowed_signers(path)
    assert [e.line for e in entries] == [3, 4, 5, 6, 7, 8]
    assert entries[0].principals == ["alice@example.org", "a.l.ice@lab.example"]
    assert entries[0].options == {"namespaces": "git,repro500"}
    assert entries[1].allows_principal("bob@example.org") and not entries[1].allows_principal("mallory@example.org")
    assert entries[2].public_key is None and entries[3].public_key is None  # RSA, CA: never match
    alice_key = keys.load_private_key(alice).public_key()
    assert [e.line for e in keys.trusted_entries(entries, alice_key)] == [3]  # not CA, not expired
    assert keys.trusted_entries(entries, keys.load_private_key(bob).public_key())[0].line == 4  # not git-only


@pytest.mark.parametrize("line, reason", [
    ("alice@example.org", "expected: principals"),
    ("alice@example.org ssh-ed25519 !!!notbase64", "the key is not base64"),
    ("alice@example.org frobnicate ssh-ed25519 AAAA", "unknown option 'frobnicate'"),
    ("alice@example.org ssh-foo AAAA", "unknown key type 'ssh-foo'"),
    ('alice@example.org valid-after="tomorrow" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA', "is not YYYYMMDD"),
    ("alice@example.org ssh-ed25519 AAAAB3NzaC1yc2EAAAADAQABAAABAQ==", "does not hold a ssh-ed25519 key"),
])
def test_allowed_signers_bad_lines_name_file_and_line(tmp_path, line, reason):
    path = write_trust(tmp_path, "# first", line)
    with pytest.raises(InvalidInput, match=rf"allowed_signers:2 is not an allowed_signers entry \(.*{reason}"):
        keys.parse_allowed_signers(path)


def test_key_trusted_only_for_another_namespace(tmp_path):
    key = make_key(tmp_path)
    root = chained_run(tmp_path)
    sign_run(root, key, "alice@example.org")
    result = verify_signature(root, write_trust(tmp_path, trust_line(key, options='namespaces="git"')))
    assert "lists but not for namespace 'repro500'" in result.problems[0]


# ---------------------------------------------------------------------------- command line


def test_cli_sign_and_verify_trust(tmp_path, monkeypatch):
    key = make_key(tmp_path)
    root = chained_run(tmp_path)
    trust = write_trust(tmp_path, trust_line(key))
    assert "sign" in cli.COMMANDS
    assert invoke("sign", root).exit_code == 2  # no key anywhere
    unsigned = invoke("verify", root, "--trust", trust)
    assert unsigned.exit_code == 4 and "the run is not signed" in unsigned.text
    done = invoke("sign", root, "--principal", "alice@example.org", env={keys.KEY_ENV: str(key)})
    assert done.exit_code == 0, done.output
    assert 'trust line for allowed_signers: alice@example.org namespaces="repro500" ssh-ed25519 ' in done.text
    good = invoke("verify", root, "--trust", trust)
    assert good.exit_code == 0, good.output
    assert "signed by alice@example.org (SHA256:" in good.text
    as_json = json.loads(invoke("verify", root, "--trust", trust, "--json", "--no-write").output)
    assert as_json["integrity"]["notes"][0].startswith("signed by alice@example.org")
    other = make_key(tmp_path, "other")
    refused = invoke("sign", root, "--key", other)
    assert refused.exit_code == 4 and "already signed by SHA256:" in refused.text
    assert invoke("sign", root, "--key", other, "--force").exit_code == 0
    forced = invoke("verify", root, "--trust", trust)
    assert forced.exit_code == 4 and "which " in forced.text and "does not trust" in forced.text
    assert "Traceback" not in forced.text


def test_cli_chain_checked_without_trust_and_invalid_instead_of_the_verdict(tmp_path):
    root = chained_run(tmp_path)
    shutil.rmtree(root / "repeats" / "1")
    bundle.write_sums(root)
    result = invoke("verify", root, "--no-write")
    assert result.exit_code == 4
    assert "INVALID" in result.text and "repeat 1 is missing" in result.text


def test_cli_trust_needs_a_chain(tmp_path):
    key = make_key(tmp_path)
    root = make_run(tmp_path)  # as runs made before chains existed
    sign_run(root, key, "alice@example.org")
    result = invoke("verify", root, "--trust", write_trust(tmp_path, trust_line(key)), "--no-write")
    assert result.exit_code == 4 and "runs made before repro500 recorded repeat chains have none" in result.text


def test_signed_archive_verifies_with_trust(signed, tmp_path):
    root, key, trust = signed
    archive = archives.pack(root, tmp_path / "run.tar.gz")
    result = invoke("verify", archive, "--trust", trust)
    assert result.exit_code == 0, result.output
    # trusted means: the signer the trust file names, with the key it holds (its fingerprint as
    # ssh-keygen computes it, not as repro500 does)
    listed = subprocess.run([ssh_keygen(), "-l", "-f", str(key.with_suffix(".pub"))], capture_output=True, text=True,
                            check=True).stdout.split()[1]
    assert listed.startswith("SHA256:") and f"signed by alice@example.org ({listed}" in result.text, result.text
    # and a trust file that holds another key refuses the same archive
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    other = write_trust(elsewhere, trust_line(make_key(elsewhere, "other")))
    refused = invoke("verify", archive, "--trust", other)
    assert refused.exit_code == 4, refused.output
    assert f"the run is signed by key {listed} (it names itself 'alice@example.org'), which" in refused.text
    assert "does not trust" in refused.text and "signed by alice@example.org (" not in refused.text


def test_sign_refuses_a_run_that_does_not_match_its_sums(tmp_path):
    key = make_key(tmp_path)
    root = chained_run(tmp_path)
    (root / "recipe.yaml").write_text("edited: true\n")
    with pytest.raises(InvalidInput, match=r"would not verify \(files do not match SHA256SUMS \(edited: recipe.yaml\)\): refusing to sign"):
        sign_run(root, key)
    assert not (root / ENVELOPE_NAME).exists()


def test_sign_into_a_read_only_run_is_one_sentence(tmp_path):
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is missing")
    key = make_key(tmp_path)
    root = chained_run(tmp_path)
    os.chmod(root, 0o555)
    try:
        script = ("import sys; from repro500.cli import main; "
                  f"sys.argv = ['repro500', 'sign', {str(root)!r}, '--key', {str(key)!r}]; main()")
        prefix = ["setpriv", "--bounding-set=-dac_override", "--inh-caps=-dac_override"] if os.geteuid() == 0 else []
        proc = subprocess.run([*prefix, sys.executable, "-c", script], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent.parent)
    finally:
        os.chmod(root, 0o755)
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.strip().startswith("repro500: error: cannot write the attestation into")
    assert "Permission denied" in proc.stderr and "Traceback" not in proc.stderr
    assert not (root / ENVELOPE_NAME).exists()


# ---------------------------------------------------------------------------- MLflow as a second record


@pytest.mark.slow
def test_check_tracking_compares_each_repeat_with_mlflow(tmp_path, monkeypatch):
    from repro500.attest.tracking_check import check_tracking
    from repro500.tracking import client as tracking

    uri = mlflow_store(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    root = chained_run(tmp_path)
    tracker = tracking.Tracker("repro500/test")  # logs as the runner does
    tracker.start_parent("run-a", {}, {})
    ids = {}
    for k in range(3):
        ids[str(k)] = tracker.start_repeat(k, {})
        summary = json.loads((bundle.repeat_dir(root, k) / "summary.json").read_text())
        tracker.end_repeat(ids[str(k)], summary, [], "FINISHED")
    edit_json(root / "run.json", lambda d: d.update(mlflow={"tracking_uri": uri, "repeat_run_ids": ids}))
    bundle.write_sums(root)
    monkeypatch.delenv("MLFLOW_TRACKING_URI")  # run.json's URI is the one used
    result = check_tracking(root)
    assert (result.problems, result.compared) == ([], 3)

    edit_json(root / "repeats" / "1" / "summary.json", lambda d: d["metrics"].update(accuracy=0.99))
    shutil.rmtree(root / "repeats" / "2")
    assert check_tracking(root).problems == [
        "repeat 1: accuracy is 0.99 in the run directory, 0.94 in MLflow",
        "repeat 2 was recorded in MLflow (run " + ids["2"] + ") but repeats/2/summary.json is missing",
    ]
    bundle.write_sums(root)
    cli_result = invoke("verify", root, "--check-tracking", "--no-write")
    assert cli_result.exit_code == 4 and "repeat 1: accuracy is 0.99 in the run directory" in cli_result.text

    (tmp_path / "mlflow.db").rename(tmp_path / "moved.db")
    assert "does not exist here" in check_tracking(root).problems[0]
    assert not (tmp_path / "mlflow.db").exists()  # never an empty store made in its place
    edit_json(root / "run.json", lambda d: d.pop("mlflow"))
    assert "records no MLflow tracking store" in check_tracking(root).problems[0]



def _tracked_repeats(root: Path) -> tuple[dict[str, str], dict[str, dict]]:
    """Two repeats on disk, their MLflow run ids, and the runs/get answers that agree with them."""
    from helpers.fake_tracking import run_json

    from repro500.tracking import names

    tags = {names.NAMES_TAG: names.NAMES_VERSION, names.STATUS_TAG: "ok", names.FINAL_PARAM_DIGEST_TAG: "d1"}
    ids = {"0": "a" * 32, "1": "b" * 32}
    for k in ids:
        (root / "repeats" / k).mkdir(parents=True)
        (root / "repeats" / k / "summary.json").write_text(
            json.dumps({"status": "ok", "metrics": {"accuracy": 0.9}, "final_param_digest": "d1"}))
    return ids, {run_id: run_json(run_id, {"accuracy": 0.9}, tags) for run_id in ids.values()}


@pytest.mark.parametrize("server", ["slow", "failing", "missing"])
def test_a_store_that_answers_late_or_fails_is_never_read_as_a_run_it_lacks(tmp_path, monkeypatch, server):
    # four verifies at once against one busy server: a get_run past the pre-flight's short timeout
    # was reported as "not in the store", and the run called INVALID for a record it has
    from helpers.fake_tracking import FakeTrackingServer

    from repro500.attest.tracking_check import check_tracking
    from repro500.tracking import store as mlflow_store

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(mlflow_store, "HEALTH_CONNECT_S", 1)  # what a read in a hurry would time out after
    if server == "failing":
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the user's own setting is kept
    root = tmp_path / "run"
    ids, runs = _tracked_repeats(root)
    options = {"slow": {"runs": runs, "run_delay_s": 2.5},
               "failing": {"runs": runs, "run_status": 500},
               "missing": {"runs": {ids["0"]: runs[ids["0"]]}}}[server]
    with FakeTrackingServer(**options) as fake:
        (root / "run.json").write_text(json.dumps({"mlflow": {"tracking_uri": fake.uri, "repeat_run_ids": ids}}))
        result = check_tracking(root)
    if server == "slow":
        assert (result.problems, result.compared) == ([], 2)
    elif server == "failing":
        assert len(result.problems) == 1, result.problems
        assert re.fullmatch(r"MLflow run a{32} could not be read from http://127\.0\.0\.1:\d+ \(.*\): "
                            r"the repeats were not compared with their tracking records", result.problems[0])
    else:
        assert result.problems == [f"repeat 1: MLflow run {ids['1']} is not in the store"], result.problems
