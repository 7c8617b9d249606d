"""What the launcher tells people and tools: its log lines, ``events.jsonl`` and ``status.json``."""

from __future__ import annotations

import os
import sys
import threading
import time

from ..jobfiles import append_jsonl, write_json


class Records:
    """Writes the launcher's output, events and status (status at most every ``status_interval`` s)."""

    def __init__(self, files, status_interval=2.0):
        self.files = files
        self.status_interval = status_interval
        self._out_lock = threading.Lock()
        self._last_status = 0.0

    def out(self, text):
        with self._out_lock:
            sys.stdout.write(f"{time.strftime('%H:%M:%S')} {text}\n")
            sys.stdout.flush()

    def event(self, event, **fields):
        rec = dict(fields, event=event, time=time.time(), source="launcher")
        try:
            append_jsonl(self.files.events, rec)
        except OSError as exc:
            self.out(f"cannot append to {self.files.events}: {exc}")

    def status(self, snapshot, force=False):
        """Write ``status.json`` from ``snapshot()`` (called only when it is due)."""
        now = time.time()
        if not force and now - self._last_status < self.status_interval:
            return
        self._last_status = now
        status = dict(snapshot(), pid=os.getpid(), updated=now)
        try:
            write_json(self.files.status, status, indent=1)
        except OSError as exc:
            self.out(f"cannot write {self.files.status}: {exc}")
