"""``repro500 sign``: a thin wrapper over repro500.verify.vouching.sign_run."""

from __future__ import annotations

import os
from pathlib import Path

import click


@click.command()
@click.argument("run_dir", metavar="RUN", type=click.Path(path_type=Path))
@click.option("--key", "key_path", metavar="PATH", type=click.Path(path_type=Path), default=None,
              help="OpenSSH Ed25519 private key (ssh-keygen -t ed25519); default: $REPRO500_SIGNING_KEY.")
@click.option("--principal", metavar="NAME", default=None,
              help="Who signs, as allowed_signers names them (e.g. an e-mail address); recorded in the attestation.")
@click.option("--force", is_flag=True, help="Replace a signature made by another key.")
@click.pass_context
def sign(ctx: click.Context, run_dir: Path, key_path: Path | None, principal: str | None, force: bool) -> None:
    """Sign RUN: an in-toto attestation of its files and provenance, signed with your SSH key.

    Writes RUN/attestation.intoto.jsonl (a DSSE envelope) and RUN/attestation.sig (the same
    statement signed for ssh-keygen -Y verify). A passphrase-protected key reads its
    passphrase from $REPRO500_SIGNING_KEY_PASSPHRASE. Others check it with
    `repro500 verify RUN --trust ALLOWED_SIGNERS` (docs/trust.md).

    \b
    Exit codes: 0 signed; 2 usage error; 4 RUN missing or one verify would call INVALID
                (its SHA256SUMS, its repeat chain, an attestation it carries; also with
                --force), or the key unreadable, encrypted without a passphrase, or not Ed25519.
    """
    from repro500.attest import keys
    from repro500.attest.attestation import SSHSIG_NAME, signed_signer
    from repro500.attest.chain import CHAIN_NAME
    from repro500.errors import UsageError
    from repro500.verify.vouching import sign_run

    if key_path is None:
        env = os.environ.get(keys.KEY_ENV)
        if not env:
            raise UsageError(f"no signing key: pass --key PATH or set {keys.KEY_ENV}")
        key_path = Path(env)
    envelope = sign_run(run_dir, key_path, principal, force=force)
    signer = signed_signer(run_dir) or {}
    click.echo(f"signed {run_dir} with {signer.get('fingerprint')}" + (f" as {principal}" if principal else ""))
    click.echo(f"  {envelope}  (in-toto DSSE envelope)")
    click.echo(f"  {run_dir / SSHSIG_NAME}  (for ssh-keygen -Y verify, namespace {keys.NAMESPACE})")
    if not (Path(run_dir) / CHAIN_NAME).is_file():
        click.echo(f"repro500: warning: {run_dir} has no {CHAIN_NAME} (made before repro500 recorded repeat chains): "
                   "`verify --trust` will call it INVALID; rerun it to get a trusted result", err=True)
    click.echo(f"trust line for allowed_signers: {principal or '<principal>'} "
               f'namespaces="{keys.NAMESPACE}" {signer.get("public_key")}')
