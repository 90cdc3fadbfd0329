"""Signing keys (OpenSSH Ed25519) and git's ``allowed_signers`` trust file.

A signing key is the private key ``ssh-keygen -t ed25519`` writes (OpenSSH format; a PEM
PKCS#8 Ed25519 key works too).  A passphrase comes from ``REPRO500_SIGNING_KEY_PASSPHRASE``,
never from the command line, where other users could read it in the process list.

``allowed_signers`` is the file ``git config gpg.ssh.allowedSignersFile`` and ``ssh-keygen -Y
verify -f`` read (ssh-keygen(1), "ALLOWED SIGNERS").  One entry a line::

    principals [options] keytype base64-key [comment]

Supported, as ssh-keygen reads them: comma-separated principal patterns (``*`` and ``?``
wildcards, ``!`` negation; quoted with ``"..."`` when needed), the options ``namespaces="..."``
(patterns; the entry must allow ``repro500``), ``valid-after="YYYYMMDD[HHMM[SS]][Z]"`` and
``valid-before=...`` (checked against the current time, as ssh-keygen does by default), ``#``
comments and blank lines.  Entries with ``cert-authority`` (trust in a CA, not a key) are kept
but never match: repro500 signs with plain keys.  Keys of other types (RSA, ECDSA) are accepted
in the file and never match an Ed25519 signature.  A line that cannot be parsed is an error
naming the file and line.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import hashlib
import os
import re
import struct
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from repro500.errors import InvalidInput

PASSPHRASE_ENV = "REPRO500_SIGNING_KEY_PASSPHRASE"
KEY_ENV = "REPRO500_SIGNING_KEY"
ED25519 = "ssh-ed25519"
NAMESPACE = "repro500"
_KEY_TYPES = frozenset({
    "ssh-ed25519", "ssh-rsa", "ssh-dss", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com", "rsa-sha2-256", "rsa-sha2-512",
})


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """The Ed25519 private key at *path*; InvalidInput (one sentence) for anything else."""
    path = Path(path).expanduser()
    try:
        data = path.read_bytes()
    except OSError as err:
        raise InvalidInput(f"signing key {path} cannot be read ({err.strerror or type(err).__name__}): "
                           "give the private key ssh-keygen -t ed25519 wrote") from None
    passphrase = os.environ.get(PASSPHRASE_ENV)
    secret = passphrase.encode("utf-8") if passphrase else None
    if data.lstrip().startswith((b"ssh-", b"ecdsa-", b"sk-")):
        raise InvalidInput(f"{path} is a public key: give the private key (the file without .pub)")
    try:
        if b"BEGIN OPENSSH PRIVATE KEY" in data:
            try:
                key = serialization.load_ssh_private_key(data, secret)
            except TypeError:
                if secret is None:
                    raise InvalidInput(f"signing key {path} is protected by a passphrase: "
                                       f"set {PASSPHRASE_ENV} to it") from None
                key = serialization.load_ssh_private_key(data, None)  # given but not needed
        else:
            key = serialization.load_pem_private_key(data, secret)
    except InvalidInput:
        raise
    except (ValueError, TypeError) as err:
        wrong = secret is not None and ("checksum" in str(err) or "decrypt" in str(err).lower()
                                        or "password" in str(err).lower())
        if wrong:
            raise InvalidInput(f"signing key {path} could not be decrypted: the passphrase in "
                               f"{PASSPHRASE_ENV} is wrong") from None
        raise InvalidInput(f"{path} is not a private key repro500 can read (an OpenSSH or PEM "
                           "Ed25519 key made by ssh-keygen -t ed25519)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise InvalidInput(f"signing key {path} is {_key_kind(key)}, not Ed25519: "
                           "make one with ssh-keygen -t ed25519")
    return key


def _key_kind(key: object) -> str:
    name = type(key).__name__.replace("PrivateKey", "").replace("_", "")
    return f"an {name} key" if name[:1].upper() in "AEIOUR" else f"a {name} key"


def public_blob(key: Ed25519PublicKey) -> bytes:
    """The SSH wire encoding of the public key (what fingerprints and SSHSIG carry)."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return _string(ED25519.encode()) + _string(raw)


def openssh_public(key: Ed25519PublicKey) -> str:
    """``ssh-ed25519 AAAA...``, the line ``allowed_signers`` and ``*.pub`` hold."""
    return f"{ED25519} {base64.b64encode(public_blob(key)).decode()}"


