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
import stat
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


def _scan_lines(text, source="host_worker"):
    """Split host_worker text into ``[(raw_line, ip_or_None)]`` (comments/blank -> None).

    Raises HostWorkerError naming the line for a malformed or repeated address.
    """
    scanned = []
    seen = set()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            scanned.append((raw, None))
            continue
        try:
            ip = validate_ip(line)
        except HostWorkerError:
            raise HostWorkerError(
                "%s line %d is malformed: %r is not an IPv4 address "
                "(expected one address per line, '#' comments allowed); fix or remove that line"
                % (source, lineno, raw.strip())
            )
        if ip in seen:
            raise HostWorkerError(
                "%s line %d repeats %s; each worker must appear once" % (source, lineno, ip)
            )
        seen.add(ip)
        scanned.append((raw, ip))
    return scanned


def parse_hosts(text, source="host_worker"):
    """Parse host_worker content into an ordered list of IPs (duplicates rejected)."""
    return [ip for _raw, ip in _scan_lines(text, source=source) if ip is not None]


def edit_hosts_text(text, add=(), remove=(), master=None, source="host_worker"):
    """Return host_worker ``text`` edited in place, keeping comments and blank lines.

    Lines whose address is in ``remove`` are dropped; addresses in ``add`` that
    are not present yet are inserted just before the master line (the last
    address line), so the master stays last. When the text holds no address
    yet, ``add`` is appended in order followed by ``master`` (if given), so
    without ``master`` the last added address becomes the master.
    Callers decide policy (protected hosts, the master); this only edits.
    """
    add = [validate_ip(h) for h in add]
    remove = set(validate_ip(h) for h in remove)
    master = validate_ip(master) if master is not None else None
    scanned = [(raw, ip) for raw, ip in _scan_lines(text, source=source) if ip is None or ip not in remove]
    present = set(ip for _raw, ip in scanned if ip is not None)
    new = []
    for h in add:
        if h not in present and h not in new:
            new.append(h)
    lines = [raw for raw, _ip in scanned]
    address_rows = [i for i, (_raw, ip) in enumerate(scanned) if ip is not None]
    if address_rows:
        at = address_rows[-1]
        last = scanned[at][1]
        if master is not None and master != last:
            raise HostWorkerError(
                "%s ends with %s, not with the master %s (the master must stay the last address)"
                % (source, last, master)
            )
        lines[at:at] = [h for h in new if h != last]
    else:
        tail = [h for h in new if h != master]
        if master is not None and (tail or master in new):
            tail.append(master)
        lines.extend(tail)
    return "".join("%s\n" % line for line in lines)


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


def atomic_write(path, content, mode=None):
    """Write content to path via a temp file in the same directory + rename.

    ``mode=None`` keeps the mode (and, when permitted, the owner and group) of
    an existing file; a new file gets 0644.
    """
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise HostWorkerError(
            "directory %s does not exist: mount the shared volume (EFS_MOUNT) or create it first" % directory
        )
    owner = None
    if mode is None:
        try:
            st = os.stat(path)
            mode = stat.S_IMODE(st.st_mode)
            owner = (st.st_uid, st.st_gid)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
            mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        if owner is not None:
            try:
                os.chown(tmp, owner[0], owner[1])
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.EINVAL):
                    raise
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


def read_log_since(log_path, offset=0):
    """Read the complete log lines written at or after byte ``offset``.

    Returns ``(entries, next_offset, bad_lines)``: ``entries`` is a list of
    ``(seq, event, ip, ns, line)``; a trailing line without its newline (still
    being written) is left for the next call; ``bad_lines`` lists lines that do
    not parse (skipped, so a reader can warn instead of failing). If the file
    shrank below ``offset`` (replaced), reading starts again at 0. A missing
    file gives ``([], 0, [])``.
    """
    try:
        with open(log_path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            if size < offset:
                offset = 0
            handle.seek(offset)
            data = handle.read()
    except IOError as exc:
        if exc.errno == errno.ENOENT:
            return [], 0, []
        raise
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset, []
    entries, bad = [], []
    for raw in data[:end].decode("utf-8", "replace").split("\n"):
        line = raw.strip()
        if not line:
            continue
        try:
            entries.append(parse_log_line(line) + (line,))
        except HostWorkerError:
            bad.append(line)
    return entries, offset + end + 1, bad


def log_position(log_path):
    """Return ``(next_offset, last_seq)`` of the log now (``(0, -1)`` when missing or empty).

    Record it before editing host_worker; events after the edit are then the
    ones from ``read_log_since(log_path, next_offset)`` with ``seq > last_seq``.
    """
    entries, offset, _bad = read_log_since(log_path, 0)
    return offset, (entries[-1][0] if entries else -1)
