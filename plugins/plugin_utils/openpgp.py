# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""The fingerprints of the primary keys in an OpenPGP public key file (RFC 4880 / 9580 v4 keys).

The cuda role downloads NVIDIA's repository key on the node and checks it on
the controller against a pinned fingerprint before apt may trust it: pure
Python, so the check needs no gpg on either side and is unit-tested.
"""

from __future__ import annotations

import base64
import hashlib

TAG_PUBLIC_KEY = 6
TAG_PUBLIC_SUBKEY = 14


def dearmor(text):
    """ASCII armor -> bytes (headers and the CRC line dropped); raises ValueError on anything else."""
    lines = [line.strip() for line in str(text).strip().splitlines()]
    if not lines or not lines[0].startswith("-----BEGIN PGP PUBLIC KEY BLOCK"):
        raise ValueError("not an ASCII-armored OpenPGP public key block")
    try:
        end = next(i for i, line in enumerate(lines) if line.startswith("-----END PGP"))
        body = lines[1:end]
    except StopIteration:
        raise ValueError("armored key block has no END line") from None
    if "" in body:                     # armor headers (Version: ...) end at the first blank line
        body = body[body.index("") + 1:]
    body = [line for line in body if line and not line.startswith("=")]
    return base64.b64decode("".join(body), validate=True)


def packets(data):
    """Yield (tag, body) of each packet (old- and new-format headers)."""
    pos = 0
    while pos < len(data):
        hdr = data[pos]
        if not hdr & 0x80:
            raise ValueError(f"bad OpenPGP packet header at byte {pos}")
        if hdr & 0x40:                 # new format
            tag, pos = hdr & 0x3F, pos + 1
            first = data[pos]
            if first < 192:
                length, pos = first, pos + 1
            elif first < 224:
                length, pos = ((first - 192) << 8) + data[pos + 1] + 192, pos + 2
            elif first == 255:
                length, pos = int.from_bytes(data[pos + 1:pos + 5], "big"), pos + 5
            else:
                raise ValueError("partial-length packets do not occur in key files")
        else:                          # old format
            tag, ltype, pos = (hdr >> 2) & 0x0F, hdr & 0x03, pos + 1
            size = {0: 1, 1: 2, 2: 4}.get(ltype)
            if size is None:
                raise ValueError("indeterminate-length packets do not occur in key files")
            length, pos = int.from_bytes(data[pos:pos + size], "big"), pos + size
        if pos + length > len(data):
            raise ValueError("truncated OpenPGP packet")
        yield tag, data[pos:pos + length]
        pos += length


def v4_fingerprint(body):
    """SHA-1 over 0x99, the 2-byte length and the key packet body (RFC 4880 12.2), upper-case hex."""
    if not body or body[0] != 4:
        raise ValueError(f"only version 4 keys are supported (got version {body[0] if body else None})")
    return hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body).hexdigest().upper()


def primary_fingerprints(armored):
    """The fingerprints of every primary key in an armored key file (subkeys are bound to them)."""
    return [v4_fingerprint(body) for tag, body in packets(dearmor(armored)) if tag == TAG_PUBLIC_KEY]


def normalize_fingerprint(fpr):
    return "".join(str(fpr).split()).upper().removeprefix("0X")


def key_problem(armored, pinned):
    """'' when the key file holds exactly the pinned primary key(s), else what is wrong.

    ``pinned``: a fingerprint or a list of them (spaces ignored, any case). A file with
    an extra primary key is refused as well: apt would trust every key of the keyring.
    """
    want = {normalize_fingerprint(f) for f in ([pinned] if isinstance(pinned, str) else pinned or []) if f}
    if not want:
        return "no fingerprint is pinned (cuda_repo_key_fingerprint is empty)"
    try:
        got = primary_fingerprints(armored)
    except (ValueError, IndexError) as exc:
        return f"the downloaded key is not a usable OpenPGP public key: {exc}"
    if not got:
        return "the downloaded key file holds no public key"
    if set(got) != want:
        return (f"the repository key's fingerprint is {', '.join(got)}, but {', '.join(sorted(want))} is pinned:"
                " refusing it (a changed or substituted key); check NVIDIA's published fingerprint and update"
                " cuda_repo_key_fingerprint only if NVIDIA rotated its key")
    return ""
