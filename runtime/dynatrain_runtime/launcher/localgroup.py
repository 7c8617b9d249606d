"""``child --procs N``: the wrapper of a torch node that runs N processes (one per GPU), as torchrun does.

The launcher knows one process per *host* (its membership, failure detection, drain, stop and
recovery stay per host); this wrapper is that process.  It starts N copies of the script, local rank
``i`` with its own ``LOCAL_RANK`` and ``RANK`` (``torchenv.local_env``: the node's environment is
that of its local rank 0), and

* fans the launcher's stdin lines out to all of them (an ``assign`` rewritten per local rank), but
  ``recover`` only to local rank 0: one survivor process of the host writes the state;
* merges their ``@@DT`` messages (``Merge``) into one host's: "ready", "stop_ack" (the most
  steps), a "stopped" heartbeat and "done" only once every local process said it, "alive" once
  every one still at work did (a stopped one may exit while rank 0 writes the stop checkpoint);
  other heartbeats are local rank 0's; everything else (checkpoint, recovery, peer_lost) passes;
* passes their output through whole lines, ``[local i]`` in front;
* ends them all when one fails (an exit status other than 0 or EXIT_STOPPED, or a signal) and
  exits with its status: a lost local process loses its host, as a lost host does.  Once all ended
  by themselves, exits with 0, or EXIT_STOPPED when any stopped at the boundary.

With ``--alive S`` (a script written for torchrun, no helper API) the wrapper says "alive" for them,
and "exited" (``exited_line``) after their last output line, as the one-process wrapper does: the
launcher's restart of a torchrun script reads its end (and status) from it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from ..contract.protocol import CMD_RECOVER, EXIT_STOPPED, MSG_PREFIX, MSG_STOP_ACK, parse_message
from .torchenv import local_env

# what a wrapper says for a child that cannot (a torchrun script): "alive", as its own message line
WRAPPER_ALIVE = {"kind": "alive", "by": "wrapper"}
ALIVE_LINE = (MSG_PREFIX + json.dumps(WRAPPER_ALIVE) + "\n").encode()


def exited_line(rc):
    """The wrapper's last ``@@DT`` line: its command ended with ``rc`` (the launcher waits for it over ssh)."""
    return (MSG_PREFIX + json.dumps({"kind": "exited", "rc": rc}) + "\n").encode()


class Merge:
    """The host's messages from its N local processes' (``take``: what to forward, maybe nothing)."""

    def __init__(self, procs):
        self.procs = procs
        self.ready, self.alive = set(), set()
        self.stopped, self.acks, self.done = {}, {}, {}

    def _all(self, seen, local, msg):
        """Record ``msg`` of ``local``; True the first time every local process has one."""
        if local in seen:
            return False
        if isinstance(seen, dict):
            seen[local] = msg
        else:
            seen.add(local)
        return len(seen) == self.procs

    def _alive(self, msg):
        """A sign of life once every process still at work gave one since the last: one that said
        "stopped" or "done" is exiting (rank 0 may still write the stop checkpoint meanwhile)."""
        quiet = set(self.stopped) | set(self.done)
        if not self.alive or any(i not in self.alive for i in range(self.procs) if i not in quiet):
            return []
        self.alive = set()
        return [msg]

    def take(self, local, msg):
        kind = msg.get("kind")
        if kind == "ready":
            return [msg] if self._all(self.ready, local, msg) else []
        if kind == "alive":
            self.alive.add(local)
            return self._alive(msg)
        if kind == "hb" and msg.get("state") == "stopped":
            if self._all(self.stopped, local, msg):
                return [self.stopped[0]]
            return self._alive(dict(WRAPPER_ALIVE))
        if kind == "hb":
            return [msg] if local == 0 and 0 not in self.stopped else []
        if kind == MSG_STOP_ACK:
            if not self._all(self.acks, local, msg):
                return []
            return [dict(self.acks[0], step=max(int(m.get("step", 0)) for m in self.acks.values()))]
        if kind == "done":
            if not self._all(self.done, local, msg):
                return self._alive(dict(WRAPPER_ALIVE))
            return [dict(self.done[0], step=max(int(m.get("step", 0)) for m in self.done.values()))]
        return [msg]


def route(line, procs):
    """``[(local rank, bytes)]``: the launcher's stdin ``line`` for each local process."""
    try:
        msg = json.loads(line.decode("utf-8"))
    except ValueError:
        msg = None
    if not isinstance(msg, dict):
        return [(i, line) for i in range(procs)]
    if msg.get("kind") == CMD_RECOVER:
        return [(0, line)]
    if msg.get("kind") == "assign" and isinstance(msg.get("env"), dict):
        return [(i, (json.dumps(dict(msg, env=local_env(msg["env"], i, procs))) + "\n").encode())
                for i in range(procs)]
    return [(i, line) for i in range(procs)]


