"""One started process (worker, server or scheduler), local or over ssh, and how processes end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

from ..contract.protocol import parse_message


class Proc:
    """A process started through the child wrapper; its ``@@DT`` messages go to ``msgq``."""

    def __init__(self, host, kind, cmd, msgq, out, stdin_head=b""):
        self.host = host
        self.kind = kind                 # "worker" or "serve" until assigned; then role
        self.role = None
        self.generation = None
        self.label = f"{kind}@{host}"
        self.started = time.monotonic()  # these three: the monotonic clock, as every launcher interval
        self.assigned_at = None
        self.last_alive = None
        self.last_hb = None
        self.ready = False
        self.stopped = False
        self.done = False                # said "done": training finished, it is only exiting
        self.remote = False              # runs over ssh: ``end`` leaves the ending to the remote wrapper
        self.wrapper_rc = None           # the status in the wrapper's "exited" message, once it came
        self.rc = None
        self._msgq, self._out = msgq, out
        self.popen = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        if stdin_head:                   # the wrapper's --env-stdin line (secrets: never on a command line)
            try:
                self.popen.stdin.write(stdin_head)
                self.popen.stdin.flush()
            except (OSError, ValueError):
                pass                     # it died at once: poll() tells
        self.reader = threading.Thread(target=self._read, name="read-" + self.label, daemon=True)
        self.reader.start()

    def _read(self):
        for raw in iter(self.popen.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            msg = parse_message(line)
            if msg is not None:
                self._msgq.put((self, msg))
                continue
            if self.assigned_at is not None or line.strip():
                gen = self.generation if self.generation is not None else "-"
                self._out(f"[g{gen} {self.role or self.kind} {self.host}] {line}")

    def send(self, msg):
        try:
            self.popen.stdin.write((json.dumps(msg) + "\n").encode())
            self.popen.stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def assign(self, role, generation, env):
        self.role, self.generation = role, generation
        self.label = f"{role}@{self.host}"
        self.assigned_at = time.monotonic()
        return self.send({"kind": "assign", "env": env})

    def poll(self):
        if self.rc is None:
            self.rc = self.popen.poll()
        return self.rc

    def alive(self):
        return self.poll() is None

    def terminate(self):
        """Close stdin (the wrapper kills its child) and signal the local process group."""
        try:
            self.popen.stdin.close()
        except (OSError, ValueError):
            pass
        if self.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
            except OSError:
                pass

    def end(self):
        """End it and let it exit by itself: its wrapper ends its command on stdin's EOF, says "exited"
        and exits.  A local one is signalled too; over ssh, a signal would end only the ssh client while
        the remote command is still exiting (a new generation would start beside it), so only the EOF
        goes: the ssh exits with the remote wrapper (the stop timeout bounds the wait)."""
        if not self.remote:
            self.terminate()
            return
        try:
            self.popen.stdin.close()
        except (OSError, ValueError):
            pass

    def kill(self):
        if self.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except OSError:
                pass


def reap(procs, timeout):
    """Terminate procs, wait up to ``timeout`` s, then kill what is left."""
    procs = [p for p in procs if p is not None]
    for p in procs:
        p.terminate()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    for p in procs:
        p.kill()
    for p in procs:
        try:
            p.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
