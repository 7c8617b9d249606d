# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""Host keys checked against what the instance printed on its console.

cloud-init prints the fingerprints of the host keys it generated at first boot
between ``-----BEGIN SSH HOST KEY FINGERPRINTS-----`` and ``-----END ...-----``
(each line prefixed ``ec2: `` on EC2), and EC2 serves that through
GetConsoleOutput: an out-of-band channel, so a key read over the network
(ssh-keyscan) can be checked instead of trusted on first use.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import re

BEGIN = "-----BEGIN SSH HOST KEY FINGERPRINTS-----"
END = "-----END SSH HOST KEY FINGERPRINTS-----"
_LINE = re.compile(r"^(?:ec2:\s*)?(\d+)\s+(SHA256:[A-Za-z0-9+/=]+)\s+.*\((\w+)\)\s*$")


def console_fingerprints(console_text):
    """SHA256 fingerprints listed in the console's last fingerprint block, e.g.
    {"SHA256:qW8i...": "ED25519"}; empty when the console has none (yet)."""
    lines = (console_text or "").splitlines()
    fingerprints, block = {}, None
    for line in lines:
        text = re.sub(r"^ec2:\s*", "", line.strip())
        if text == BEGIN:
            block = {}
        elif text == END and block is not None:
            fingerprints, block = block, None  # the last complete block wins (a reboot prints again)
        elif block is not None:
            m = _LINE.match(line.strip())
            if m:
                block[m.group(2)] = m.group(3).upper()
    return fingerprints


def key_fingerprint(key_line):
    """The SHA256 fingerprint (OpenSSH's format) of a public key line such as
    ``ssh-ed25519 AAAA...`` or ``<host> ssh-ed25519 AAAA...`` (ssh-keyscan's)."""
    for field in (key_line or "").split():
        if field.startswith("AAAA"):
            try:
                blob = base64.b64decode(field, validate=True)
            except (binascii.Error, ValueError):
                break
            return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    raise ValueError("not an OpenSSH public key line: %r" % (key_line,))


def verdict(key_line, console_text):
    """('console', fp) when the console lists the key's fingerprint, ('none', fp) when
    the console lists no fingerprint at all, ('mismatch', fp) when it lists others."""
    fp = key_fingerprint(key_line)
    listed = console_fingerprints(console_text)
    if not listed:
        return "none", fp
    return ("console" if fp in listed else "mismatch"), fp
