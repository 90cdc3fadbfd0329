"""SSH signatures (OpenSSH's PROTOCOL.sshsig), so that ``ssh-keygen -Y verify`` checks a run.

Written here with ``cryptography``'s Ed25519 primitive because no maintained Python library
writes SSHSIG (the ``sshsig`` package only verifies, and cryptography has no SSHSIG support);
the format is small and fully specified::

    signature file = armor(  "SSHSIG" uint32(1) string(public key) string(namespace)
                             string(reserved="") string(hash="sha512") string(signature) )
    signed bytes   =         "SSHSIG" string(namespace) string(reserved="")
                             string(hash="sha512") string(H(message))

``string`` is a uint32 big-endian length and the bytes; the signature is the SSH encoding
``string("ssh-ed25519") string(64-byte Ed25519 signature)``; armor is base64 wrapped at 70
columns between ``-----BEGIN SSH SIGNATURE-----`` and ``-----END SSH SIGNATURE-----``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from repro500.attest.keys import ED25519, NAMESPACE, public_blob

MAGIC = b"SSHSIG"
VERSION = 1
HASH = "sha512"
_BEGIN, _END = "-----BEGIN SSH SIGNATURE-----", "-----END SSH SIGNATURE-----"


def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _signed_bytes(message: bytes, namespace: str, hash_name: str = HASH) -> bytes:
    digest = hashlib.new(hash_name, message).digest()
    return MAGIC + _string(namespace.encode()) + _string(b"") + _string(hash_name.encode()) + _string(digest)


def sign(message: bytes, key: Ed25519PrivateKey, namespace: str = NAMESPACE) -> str:
    """The armored SSH signature of *message*, as ``ssh-keygen -Y sign -n NAMESPACE`` writes it."""
    raw = key.sign(_signed_bytes(message, namespace))
    blob = (MAGIC + struct.pack(">I", VERSION) + _string(public_blob(key.public_key()))
            + _string(namespace.encode()) + _string(b"") + _string(HASH.encode())
            + _string(_string(ED25519.encode()) + _string(raw)))
    text = base64.b64encode(blob).decode()
    lines = [text[i:i + 70] for i in range(0, len(text), 70)]
    return "\n".join([_BEGIN, *lines, _END]) + "\n"


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError("truncated")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def string(self) -> bytes:
        (length,) = struct.unpack(">I", self.take(4))
        return self.take(length)


def verify(armored: str, message: bytes, namespace: str = NAMESPACE) -> Ed25519PublicKey:
    """The public key whose valid signature *armored* is; ValueError says why it is not one."""
    text = armored.strip()
    if not (text.startswith(_BEGIN) and text.endswith(_END)):
        raise ValueError("not an armored SSH signature")
    try:
        blob = base64.b64decode("".join(text[len(_BEGIN):-len(_END)].split()), validate=True)
    except binascii.Error:
        raise ValueError("the SSH signature is not base64") from None
    reader = _Reader(blob)
    if reader.take(6) != MAGIC or struct.unpack(">I", reader.take(4))[0] != VERSION:
        raise ValueError("not an SSHSIG version 1 signature")
    pub_blob, ns, _reserved, hash_name, sig_blob = (reader.string() for _ in range(5))
    if ns.decode(errors="replace") != namespace:
        raise ValueError(f"the SSH signature is for namespace {ns.decode(errors='replace')!r}, not {namespace!r}")
    if hash_name not in (b"sha256", b"sha512"):
        raise ValueError(f"unsupported hash {hash_name.decode(errors='replace')!r}")
    keys, sigs = _Reader(pub_blob), _Reader(sig_blob)
    if keys.string() != ED25519.encode() or sigs.string() != ED25519.encode():
        raise ValueError("the SSH signature is not an ssh-ed25519 signature")
    public = Ed25519PublicKey.from_public_bytes(keys.string())
    try:
        public.verify(sigs.string(), _signed_bytes(message, namespace, hash_name.decode()))
    except InvalidSignature:
        raise ValueError("the SSH signature does not match the signed statement") from None
    return public
