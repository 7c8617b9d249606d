"""What the launcher tells people and tools: its log lines, ``events.jsonl`` and ``status.json``."""

from __future__ import annotations

import os
import sys
import threading
import time

from ..contract.shared_volume import append_jsonl, write_json


class Records:
    """Writes the launcher's output, events and status (status at most every ``status_interval`` s)."""

    def __init__(self, files, status_interval=2.0):
        self.files = files
        self.status_interval = status_interval
        self._out_lock = threading.Lock()
        self._last_status = float("-inf")             # monotonic, as the order below
        self._status_lock = threading.Lock()          # one writer at a time
        self._status_cv = threading.Condition()
        self._status_next = None                      # the newest periodic snapshot not written yet
        self._status_thread = None
        self._status_written = float("-inf")          # order of the status written last
        self.observe = None                           # (event, fields) -> None: the metrics' counters

    def out(self, text):
        with self._out_lock:
            sys.stdout.write(f"{time.strftime('%H:%M:%S')} {text}\n")
            sys.stdout.flush()

    def event(self, event, **fields):
        if self.observe is not None:
            self.observe(event, fields)
        rec = dict(fields, event=event, time=time.time(), source="launcher")
        try:
            append_jsonl(self.files.events, rec)
        except (OSError, ValueError, TypeError) as exc:   # a lock timeout is a ValueError: never fatal
            self.out(f"cannot append to {self.files.events}: {exc}")

    def status(self, snapshot, force=False):
        """Write ``status.json`` from ``snapshot()`` (called only when it is due).

        The periodic writes go through a writer thread (the newest snapshot wins): an fsync on a
        busy or remote volume must not hold the launcher's loop, which notices host_worker edits
        and answers the workers.  Forced ones (state changes) are written at once, in order.
        """
        now = time.monotonic()                        # intervals and order: immune to wall-clock steps
        if not force and now - self._last_status < self.status_interval:
            return
        self._last_status = now
        status = dict(snapshot(), pid=os.getpid(), updated=time.time())
        if force:
            with self._status_lock:
                self._write_status(status, now)
            return
        with self._status_cv:
            self._status_next = (status, now)
            if self._status_thread is None:
                self._status_thread = threading.Thread(target=self._status_writer, name="status", daemon=True)
                self._status_thread.start()
            self._status_cv.notify()

    def _status_writer(self):
        while True:
            with self._status_cv:
                while self._status_next is None:
                    self._status_cv.wait()
                (status, order), self._status_next = self._status_next, None
            with self._status_lock:
                self._write_status(status, order)

    def _write_status(self, status, order):
        if order < self._status_written:                  # a newer (forced) one is there already
            return
        self._status_written = order
        try:
            write_json(self.files.status, status, indent=1)
        except OSError as exc:
            self.out(f"cannot write {self.files.status}: {exc}")