def exit_status(rcs):
    """``(done, status)`` of the local processes' exit statuses (None: running): a failed one ends the
    host at once; once all ended, 0, or EXIT_STOPPED when any stopped at the boundary."""
    failed = [rc for rc in rcs if rc is not None and rc not in (0, EXIT_STOPPED)]
    if failed:
        rc = failed[0]
        return True, rc if rc >= 0 else 128 - rc
    if any(rc is None for rc in rcs):
        return False, None
    return True, EXIT_STOPPED if EXIT_STOPPED in rcs else 0


END_GRACE, END_KILL_WAIT = 3.0, 2.0   # s: SIGTERM's grace, then the wait after SIGKILL


def end_groups(procs, grace=END_GRACE):
    """SIGTERM every process's group, SIGKILL what is left after ``grace`` s (also ``child``'s one process)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, END_KILL_WAIT)):
        live = [p for p in procs if p.poll() is None]
        for p in live:
            try:
                os.killpg(p.pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(p.poll() is None for p in live):
            time.sleep(0.05)


class LocalGroup:
    """N local processes of one host behind one wrapper (see the module doc)."""

    def __init__(self, cmd, env, procs, alive=0.0):
        self.merge = Merge(procs)
        self.lock = threading.Lock()
        self.done = threading.Event()
        self._end_lock = threading.RLock()       # an RLock: a signal handler may interrupt its own thread here
        self._ending = False
        self._ended = threading.Event()
        self.procs = []
        try:
            for i in range(procs):
                self.procs.append(subprocess.Popen(cmd, env=local_env(env, i, procs), stdin=subprocess.PIPE,
                                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                   start_new_session=True))
        except OSError:
            end_groups(self.procs)
            raise
        self.readers = [threading.Thread(target=self._read, args=(i, p), daemon=True)
                        for i, p in enumerate(self.procs)]
        for t in self.readers:
            t.start()
        if alive > 0:
            threading.Thread(target=self._beat, args=(alive,), daemon=True).start()

    def _write(self, data):
        with self.lock:
            try:
                os.write(1, data)
            except OSError:
                pass

    def _read(self, local, proc):
        for raw in iter(proc.stdout.readline, b""):
            msg = parse_message(raw.decode("utf-8", "replace").rstrip("\n"))
            if msg is None:
                self._write(f"[local {local}] ".encode() + (raw if raw.endswith(b"\n") else raw + b"\n"))
                continue
            with self.lock:
                out = self.merge.take(local, msg)
            for m in out:
                self._write((MSG_PREFIX + json.dumps(m, sort_keys=True) + "\n").encode())

    def _beat(self, period):
        self._write(ALIVE_LINE)
        while not self.done.wait(period):
            self._write(ALIVE_LINE)

    def pump_stdin(self):
        """Forward our stdin (fanned out, ``route``); at EOF the launcher is gone: end them all."""
        stdin = sys.stdin.buffer
        while True:
            line = stdin.readline()
            if not line:
                break
            for local, data in route(line, len(self.procs)):
                try:
                    self.procs[local].stdin.write(data)
                    self.procs[local].stdin.flush()
                except (OSError, ValueError):
                    pass
        if not self.done.is_set():
            self.end()

    def end(self):
        """End the processes, once.  The launcher's end closes our stdin (``pump_stdin``) and sends SIGTERM
        (``run_group``): a second SIGTERM could reach a process finishing its own handler's exit -- by then
        Python has put the default handler back -- and kill it (the group said 143, not the script's status).
        A second caller waits for the first one's end (SIGTERM's grace, then SIGKILL's)."""
        with self._end_lock:
            first, self._ending = not self._ending, True
        if first:
            end_groups(self.procs)
            self._ended.set()
        else:
            self._ended.wait(END_GRACE + END_KILL_WAIT + 1.0)

    def say_exited(self, rc):
        """``--alive``: after the processes' last lines, say "exited" (a torchrun script's stop waits for it)."""
        for t in self.readers:
            t.join(timeout=2.0)
        self._write(exited_line(rc))

    def wait(self):
        """Until one failed or all ended; then the others are ended.  Returns the exit status."""
        while True:
            finished, rc = exit_status([p.poll() for p in self.procs])
            if finished:
                break
            time.sleep(0.05)
        self.done.set()
        self.end()
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)     # anything a process left behind in its group
            except OSError:
                pass
        for t in self.readers:
            t.join(timeout=2.0)                      # their last lines
        return rc


def run_group(cmd, env, procs, alive=0.0):
    """``child --procs N``: run the group, exit with its status (``os._exit``, as ``child_main``)."""
    try:
        group = LocalGroup(cmd, env, procs, alive)
    except OSError as exc:
        print(f"launcher child: cannot start {cmd[0]}: {exc}", file=sys.stderr)
        return 127

    def on_signal(signum, _frame):
        group.end()
        if alive > 0:
            group.say_exited(exit_status([p.poll() for p in group.procs])[1])
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    threading.Thread(target=group.pump_stdin, daemon=True).start()
    rc = group.wait()
    if alive > 0:
        group.say_exited(rc)
    sys.stdout.flush()
    os._exit(rc)
