"""Checkpoints off the training thread: one background writer, at most one write in flight.

``Elastic`` (rank 0) takes a periodic checkpoint as its engine's boundary snapshot -- the one survivor
recovery already uses (``engines.torch.TorchSnapshot``: CPU clones of the ``state_dict``s, through pinned
memory from a GPU; ``engines.mxnet.MXNetSnapshot``: copies queued on MXNet's engine) -- and hands it to
``CheckpointWriter``, whose thread waits for the copies and writes them through ``CheckpointStore``
(payload, sha256 digests, fsync, one atomic rename).  The training thread pays for the snapshot only.

* **One write in flight.**  ``submit`` starts nothing while a write runs and says so (False): the caller
  records the checkpoint that was due in events.jsonl (``checkpoint_skipped``) instead of queueing a second
  copy of the state behind the first.
* **A crash mid-write** leaves the previous checkpoint the newest: the store writes into a hidden temp
  directory and renames it into place last, so a listing never sees a half-written one.
* **Nothing lost on exit.**  A write runs on a fresh non-daemon thread (the interpreter joins it before it
  exits) and ``wait`` -- called by ``Elastic.finish`` and before the torch engine's ``os._exit`` -- blocks
  until it is committed.
* **Errors are not swallowed.**  A write that failed raises ``CheckpointWriteError`` on the training thread
  at the next ``submit``, ``write_now`` or ``wait`` (as the synchronous write raised at once).
* ``write_now`` writes on the caller's thread after the write in flight: the stop and final checkpoints,
  whose completion the launcher reads from rank 0's next message ("stopped" heartbeat, "done").
* ``background=False`` (``DT_CHECKPOINT_ASYNC=0``) runs every write on the caller's thread: the synchronous
  behaviour, kept as the baseline of ``benchmarks/checkpoint/bench_stall.py``.

Standard library only.
"""

from __future__ import annotations

import os
import threading
import time

ASYNC_VAR = "DT_CHECKPOINT_ASYNC"     # "0": periodic checkpoints written on the training thread


class CheckpointWriteError(RuntimeError):
    """A background checkpoint write failed; raised on the training thread at its next checkpoint or exit."""


def background_wanted(explicit=None, environ=None):
    """Whether periodic checkpoints are written in the background: ``explicit``, else ``$DT_CHECKPOINT_ASYNC``
    (``0``/``false``/``no``/``off`` turn it off), else yes."""
    if explicit is not None:
        return bool(explicit)
    environ = os.environ if environ is None else environ
    value = str(environ.get(ASYNC_VAR, "1")).strip().lower()
    if value in ("0", "false", "no", "off"):
        return False
    if value in ("", "1", "true", "yes", "on"):
        return True
    raise ValueError(f"{ASYNC_VAR}={value!r}: expected 1 (background checkpoint writes) or 0 (synchronous)")


def snapshot_meta(snapshot):
    """A boundary snapshot's checkpoint meta as a regular checkpoint's: the audit up to its step, no recovery marks."""
    meta = snapshot.checkpoint_meta()
    meta.pop("recovery", None)
    return meta


def write_snapshot(store, snapshot):
    """Commit ``snapshot`` as regular checkpoint ``snapshot.step`` once its copies are complete; its path."""
    snapshot.wait()                   # MXNet: the queued copies; torch: complete when taken
    return store.write(snapshot.step, snapshot_meta(snapshot), snapshot.payload)


class CheckpointWriter:
    """Runs checkpoint writes one at a time, off the caller's thread when ``background``.

    ``on_done(path, seconds, info)`` is called (on the writing thread) after each committed write,
    ``on_failed(exc, info)`` after a failed one; ``info`` is what the caller passed with the job.
    """

    def __init__(self, background=True, on_done=None, on_failed=None):
        self.background = bool(background)
        self.on_done = on_done
        self.on_failed = on_failed
        self._lock = threading.Lock()
        self._thread = None
        self._writing = None          # the info of the write in flight
        self._error = None            # (exc, info) of a failed write not raised yet

    @property
    def writing(self):
        """The info of the write in flight, or None."""
        with self._lock:
            return self._writing

    def busy(self):
        return self.writing is not None

    def submit(self, job, info):
        """Run ``job() -> path`` in the background (inline when not ``background``); False, nothing started,
        while a write is in flight.  Raises the last failed write's error first."""
        self._raise_failed()
        with self._lock:
            if self._writing is not None:
                return False
            self._writing = info
            if self.background:
                self._thread = threading.Thread(target=self._run, args=(job, info), name="dt-ckpt-writer",
                                                daemon=False)   # the interpreter waits for it at exit
                self._thread.start()
                return True
        self._run(job, info)
        self._raise_failed()
        return True

    def write_now(self, job, info):
        """Wait for the write in flight, then run ``job`` on this thread; its path.  Raises on failure."""
        self.wait()
        with self._lock:
            self._writing = info
        self._run(job, info)
        self._raise_failed()
        return info.get("path")

    def wait(self, timeout=None):
        """Block until no write is in flight (False after ``timeout`` s), then raise a failed write's error."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                return False
        self._raise_failed()
        return True

    def _run(self, job, info):
        t0 = time.perf_counter()
        try:
            path = job()
        except BaseException as exc:       # noqa: BLE001 - kept, raised on the training thread later
            with self._lock:
                self._error, self._writing = (exc, info), None
            if self.on_failed is not None:
                self.on_failed(exc, info)
            if not isinstance(exc, Exception):
                raise
            return
        info["path"] = path
        seconds = time.perf_counter() - t0
        with self._lock:
            self._writing = None
        if self.on_done is not None:
            self.on_done(path, seconds, info)

    def _raise_failed(self):
        with self._lock:
            failed, self._error = self._error, None
        if failed is not None:
            exc, info = failed
            raise CheckpointWriteError(f"writing checkpoint {info.get('step')} ({info.get('reason')}) failed: "
                                       f"{type(exc).__name__}: {exc}") from exc
