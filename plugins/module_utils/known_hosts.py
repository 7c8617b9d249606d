# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""known_hosts lines and their lock: the one home of what the controller's pins (the known_hosts_pins module) and
a node's copy of them (node_files' known_hosts entry, on the master) share. Two writers at once (two adds, an add
beside a reconcile timer on another admin host) each read, merge and replace the file under an exclusive flock on
the sidecar ``<path>.lock``, so neither drops the other's lines."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time


def line_names(line):
    """The host names a known_hosts line is for ([] for comments, blanks, markers and hashed names)."""
    text = line.strip()
    if not text or text.startswith(("#", "@")):
        return []
    names = []
    for name in text.split()[0].split(","):
        match = re.match(r"^\[(.+)\]:22$", name)
        names.append(match.group(1) if match else name)
    return [n for n in names if not n.startswith("|")]


def merge(text, lines, forget=()):
    """``text`` with ``lines`` pinned: every older line naming one of their names goes (a re-used address, a new
    key), and so does a line naming one of ``forget``; every other line stays where it was, and the new lines
    that are not there already are appended (a second merge changes nothing). Returns (new text, added, removed).
    Pure."""
    new = list(dict.fromkeys(line for line in lines if line.strip()))
    forget, repinned = set(forget), {name for line in new for name in line_names(line)}
    have = text.splitlines()
    kept = [line for line in have
            if not set(line_names(line)) & forget and (line in new or not set(line_names(line)) & repinned)]
    added = [line for line in new if line not in kept]
    removed = [line for line in have if line not in kept]
    return "".join(f"{line}\n" for line in kept + added), added, removed


@contextlib.contextmanager
def locked(path, timeout=30.0, error=TimeoutError):
    """Hold the exclusive lock on ``<path>.lock`` (the sidecar, never the file that is replaced); ``error`` (a
    message) when another writer holds it past ``timeout`` s. The sidecar is opened without following a link."""
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise error(f"could not lock {path}.lock within {timeout:.0f} s: another playbook holds it") from None
                time.sleep(0.02)
        yield fd
    finally:
        os.close(fd)  # closing the descriptor releases the lock
