# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""The one home of the ``host_worker`` / ``host_worker_log`` formats.

Used by the ``dynatrain.elastic.host_worker`` module and shipped unchanged to
the nodes (as ``dt_host_worker_file.py``) for the launcher, so this file must
import nothing but the standard library.

``host_worker``: desired workers, one IPv4 per line, ``#`` comments and blank
lines ignored, the master last. Written only atomically (temp file + rename)
under an exclusive lock on the sidecar ``host_worker.lock``.

``host_worker_log``: append-only, DT's layout ``SEQ EVENT IP NS_TIMESTAMP``.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import errno
import fcntl
import ipaddress
import os
import tempfile
import time

LOG_EVENTS = ("ADDED", "REMOVED", "FAILED")


class HostWorkerError(ValueError):
    """A malformed file or an invalid request; the message says what to fix."""


def validate_ip(value):
    """Return the canonical dotted-quad form of an IPv4 address or raise."""
    text = str(value).strip()
    try:
        addr = ipaddress.IPv4Address(text)
    except (ipaddress.AddressValueError, ValueError):
        raise HostWorkerError(
            "invalid worker address %r: host_worker holds IPv4 addresses such as 172.31.65.62" % (value,)
        )
    return str(addr)


def parse_hosts(text, source="host_worker"):
    """Parse host_worker content into an ordered list of IPs (duplicates rejected)."""
    hosts = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            ip = validate_ip(line)
        except HostWorkerError:
            raise HostWorkerError(
                "%s line %d is malformed: %r is not an IPv4 address "
                "(expected one address per line, '#' comments allowed); fix or remove that line"
                % (source, lineno, raw.strip())
            )
        if ip in hosts:
            raise HostWorkerError(
                "%s line %d repeats %s; each worker must appear once" % (source, lineno, ip)
            )
        hosts.append(ip)
    return hosts


def render_hosts(hosts, master=None):
    """Render a host list; the master (if given and present) is placed last."""
    ordered = [h for h in hosts if h != master]
    if master is not None and master in hosts:
        ordered.append(master)
    return "".join("%s\n" % h for h in ordered)


def read_hosts(path):
    """Read and parse host_worker; a missing file is an empty membership."""
    try:
        with open(path, "r") as handle:
            return parse_hosts(handle.read(), source=path)
    except IOError as exc:
        if exc.errno == errno.ENOENT:
            return []
        raise


def lock_path_for(path):
    return path + ".lock"


@contextlib.contextmanager
def locked(path, timeout=30.0):
    """Hold the exclusive sidecar lock (``<path>.lock``) of host_worker."""
    lock_file = lock_path_for(path)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.time() + timeout
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except (IOError, OSError) as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.time() >= deadline:
                    raise HostWorkerError(
                        "could not lock %s within %.0f s: another writer holds it" % (lock_file, timeout)
                    )
                time.sleep(0.05)
        yield
    finally:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def atomic_write(path, content, mode=0o644):
    """Write content to path via a temp file in the same directory + rename."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise HostWorkerError(
            "directory %s does not exist: mount the shared volume (EFS_MOUNT) or create it first" % directory
        )
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.rename(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_hosts(path, hosts, master=None):
    """Atomically write host_worker (caller holds the lock)."""
    for h in hosts:
        validate_ip(h)
    atomic_write(path, render_hosts(hosts, master=master))


def default_log_path(path):
    return os.path.join(os.path.dirname(os.path.abspath(path)), "host_worker_log")


def parse_log_line(line):
    """Parse one log line into (seq, event, ip, ns) or raise."""
    parts = line.split()
    if len(parts) != 4 or parts[1] not in LOG_EVENTS:
        raise HostWorkerError("malformed host_worker_log line %r (expected 'SEQ EVENT IP NS_TIMESTAMP')" % line)
    try:
        seq, ns = int(parts[0]), int(parts[3])
    except ValueError:
        raise HostWorkerError("malformed host_worker_log line %r: SEQ and NS_TIMESTAMP are integers" % line)
    return seq, parts[1], validate_ip(parts[2]), ns


def read_log(log_path):
    """Return the parsed log entries as a list of (seq, event, ip, ns); missing file -> []."""
    try:
        with open(log_path, "r") as handle:
            return [parse_log_line(raw.strip()) for raw in handle if raw.strip()]
    except IOError as exc:
        if exc.errno == errno.ENOENT:
            return []
        raise


def format_log_line(seq, event, ip, ns):
    if event not in LOG_EVENTS:
        raise HostWorkerError("unknown host_worker_log event %r (one of %s)" % (event, ", ".join(LOG_EVENTS)))
    return "%d %s %s %d" % (int(seq), event, validate_ip(ip), int(ns))


def append_log(log_path, event, ip, ns=None):
    """Append one event with the next SEQ (continuing the file's last SEQ); returns the line."""
    with locked(log_path):
        entries = read_log(log_path)
        seq = entries[-1][0] + 1 if entries else 0
        line = format_log_line(seq, event, ip, time.time_ns() if ns is None else ns)
        with open(log_path, "a") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    return line
