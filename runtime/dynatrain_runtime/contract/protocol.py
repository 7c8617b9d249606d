"""The launcher <-> process channel.

Process -> launcher: machine-readable lines on stdout, ``@@DT {json}`` (``emit``).
Launcher -> process: JSON lines on stdin; the first is the role assignment (the
process was started pre-warmed, MXNet already imported), later ones are commands:

* ``stop`` / ``stop_ack`` / ``stop_at``: the stop boundary, chosen by the launcher so the
  workers need no per-step collective to agree on it.  The launcher sends every worker
  ``stop``; each answers at once (from its channel thread) ``stop_ack`` with ``step`` =
  the steps it has completed, b, and from then on may complete at most one more step
  (b + 1) before it knows the boundary.  Once every worker has answered, the launcher sends
  ``stop_at`` with ``step`` S = max(b) + 1: nobody is past S, and dist_sync lets every
  worker reach it, so all stop at the first boundary >= S (``at`` = "step"), or at the
  first epoch end >= S (``at`` = "epoch"), and rank 0 checkpoints it.
* ``recover`` (a peer failed): write the last completed step's state as a recovery
  checkpoint.

Commands with a registered handler run on the channel's own thread, so they are served
even while the training thread is blocked in a collective (a dead peer, or a peer that
waits at its stop gate).  Pure Python.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

EXIT_STOPPED = 75          # stopped at a boundary on request; checkpoint written
EXIT_RETIRED = 0           # a pre-warmed process that was never used
EXIT_ORPHANED = 70         # the launcher (or the ssh session) went away
# The launcher's own exit statuses.  Its systemd unit restarts it on any failure but the final
# ones (RestartPreventExitStatus=1 2): those need a person, and status.json says why.
EXIT_GAVE_UP = 1           # final: too many failed generations, or checkpoints exist and none verifies
EXIT_NO_HOST_WORKER = 2    # final: no valid host_worker
EXIT_CRASHED = 3           # an unexpected error: restarted, it resumes from the last checkpoint
MSG_PREFIX = "@@DT "       # worker -> launcher messages on stdout
RESIZE_AT = ("step", "epoch")
SCRIPT_APIS = ("elastic", "torchrun")     # a script uses the helper API, or is written for torchrun
# launcher -> worker commands and the worker's answer (the one home of these names)
CMD_STOP, CMD_STOP_AT, CMD_RECOVER = "stop", "stop_at", "recover"
MSG_STOP_ACK = "stop_ack"
# in place (torch + helper API, ``--resize-mode in-place``): at the stop boundary a survivor waits for
# ``regroup`` (the new generation's environment: it joins the new group in the same process) or ``leave``
CMD_REGROUP, CMD_LEAVE = "regroup", "leave"
RESIZE_MODES = ("auto", "restart", "in-place")


def stop_command(generation, at, reason):
    """Phase 1: every worker of ``generation`` reports its completed steps (``stop_ack``)."""
    return {"kind": CMD_STOP, "generation": int(generation), "at": at, "reason": reason}


def stop_at_command(generation, acks, at):
    """Phase 2: the boundary S = max(acked steps) + 1 every worker stops at (see the module doc)."""
    return {"kind": CMD_STOP_AT, "generation": int(generation), "step": max(int(b) for b in acks) + 1, "at": at}


_EMIT_LOCK = threading.Lock()


def emit(kind, **fields):
    """One machine-readable line for the launcher (it reads our stdout)."""
    fields["kind"] = kind
    line = (MSG_PREFIX + json.dumps(fields, sort_keys=True) + "\n").encode()
    with _EMIT_LOCK:   # raw write: safe from the alive thread, even at interpreter exit
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        os.write(1, line)


def parse_message(line):
    """The message dict of a ``@@DT`` stdout line, or None for ordinary output."""
    if not line.startswith(MSG_PREFIX):
        return None
    try:
        msg = json.loads(line[len(MSG_PREFIX):])
    except ValueError:
        return None
    return msg if isinstance(msg, dict) else None


class StdinChannel:
    """Launcher -> process channel: first line = assignment, later lines = commands.

    Reads fd 0 with ``os.read`` (not ``sys.stdin``): a daemon thread blocked in a buffered
    read aborts the interpreter at exit on Python 3.11 ("_enter_buffered_busy").
    """

    KEEP = (CMD_STOP, CMD_STOP_AT)   # kept until a handler is registered (it may come after them)

    def __init__(self):
        self.handlers = {}        # kind -> fn(msg), run on the channel thread
        self.held = {}            # kind -> the last such command that came before its handler
        self._lock = threading.Lock()
        self._buf = b""

    def on(self, kind, handler):
        """Run ``handler(msg)`` on the channel thread for every ``kind`` command (now for a held one)."""
        with self._lock:
            self.handlers[kind] = handler
            held = self.held.pop(kind, None)
        if held is not None:
            handler(held)

    def _readline(self):
        while b"\n" not in self._buf:
            try:
                chunk = os.read(0, 4096)
            except OSError:
                chunk = b""
            if not chunk:
                rest, self._buf = self._buf, b""
                return rest.decode("utf-8", "replace")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode("utf-8", "replace") + "\n"

    def read_assignment(self):
        line = self._readline()
        if not line.strip():
            sys.exit(EXIT_RETIRED)    # launcher went away before using us
        msg = json.loads(line)
        if msg.get("kind") == "retire":
            sys.exit(EXIT_RETIRED)
        return msg

    def start(self, alive_interval=1.0):
        threading.Thread(target=self._loop, name="dt-stdin", daemon=True).start()
        if alive_interval:
            threading.Thread(target=self._alive, args=(alive_interval,), name="dt-alive", daemon=True).start()

    def _alive(self, interval):
        """Liveness independent of training progress (a stalled step still answers; a dead host does not)."""
        role = os.environ.get("DMLC_ROLE", "worker")
        host = os.environ.get("DT_WORKER_IP") or os.environ.get("DMLC_NODE_HOST")
        gen = int(os.environ.get("DT_GENERATION", "0"))
        while True:
            try:
                emit("alive", role=role, host=host, generation=gen, time=time.time())
            except (OSError, ValueError):
                os._exit(EXIT_ORPHANED)
            time.sleep(interval)

    def _loop(self):
        while True:
            line = self._readline()
            if not line:
                # the launcher (or our ssh session) is gone: nobody can coordinate us any more
                os._exit(EXIT_ORPHANED)
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            kind = msg.get("kind")
            with self._lock:
                handler = self.handlers.get(kind)
                if handler is None and kind in self.KEEP:
                    self.held[kind] = msg
            if handler is not None:
                handler(msg)
            elif kind == CMD_RECOVER:     # nothing registered (yet): no state to give
                emit("recovery", ok=False, generation=msg.get("generation"), reason="no recovery handler",
                     host=os.environ.get("DT_WORKER_IP"))


def receive_assignment():
    """If started by the launcher (pre-warmed), block until it assigns this process a role.

    Says "ready", reads the assignment, applies its environment (DMLC_* etc.) to
    ``os.environ`` and returns the stdin channel; ``None`` when not under the launcher.
    """
    if os.environ.get("DT_ASSIGN") != "stdin":
        return None
    chan = StdinChannel()
    emit("ready", pid=os.getpid())
    msg = chan.read_assignment()
    for key, value in msg.get("env", {}).items():
        os.environ[str(key)] = str(value)
    chan.start()
    return chan
