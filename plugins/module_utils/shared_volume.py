# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""The shared volume's one contract: every path, format, reader and writer on it.

The collection's modules (``host_worker``, ``job_info``, ``timeline_plot``) import it, and it
is shipped unchanged to the nodes (``runtime/build.py`` copies it into the runtime wheel as
``dynatrain_runtime.contract.shared_volume``), where the launcher, the training script's helper
API and the node daemons import it; so this file imports nothing but the standard library, and
its public names are that runtime's interface: keep them and their signatures.

Under the volume (``EFS_MOUNT``), the layout of ``JobFiles``:

``host_worker``: desired workers, one IPv4 per line, ``#`` comments and blank
lines ignored, the master last. Written only atomically (temp file + rename)
under an exclusive lock on the sidecar ``host_worker.lock``.

``host_worker_log``: append-only, DT's layout ``SEQ EVENT IP NS_TIMESTAMP``, read
like a write-ahead log: a torn last line (a writer killed mid-append) is cut off by
the next append, a malformed line is skipped; neither stops the writer.

``status.json``: the launcher's state (written atomically; ``parse_status``, ``STATES``).
``events.jsonl``: one JSON object per line (``event``, ``time``, ``source``), appended under a
lock by the launcher and rank 0 (``append_jsonl``, ``BackgroundAppender``; ``parse_events``).
``control/stop.json``, ``control/drain/<ip>.json``, ``control/warm/<ip>.json``: requests to the
launcher (``write_*_request`` / ``read_*`` / ``clear_*``); ``control/launcher_state.json``.
``checkpoints/ckpt-<step>/`` with ``meta.json`` written last; ``results/final.json``.
Beside them: ``prepare_data_success_<ip>`` (a node's data is ready, ``prepare_data_marker``), ``wheelhouse/``
and ``runs/<UTC time>/`` (a fresh job's archive of the files above, ``archive_job``).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import ipaddress
import json
import os
import queue
import secrets
import stat
import sys
import threading
import time

LOG_EVENTS = ("ADDED", "REMOVED", "FAILED")
HOST_WORKER_LOG_FILE = "host_worker_log"
NEW_FILE_MODE = 0o644


class HostWorkerError(ValueError):
    """A malformed file or an invalid request; the message says what to fix."""


# ------------------------------------------------------------------ no link on the volume is followed
# Every node mounts the volume read-write, so any of its paths may be a link a compromised worker
# planted (``events.jsonl`` -> the master's ``~/.ssh/rc``).  Below a job's root (``JobFiles``
# registers it: the mount point itself is the admin's) each directory is opened with O_NOFOLLOW,
# and each file relative to its directory's descriptor with O_NOFOLLOW, and used only when it is a
# regular file: a link, a FIFO (an open would block) or a device is refused as an OSError.
_ROOTS = set()          # the volume roots of the JobFiles made in this process
MAX_JSON_BYTES = 1 << 20   # a request or state file larger than this is not one of ours


class NotRegularFile(OSError):
    """A path on the volume that is not a regular file (a link, a FIFO, a device, a directory)."""


def _nofollow_flags():
    return os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def _open_dir(directory):
    """A descriptor of ``directory``; below a registered root no component of it may be a link."""
    directory = os.path.abspath(directory)
    roots = [r for r in _ROOTS if directory == r or directory.startswith(r + os.sep)]
    if not roots:
        return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    root = max(roots, key=len)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in [p for p in os.path.relpath(directory, root).split(os.sep) if p not in ("", ".")]:
            if part == "..":
                raise NotRegularFile(errno.EINVAL, "'..' in a path on the volume", directory)
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | _nofollow_flags(), dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_nofollow(path, flags=os.O_RDONLY, mode=0o644):
    """An fd of the regular file ``path`` opened without following a link (see ``_open_dir``)."""
    dfd = _open_dir(os.path.dirname(os.path.abspath(path)))
    try:
        fd = os.open(os.path.basename(path), flags | _nofollow_flags(), mode, dir_fd=dfd)
    finally:
        os.close(dfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path, limit=None):
    """The bytes of the regular file ``path`` (no link followed); ``limit``: NotRegularFile when larger."""
    with os.fdopen(open_nofollow(path), "rb") as handle:
        data = handle.read() if limit is None else handle.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise NotRegularFile(errno.EFBIG, f"larger than {limit} bytes", path)
    return data


def read_text(path):
    """``read_bytes`` as text; bytes that are not UTF-8 become U+FFFD (a parser then says what is wrong)."""
    return read_bytes(path).decode("utf-8", "replace")


def clean_text(value, limit=200):
    """A field from a file on the volume made safe to log: a string, printable, at most ``limit`` chars."""
    if value is None:
        return None
    text = value if isinstance(value, str) else repr(value)
    text = "".join(ch if ch.isprintable() else "?" for ch in text[:limit * 4])
    return text[:limit]


def validate_ip(value):
    """Return the canonical dotted-quad form of an IPv4 address or raise."""
    text = str(value).strip()
    try:
        addr = ipaddress.IPv4Address(text)
    except ValueError:
        raise HostWorkerError(
            f"invalid worker address {value!r}: host_worker holds IPv4 addresses such as 172.31.65.62"
        ) from None
    return str(addr)


def _scan_line(raw, lineno, source):
    """Return the address on one host_worker line, or None for a comment or blank line."""
    line = raw.split("#", 1)[0].strip()
    if not line:
        return None
    try:
        return validate_ip(line)
    except HostWorkerError:
        raise HostWorkerError(
            f"{source} line {lineno} is malformed: {raw.strip()!r} is not an IPv4 address "
            "(expected one address per line, '#' comments allowed); fix or remove that line"
        ) from None


def _scan_lines(text, source="host_worker"):
    """Split host_worker text into ``[(raw_line, ip_or_None)]`` (comments/blank -> None).

    Raises HostWorkerError naming the line for a malformed or repeated address.
    """
    scanned = []
    seen = set()
    for lineno, raw in enumerate(text.splitlines(), 1):
        ip = _scan_line(raw, lineno, source)
        if ip is not None:
            if ip in seen:
                raise HostWorkerError(f"{source} line {lineno} repeats {ip}; each worker must appear once")
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
    remove = {validate_ip(h) for h in remove}
    master = validate_ip(master) if master is not None else None
    scanned = [(raw, ip) for raw, ip in _scan_lines(text, source=source) if ip is None or ip not in remove]
    present = {ip for _raw, ip in scanned if ip is not None}
    new = [h for h in dict.fromkeys(add) if h not in present]
    lines = [raw for raw, _ip in scanned]
    address_rows = [i for i, (_raw, ip) in enumerate(scanned) if ip is not None]
    if address_rows:
        _insert_before_master(lines, scanned, address_rows[-1], new, master, source)
    else:
        lines.extend(_first_addresses(new, master))
    return "".join(f"{line}\n" for line in lines)


def _insert_before_master(lines, scanned, at, new, master, source):
    """Insert ``new`` into ``lines`` just before row ``at``, the last address (the master)."""
    last = scanned[at][1]
    if master is not None and master != last:
        raise HostWorkerError(
            f"{source} ends with {last}, not with the master {master} (the master must stay the last address)"
        )
    lines[at:at] = [h for h in new if h != last]


def _first_addresses(new, master):
    """The addresses of a file that holds none yet: ``new``, then the master (if any is written)."""
    tail = [h for h in new if h != master]
    if master is not None and (tail or master in new):
        tail.append(master)
    return tail


def render_hosts(hosts, master=None):
    """Render a host list; the master (if given and present) is placed last."""
    ordered = [h for h in hosts if h != master]
    if master is not None and master in hosts:
        ordered.append(master)
    return "".join(f"{h}\n" for h in ordered)


def read_hosts(path):
    """Read and parse host_worker; a missing file is an empty membership."""
    try:
        return parse_hosts(read_text(path), source=path)
    except FileNotFoundError:
        return []


def lock_path_for(path):
    return f"{path}.lock"


def _try_flock(fd):
    """Take the exclusive lock without blocking; False when another holder has it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        return False
    return True


@contextlib.contextmanager
def locked(path, timeout=30.0):
    """Hold the exclusive sidecar lock (``<path>.lock``) of host_worker."""
    lock_file = lock_path_for(path)
    fd = open_nofollow(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout     # an interval: a wall-clock step must not shorten it
    try:
        while not _try_flock(fd):
            if time.monotonic() >= deadline:
                raise HostWorkerError(f"could not lock {lock_file} within {timeout:.0f} s: another writer holds it")
            time.sleep(0.05)
        yield
    finally:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def _as_bytes(content):
    """``str`` content is written as UTF-8, bytes-like content as it is."""
    if isinstance(content, str):
        return content.encode("utf-8")
    if isinstance(content, (bytes, bytearray, memoryview)):
        return bytes(content)
    raise TypeError(f"atomic_write takes str or bytes content, not {type(content).__name__}")


def _existing_mode_owner(name, dfd=None):
    """``(mode, (uid, gid))`` of an existing regular file, ``(NEW_FILE_MODE, None)`` for a new one (or a link);
    ``name`` relative to the directory ``dfd`` when given."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return NEW_FILE_MODE, None
    if not stat.S_ISREG(st.st_mode):
        return NEW_FILE_MODE, None
    return stat.S_IMODE(st.st_mode), (st.st_uid, st.st_gid)


def _chown_if_permitted(fd, owner):
    try:
        os.fchown(fd, *owner)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EINVAL):
            raise


def fsync_directory(directory):
    """Flush a directory entry change (a rename) to disk, where the filesystem allows it."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot fsync a directory; the rename itself is atomic
    finally:
        os.close(fd)


def atomic_write(path, content, mode=None):
    """Write ``content`` (``str`` as UTF-8, or ``bytes``) to path via a temp file + rename.

    The temp file lives in the same directory and is fsync'd before the rename;
    the directory is fsync'd after it. ``mode=None`` keeps the mode (and, when
    permitted, the owner and group) of an existing file; a new file gets 0644.
    """
    data = _as_bytes(content)
    directory = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    try:
        dfd = _open_dir(directory)
    except (FileNotFoundError, NotADirectoryError):
        raise HostWorkerError(
            f"directory {directory} does not exist: mount the shared volume (EFS_MOUNT) or create it first"
        ) from None
    try:
        _write_renamed(dfd, name, data, mode)
    finally:
        os.close(dfd)


def _write_renamed(dfd, name, data, mode):
    """``atomic_write`` in the directory ``dfd``: a new temp file (O_EXCL, never a planted link), renamed."""
    owner = None
    if mode is None:
        mode, owner = _existing_mode_owner(name, dfd)
    tmp = f".{name}.{secrets.token_hex(6)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)        # the final mode from the start, whatever the umask
            if owner is not None:
                _chown_if_permitted(handle.fileno(), owner)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise
    with contextlib.suppress(OSError):
        os.fsync(dfd)       # some filesystems cannot fsync a directory; the rename itself is atomic


def write_hosts(path, hosts, master=None):
    """Atomically write host_worker (caller holds the lock)."""
    for h in hosts:
        validate_ip(h)
    atomic_write(path, render_hosts(hosts, master=master))


def default_log_path(path):
    return os.path.join(os.path.dirname(os.path.abspath(path)), HOST_WORKER_LOG_FILE)


def parse_log_line(line):
    """Parse one log line into (seq, event, ip, ns) or raise."""
    parts = line.split()
    if len(parts) != 4 or parts[1] not in LOG_EVENTS:
        raise HostWorkerError(f"malformed host_worker_log line {line!r} (expected 'SEQ EVENT IP NS_TIMESTAMP')")
    try:
        seq, ns = int(parts[0]), int(parts[3])
    except ValueError:
        raise HostWorkerError(
            f"malformed host_worker_log line {line!r}: SEQ and NS_TIMESTAMP are integers"
        ) from None
    return seq, parts[1], validate_ip(parts[2]), ns


def read_log(log_path):
    """Return the parsed log entries as a list of (seq, event, ip, ns); missing file -> [].

    Strict: any line that does not parse raises HostWorkerError (``scan_log`` reads leniently).
    """
    try:
        text = read_text(log_path)
    except FileNotFoundError:
        return []
    return [parse_log_line(raw.strip()) for raw in text.splitlines() if raw.strip()]


def format_log_line(seq, event, ip, ns):
    if event not in LOG_EVENTS:
        raise HostWorkerError(f"unknown host_worker_log event {event!r} (one of {', '.join(LOG_EVENTS)})")
    return f"{int(seq)} {event} {validate_ip(ip)} {int(ns)}"


def _split_log(data):
    """``(complete, torn)`` of the log's bytes: up to and with the last newline, and what follows it."""
    end = data.rfind(b"\n") + 1
    return data[:end], data[end:]