def fingerprint(key: Ed25519PublicKey) -> str:
    """OpenSSH's fingerprint, ``SHA256:...`` as ``ssh-keygen -l`` prints it."""
    digest = hashlib.sha256(public_blob(key)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


# ------------------------------------------------------------------------ allowed_signers


@dataclass
class AllowedSigner:
    """One entry of an allowed_signers file."""

    principals: list[str]
    keytype: str
    key_b64: str
    options: dict[str, str] = field(default_factory=dict)
    line: int = 0

    @property
    def public_key(self) -> Ed25519PublicKey | None:
        """The Ed25519 key, or None for a key of another type or a CA entry."""
        if self.keytype != ED25519 or "cert-authority" in self.options:
            return None
        blob = base64.b64decode(self.key_b64)
        return Ed25519PublicKey.from_public_bytes(blob[-32:])

    def allows_principal(self, name: str) -> bool:
        return _match_list(name, self.principals)

    def allows_namespace(self, namespace: str = NAMESPACE) -> bool:
        allowed = self.options.get("namespaces")
        return allowed is None or _match_list(namespace, allowed.split(","))

    def valid_at(self, when: datetime) -> bool:
        after, before = self.options.get("valid-after"), self.options.get("valid-before")
        return (after is None or when >= _timestamp(after)) and (before is None or when <= _timestamp(before))


def _match_list(name: str, patterns: list[str]) -> bool:
    """ssh's match_pattern_list: a matching negated pattern wins, else any positive match."""
    matched = False
    for pattern in (p.strip() for p in patterns):
        if pattern.startswith("!"):
            if fnmatch.fnmatchcase(name, pattern[1:]):
                return False
        elif pattern and fnmatch.fnmatchcase(name, pattern):
            matched = True
    return matched


def _timestamp(text: str) -> datetime:
    text = text.strip()
    utc = text.endswith(("Z", "z"))
    digits = text.rstrip("Zz")
    formats = {8: "%Y%m%d", 12: "%Y%m%d%H%M", 14: "%Y%m%d%H%M%S"}
    if len(digits) not in formats or not digits.isdigit():
        raise ValueError(f"{text!r} is not YYYYMMDD[HHMM[SS]][Z]")
    when = datetime.strptime(digits, formats[len(digits)])
    return when.replace(tzinfo=UTC) if utc else when.astimezone(UTC)


_TOKEN = re.compile(r'\s*((?:"[^"]*"|[^\s"])+)')
_OPTION = re.compile(r'([A-Za-z-]+)(?:="([^"]*)")?(?:,|$)')


def parse_allowed_signers(path: str | Path) -> list[AllowedSigner]:
    """Every entry of an allowed_signers file; InvalidInput names the file and line of a bad one."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or type(err).__name__
        raise InvalidInput(f"allowed signers file {path} cannot be read ({reason})") from None
    entries = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            entries.append(_parse_line(line, lineno))
        except ValueError as err:
            raise InvalidInput(f"{path}:{lineno} is not an allowed_signers entry ({err})") from None
    return entries


def _parse_line(line: str, lineno: int) -> AllowedSigner:
    tokens = _TOKEN.findall(line)
    if len(tokens) < 3:
        raise ValueError("expected: principals [options] keytype base64-key")
    principals = [p for p in tokens[0].replace('"', "").split(",") if p]
    if not principals:
        raise ValueError("no principal")
    options: dict[str, str] = {}
    rest = tokens[1:]
    if rest[0] not in _KEY_TYPES:
        if rest[0].startswith(("ssh-", "ecdsa-", "sk-")):
            raise ValueError(f"unknown key type {rest[0]!r}")
        options = _parse_options(rest[0])
        rest = rest[1:]
    if len(rest) < 2 or rest[0] not in _KEY_TYPES:
        raise ValueError(f"unknown key type {rest[0] if rest else ''!r}")
    keytype, key_b64 = rest[0], rest[1]
    try:
        blob = base64.b64decode(key_b64, validate=True)
    except binascii.Error:
        raise ValueError("the key is not base64") from None
    if not blob.startswith(_string(keytype.encode())):
        raise ValueError(f"the key does not hold a {keytype} key")
    if keytype == ED25519 and len(blob) != 4 + len(ED25519) + 4 + 32:
        raise ValueError("the ssh-ed25519 key has the wrong length")
    for name in ("valid-after", "valid-before"):
        if name in options:
            _timestamp(options[name])
    return AllowedSigner(principals, keytype, key_b64, options, lineno)


def _parse_options(text: str) -> dict[str, str]:
    options: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        match = _OPTION.match(text, pos)
        if not match or match.end() == pos:
            raise ValueError(f"cannot read the options {text!r}")
        name = match.group(1).lower()
        if name not in ("namespaces", "valid-after", "valid-before", "cert-authority"):
            raise ValueError(f"unknown option {name!r}")
        options[name] = match.group(2) if match.group(2) is not None else ""
        pos = match.end()
    return options


def trusted_entries(entries: list[AllowedSigner], key: Ed25519PublicKey,
                    when: datetime | None = None) -> list[AllowedSigner]:
    """Entries naming *key* that allow the repro500 namespace and are valid at *when* (now)."""
    when = when or datetime.now(UTC)
    wanted = public_blob(key)
    out = []
    for entry in entries:
        pub = entry.public_key
        if pub is not None and public_blob(pub) == wanted and entry.allows_namespace() and entry.valid_at(when):
            out.append(entry)
    return out
