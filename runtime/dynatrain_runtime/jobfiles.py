"""The job's files on the shared volume (node side): where they are and how they are written.

``host_worker`` / ``host_worker_log`` have their one home in ``host_worker_file`` (the
same module the Ansible collection uses); this module adds the JSON files:
``events.jsonl`` (appended under a lock), ``status.json`` and the stop request
(``control/stop.json``), both written atomically.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import sys
import threading
import time

from . import host_worker_file as hwf


class JobFiles:
    """Paths of one job's files under the shared volume ``efs_mount``."""

    def __init__(self, efs_mount, checkpoint_dir=None):
        self.efs = os.path.abspath(efs_mount)
        self.host_worker = os.path.join(self.efs, "host_worker")
        self.log = hwf.default_log_path(self.host_worker)
        self.events = os.path.join(self.efs, "events.jsonl")
        self.status = os.path.join(self.efs, "status.json")
        self.control = os.path.join(self.efs, "control")
        self.stop_request = os.path.join(self.control, "stop.json")
        self.launcher_state = os.path.join(self.control, "launcher_state.json")
        self.checkpoints = checkpoint_dir or os.path.join(self.efs, "checkpoints")
        self.result = os.path.join(self.efs, "results", "final.json")


def write_json(path, obj, indent=None):
    """Write ``obj`` as JSON atomically (readers never see half a file)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    hwf.atomic_write(path, json.dumps(obj, sort_keys=True, indent=indent), mode=0o644)


def read_json(path, default=None):
    try:
        with open(path) as handle:
            return json.loads(handle.read() or "null")
    except (OSError, ValueError):
        return default


def append_jsonl(path, record):
    """Append one JSON line under the exclusive lock ``<path>.lock`` (safe across NFS clients)."""
    line = json.dumps(record, sort_keys=True) + "\n"
    with hwf.locked(path):
        with open(path, "a") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())


FLUSH_TIMEOUT = 60.0    # s: longer than one append's lock wait (30 s) plus its fsync


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
                    print(f"dynatrain_runtime: {self._pending} record(s) not written to {self.path} "
                          f"within {timeout:.0f} s", file=sys.stderr, flush=True)
                    return False
                self._done.wait(min(left, 1.0))
        return True

    def _run(self):
        while True:
            record = self._queue.get()
            try:
                append_jsonl(self.path, record)
            except Exception as exc:            # noqa: BLE001 - whatever it is, the writer must go on
                self._report(record, exc)
            finally:
                with self._done:
                    self._pending -= 1
                    self._done.notify_all()

    def _report(self, record, exc):
        message = f"cannot append to {self.path}: {type(exc).__name__}: {exc}"
        self.errors.append((record, message))
        del self.errors[:-100]                  # the newest ones: enough to say what went wrong
        try:
            print(f"dynatrain_runtime: {message}", file=sys.stderr, flush=True)
        except (OSError, ValueError):           # no stderr left (interpreter exit)
            pass


def write_stop_request(files, generation, reason, at="step"):
    """Ask every worker of ``generation`` to stop at the next ``at`` boundary."""
    write_json(files.stop_request, {"generation": int(generation), "reason": reason, "at": at, "time": time.time()})


def clear_stop_request(files):
    try:
        os.unlink(files.stop_request)
    except FileNotFoundError:
        pass


def read_stop_request(files):
    return read_json(files.stop_request)


# ------------------------------------------------------------------ drain requests
# ``control/drain/<ip>.json``: a node asks to leave at the next step boundary (a spot
# interruption notice); the launcher removes it from host_worker, logs REMOVED once the
# smaller group runs, and deletes the request.
def drain_dir(files):
    return os.path.join(files.control, "drain")


def write_drain_request(files, ip, reason, **info):
    write_json(os.path.join(drain_dir(files), f"{hwf.validate_ip(ip)}.json"),
               dict(info, ip=ip, reason=reason, time=time.time()))


def read_drain_requests(files):
    """``{ip: request}`` of the pending drain requests (unreadable ones are skipped)."""
    try:
        names = os.listdir(drain_dir(files))
    except OSError:
        return {}
    out = {}
    for name in names:
        if name.endswith(".json") and not name.startswith("."):
            req = read_json(os.path.join(drain_dir(files), name))
            if isinstance(req, dict) and req.get("ip") == name[:-len(".json")]:
                out[req["ip"]] = req
    return out


def clear_drain_request(files, ip):
    try:
        os.unlink(os.path.join(drain_dir(files), f"{ip}.json"))
    except FileNotFoundError:
        pass


# ------------------------------------------------------------------ warm requests
# ``control/warm/<ip>.json``: a node is about to join (add_workers wrote it before its
# host_worker edit); the launcher starts a worker process there at once (MXNet imported,
# data loaded), so the resize that follows the edit finds it warm.  The launcher deletes
# the request once the node is a member, or when it is older than its ``ttl`` (s) and the
# node never joined (its spare is then ended).
WARM_TTL = 900.0        # s: longer than add_workers' join timeout (600 s)


def warm_dir(files):
    return os.path.join(files.control, "warm")


def write_warm_request(files, ip, ttl=WARM_TTL, **info):
    write_json(os.path.join(warm_dir(files), f"{hwf.validate_ip(ip)}.json"),
               dict(info, ip=ip, ttl=float(ttl), time=time.time()))


def read_warm_requests(files):
    """``{ip: request}`` of the pending warm requests (unreadable or misnamed ones are skipped)."""
    try:
        names = os.listdir(warm_dir(files))
    except OSError:
        return {}
    out = {}
    for name in names:
        if name.endswith(".json") and not name.startswith("."):
            req = read_json(os.path.join(warm_dir(files), name))
            if isinstance(req, dict) and req.get("ip") == name[:-len(".json")]:
                out[req["ip"]] = req
    return out


def clear_warm_request(files, ip):
    try:
        os.unlink(os.path.join(warm_dir(files), f"{ip}.json"))
    except FileNotFoundError:
        pass