def scan_log(log_path):
    """Read the log leniently, as a write-ahead log: ``(entries, bad, torn)``.

    ``entries`` are the ``(seq, event, ip, ns)`` of the lines that parse; ``bad`` the complete
    lines that do not (skipped); ``torn`` a last line without its newline -- a writer killed
    mid-append, or one still writing -- which is no entry (``""`` when there is none).
    A missing file gives ``([], [], "")``.
    """
    try:
        data = read_bytes(log_path)
    except FileNotFoundError:
        return [], [], ""
    complete, torn = _split_log(data)
    entries, bad = _parse_log_lines(complete.decode("utf-8", "replace").split("\n"))
    return [entry[:4] for entry in entries], bad, torn.decode("utf-8", "replace")


def append_log(log_path, event, ip, ns=None, warn=None, timeout=30.0):
    """Append one event with the next SEQ after the last good line; returns the line.

    The log is read as a write-ahead log, under its lock: a last line without its newline (a
    writer killed mid-append; no writer is active while we hold the lock) is cut off, lines
    that do not parse are skipped, and ``warn(kind, lines)`` (``kind`` ``"torn"`` or
    ``"malformed"``) hears about both. Neither stops the append: training must go on.
    ``timeout``: seconds to wait for the lock (HostWorkerError after that).
    """
    with locked(log_path, timeout=timeout):
        fd = open_nofollow(log_path, os.O_RDWR | os.O_APPEND | os.O_CREAT, NEW_FILE_MODE)
        with os.fdopen(fd, "a+b") as handle:     # O_APPEND: every write lands at the end
            handle.seek(0)
            complete, torn = _split_log(handle.read())
            entries, bad = _parse_log_lines(complete.decode("utf-8", "replace").split("\n"))
            seq = entries[-1][0] + 1 if entries else 0
            line = format_log_line(seq, event, ip, time.time_ns() if ns is None else ns)
            if torn:
                handle.truncate(len(complete))
            handle.write(f"{line}\n".encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
    if warn is not None and torn:
        warn("torn", [torn.decode("utf-8", "replace")])
    if warn is not None and bad:
        warn("malformed", bad)
    return line


def _read_from(log_path, offset):
    """The bytes of the log from ``offset`` (from 0 if it shrank below it) and that start offset."""
    with os.fdopen(open_nofollow(log_path), "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size < offset:
            offset = 0
        handle.seek(offset)
        return handle.read(), offset


def _parse_log_lines(lines):
    """Split log lines into ``(entries, bad)``: ``(seq, event, ip, ns, line)`` tuples and unparsable lines."""
    entries, bad = [], []
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        try:
            entries.append(parse_log_line(line) + (line,))
        except HostWorkerError:
            bad.append(line)
    return entries, bad


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
        data, offset = _read_from(log_path, offset)
    except FileNotFoundError:
        return [], 0, []
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset, []
    entries, bad = _parse_log_lines(data[:end].decode("utf-8", "replace").split("\n"))
    return entries, offset + end + 1, bad


def log_position(log_path):
    """Return ``(next_offset, last_seq)`` of the log now (``(0, -1)`` when missing or empty).

    Record it before editing host_worker; events after the edit are then the
    ones from ``read_log_since(log_path, next_offset)`` with ``seq > last_seq``.
    """
    entries, offset, _bad = read_log_since(log_path, 0)
    return offset, (entries[-1][0] if entries else -1)


# ================================================================== the job's other files
HOST_WORKER_FILE = "host_worker"
STATUS_FILE = "status.json"
EVENTS_FILE = "events.jsonl"
CONTROL_DIR = "control"
STOP_REQUEST_FILE = "stop.json"
LAUNCHER_STATE_FILE = "launcher_state.json"
S3SYNC_STATE_FILE = "s3sync.json"      # control/: the checkpoint sync's last pass
LAUNCHER_LOG = os.path.join("logs", "launcher.log")
DRAIN_DIR = "drain"
WARM_DIR = "warm"
# The launcher's default checkpoint directory and the names in it (ckpt-<step>/, meta.json written last).
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_PREFIX = "ckpt-"
CHECKPOINT_META = "meta.json"
RESULT_FILE = os.path.join("results", "final.json")
# status.json's ``state``; the launcher applies host_worker changes in the active ones.
STATES = ("starting", "running", "resizing", "stopped", "finished", "failed")
ACTIVE_STATES = ("starting", "running", "resizing")
# A status written longer ago than this means the launcher is gone or stuck.
STALE_AFTER_S = 60.0
WARM_TTL = 900.0        # s: a warm request's default life, longer than add_workers' join timeout (600 s)
FLUSH_TIMEOUT = 60.0    # s: longer than one append's lock wait (30 s) plus its fsync


class JobFiles:
    """Paths of one job's files under the shared volume ``efs_mount``."""

    def __init__(self, efs_mount, checkpoint_dir=None):
        self.efs = os.path.abspath(efs_mount)
        _ROOTS.add(self.efs)            # below it nothing is followed (see _open_dir)
        self.host_worker = os.path.join(self.efs, HOST_WORKER_FILE)
        self.log = default_log_path(self.host_worker)
        self.events = os.path.join(self.efs, EVENTS_FILE)
        self.status = os.path.join(self.efs, STATUS_FILE)
        self.control = os.path.join(self.efs, CONTROL_DIR)
        self.stop_request = os.path.join(self.control, STOP_REQUEST_FILE)
        self.launcher_state = os.path.join(self.control, LAUNCHER_STATE_FILE)
        self.s3sync_state = os.path.join(self.control, S3SYNC_STATE_FILE)
        self.launcher_log = os.path.join(self.efs, LAUNCHER_LOG)
        self.checkpoints = checkpoint_dir or os.path.join(self.efs, CHECKPOINT_DIR)
        self.result = os.path.join(self.efs, RESULT_FILE)


# ------------------------------------------------------------------ JSON files
def write_json(path, obj, indent=None):
    """Write ``obj`` as JSON atomically (readers never see half a file)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write(path, json.dumps(obj, sort_keys=True, indent=indent), mode=0o644)


def read_json(path, default=None):
    """The JSON value in ``path``, or ``default``: missing, a link, too large, not JSON, nested too deep."""
    try:
        return json.loads(read_bytes(path, limit=MAX_JSON_BYTES) or b"null")
    except (OSError, ValueError, RecursionError):
        return default


def append_jsonl(path, record):
    """Append one JSON line under the exclusive lock ``<path>.lock`` (safe across NFS clients)."""
    line = json.dumps(record, sort_keys=True) + "\n"
    with locked(path):
        with os.fdopen(open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, NEW_FILE_MODE), "w",
                       encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())


# ------------------------------------------------------------------ status.json
class JobStatusError(ValueError):
    """status.json exists but is not a JSON object; the message says which file."""


def parse_status(text, source=STATUS_FILE):
    """Parse status.json content; an empty text is an empty status."""
    if not text.strip():
        return {}
    try:
        status = json.loads(text)
    except ValueError as exc:
        raise JobStatusError(f"{source} is not valid JSON ({exc})") from None
    if not isinstance(status, dict):
        raise JobStatusError(f"{source} holds a JSON {type(status).__name__}, not an object")
    return status


def read_status(path):
    """Read and parse status.json; a missing file is an empty status ({})."""
    try:
        return parse_status(read_text(path), source=path)
    except FileNotFoundError:
        return {}


# ------------------------------------------------------------------ events.jsonl
def is_number(value):
    """A JSON number (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_events(text):
    """(records, numbers of the lines that are not a JSON object with ``event`` and ``time``).

    A bad line does not hide the others; the last line may be half-written while
    the launcher appends, which is why this is lenient rather than strict.
    """
    records, bad = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            bad.append(number)
            continue
        if not isinstance(record, dict) or "event" not in record or not is_number(record.get("time")):
            bad.append(number)
            continue
        records.append(record)
    return records, bad


def read_events(path):
    """Read ``events.jsonl``; a missing file is no records (no job has started)."""
    try:
        return parse_events(read_text(path))
    except FileNotFoundError:
        return [], []


def _say(message):
    """A line on stderr (the node's process log; this module runs in node processes, never in a module)."""
    try:
        sys.stderr.write(f"dynatrain_runtime: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):           # no stderr left (interpreter exit)
        pass


class BackgroundAppender:
    """``append_jsonl`` on a thread of its own, records in the order given.

    Rank 0's events (one per epoch) are a lock, an append and an fsync on the shared volume:
    round trips on EFS that a dist_sync job would otherwise wait for on every worker.
    A record is checked when it is ``put`` (it must be JSON: TypeError at the caller's line,
    not a dead writer later); a record that cannot be written (a volume error, a lock held too
    long) is reported on stderr and kept in ``errors``, and the writer goes on.  ``flush()``
    (also at interpreter exit) waits, at most ``timeout`` s, until every record given so far
    is handled.
    """

    def __init__(self, path):
        self.path = path
        self.errors = []                 # (record, message) of the records that could not be written
        self._queue = queue.Queue()
        self._thread = None
        self._start_lock = threading.Lock()
        self._done = threading.Condition()
        self._pending = 0                # records put and not handled yet

    def put(self, record):
        try:
            record = json.loads(json.dumps(record, sort_keys=True))    # the check, and a private copy
        except (TypeError, ValueError) as exc:
            raise TypeError(f"events record is not JSON-serialisable ({exc}): {record!r}") from None
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="dt-events", daemon=True)
                self._thread.start()
                atexit.register(self.flush, FLUSH_TIMEOUT)
        with self._done:
            self._pending += 1
        self._queue.put(record)

    def flush(self, timeout=FLUSH_TIMEOUT):
        """Wait until every record put so far is handled; False (reported) when ``timeout`` s ran out."""
        deadline = time.monotonic() + timeout
        with self._done:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0 or (self._thread is not None and not self._thread.is_alive()):
                    _say(f"{self._pending} record(s) not written to {self.path} within {timeout:.0f} s")
                    return False
                self._done.wait(min(left, 1.0))
        return True

    def _run(self):
        while True:
            record = self._queue.get()
            try:
                append_jsonl(self.path, record)
            # whatever it is, the writer must go on
            except Exception as exc:            # pylint: disable=broad-exception-caught
                self._report(record, exc)
            finally:
                with self._done:
                    self._pending -= 1
                    self._done.notify_all()

    def _report(self, record, exc):
        message = f"cannot append to {self.path}: {type(exc).__name__}: {exc}"
        self.errors.append((record, message))
        del self.errors[:-100]                  # the newest ones: enough to say what went wrong
        _say(message)


# ------------------------------------------------------------------ requests to the launcher
def _unlink_quietly(path):
    """Remove ``path`` (a link itself, never its target; a linked parent directory is refused)."""
    try:
        dfd = _open_dir(os.path.dirname(os.path.abspath(path)))
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        os.unlink(os.path.basename(path), dir_fd=dfd)
    except FileNotFoundError:
        pass
    finally:
        os.close(dfd)


def write_stop_request(files, generation, reason, at="step"):
    """Ask every worker of ``generation`` to stop at the next ``at`` boundary (``control/stop.json``)."""
    write_json(files.stop_request, {"generation": int(generation), "reason": reason, "at": at, "time": time.time()})


def clear_stop_request(files):
    _unlink_quietly(files.stop_request)


def read_stop_request(files):
    return read_json(files.stop_request)


MAX_REQUESTS = 256      # request files read per directory and pass: more are not one cluster's nodes


def _read_requests(directory):
    """``{ip: request}`` of ``<directory>/<ip>.json``: any file there may be hostile, so one that is not
    a JSON object naming the canonical IPv4 address of its file name (or a link, or too large) is skipped;
    at most MAX_REQUESTS, in name order."""
    try:
        dfd = _open_dir(directory)
    except OSError:
        return {}
    try:
        names = sorted(n for n in os.listdir(dfd) if n.endswith(".json") and not n.startswith("."))
    except OSError:
        return {}
    finally:
        os.close(dfd)
    out = {}
    for name in names[:MAX_REQUESTS]:
        ip = name[:-len(".json")]
        try:
            if validate_ip(ip) != ip:
                continue
        except HostWorkerError:
            continue
        req = read_json(os.path.join(directory, name))
        if isinstance(req, dict) and req.get("ip") == ip:
            out[ip] = req
    return out


# ``control/drain/<ip>.json``: a node asks to leave at the next step boundary (a spot
# interruption notice); the launcher removes it from host_worker, logs REMOVED once the
# smaller group runs, and deletes the request.
def drain_dir(files):
    return os.path.join(files.control, DRAIN_DIR)


def write_drain_request(files, ip, reason, **info):
    write_json(os.path.join(drain_dir(files), f"{validate_ip(ip)}.json"),
               dict(info, ip=ip, reason=reason, time=time.time()))


def read_drain_requests(files):
    """``{ip: request}`` of the pending drain requests (unreadable ones are skipped)."""
    return _read_requests(drain_dir(files))


def clear_drain_request(files, ip):
    _unlink_quietly(os.path.join(drain_dir(files), f"{ip}.json"))


# ``control/warm/<ip>.json``: a node is about to join (add_workers writes it before its
# host_worker edit: the host_worker module's ``warm``); the launcher starts a worker process
# there at once (the engine imported, data loaded), so the resize that follows the edit finds it
# warm.  The launcher deletes the request once the node is a member, or when it is older than
# its ``ttl`` (s, measured from when the launcher first saw it: the writer's clock is not the
# master's) and the node never joined (its spare is then ended).
def warm_dir(files):
    return os.path.join(files.control, WARM_DIR)


def write_warm_request(files, ip, ttl=WARM_TTL, **info):
    write_json(os.path.join(warm_dir(files), f"{validate_ip(ip)}.json"),
               dict(info, ip=ip, ttl=float(ttl), time=time.time()))


def read_warm_requests(files):
    """``{ip: request}`` of the pending warm requests (unreadable or misnamed ones are skipped)."""
    return _read_requests(warm_dir(files))


def clear_warm_request(files, ip):
    _unlink_quietly(os.path.join(warm_dir(files), f"{ip}.json"))


# ================================================================== the volume's other names (playbooks reach them through modules)
# A node's data is ready when the prepare_data role's success marker is on the volume (prepare_data_once writes
# it; host_worker's require_data checks it; shared_volume_op removes it when the node goes).
PREPARE_DATA_MARKER = "prepare_data_success_{ip}"
# The wheels the engine roles seed for the nodes (configure_nodes: the mxnet, torch and launcher roles).
WHEELHOUSE_DIR = "wheelhouse"
# A job started afresh (train_fresh) moves these to runs/<UTC time>/; host_worker and host_worker_log stay
# (membership and SEQ carry on).
RUNS_DIR = "runs"
JOB_ARCHIVE_NAMES = (CHECKPOINT_DIR, os.path.dirname(RESULT_FILE), STATUS_FILE, EVENTS_FILE, CONTROL_DIR)
ARCHIVE_STAMP = "%Y%m%dT%H%M%SZ"


def prepare_data_marker(ip):
    """The file name of the data marker of the node ``ip`` (validated: a name, never a path)."""
    return PREPARE_DATA_MARKER.format(ip=validate_ip(ip))


def _entry(dfd, name):
    """The lstat of ``name`` in the directory ``dfd`` (a link is the link), or None."""
    try:
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def remove_prepare_data_markers(efs_mount, ips, check=False):
    """Remove the data markers of the nodes ``ips`` under ``efs_mount``; returns the names removed (in check mode:
    that would be). No link is followed: a link planted under a marker's name is removed itself, never its
    target; a directory there is refused (NotRegularFile)."""
    names = [prepare_data_marker(ip) for ip in ips]
    JobFiles(efs_mount)                 # registers the root: nothing below it is followed
    dfd = _open_dir(efs_mount)
    removed = []
    try:
        for name in dict.fromkeys(names):
            st = _entry(dfd, name)
            if st is None:
                continue
            if stat.S_ISDIR(st.st_mode):
                raise NotRegularFile(errno.EISDIR, "a directory, not a data marker", os.path.join(efs_mount, name))
            if not check:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=dfd)
            removed.append(name)
        if removed and not check:
            with contextlib.suppress(OSError):
                os.fsync(dfd)
    finally:
        os.close(dfd)
    return removed


def _archive_dir(runs_fd, stamp):
    """A new directory runs/<stamp>[-N]/ (O_EXCL by mkdir: never an existing one, never a link); (name, fd)."""
    for attempt in range(100):
        name = stamp if attempt == 0 else f"{stamp}-{attempt}"
        try:
            os.mkdir(name, 0o755, dir_fd=runs_fd)
        except FileExistsError:
            continue
        return name, os.open(name, os.O_RDONLY | os.O_DIRECTORY | _nofollow_flags(), dir_fd=runs_fd)
    raise HostWorkerError(f"{RUNS_DIR}/{stamp}-1 to -99 exist already: remove old archives")


def archive_job(efs_mount, check=False, now=None):
    """Move the job's files (JOB_ARCHIVE_NAMES, those present) under ``efs_mount`` to a new directory
    ``runs/<UTC time>/``, each by one rename (a link is moved as the link, never followed; ``runs`` itself must
    be a directory, not a link). Returns ``(archive path or None, names moved)``; nothing to move: ``(None, [])``,
    so a second run changes nothing. ``check``: nothing changes, the path says where they would go."""
    JobFiles(efs_mount)                 # registers the root: nothing below it is followed
    dfd = _open_dir(efs_mount)
    try:
        present = [name for name in JOB_ARCHIVE_NAMES if _entry(dfd, name) is not None]
        stamp = time.strftime(ARCHIVE_STAMP, time.gmtime(now))
        if not present:
            return None, []
        if check:
            return os.path.join(os.path.abspath(efs_mount), RUNS_DIR, stamp), present
        with contextlib.suppress(FileExistsError):
            os.mkdir(RUNS_DIR, 0o755, dir_fd=dfd)
        runs_fd = os.open(RUNS_DIR, os.O_RDONLY | os.O_DIRECTORY | _nofollow_flags(), dir_fd=dfd)
        try:
            name, dest_fd = _archive_dir(runs_fd, stamp)
        finally:
            os.close(runs_fd)
        try:
            for entry in present:
                os.rename(entry, entry, src_dir_fd=dfd, dst_dir_fd=dest_fd)
            with contextlib.suppress(OSError):
                os.fsync(dest_fd)
                os.fsync(dfd)
        finally:
            os.close(dest_fd)
        return os.path.join(os.path.abspath(efs_mount), RUNS_DIR, name), present
    finally:
        os.close(dfd)
