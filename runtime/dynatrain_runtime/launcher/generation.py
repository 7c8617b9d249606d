"""One process group of the job: its membership, its processes and how it is doing.

A group of a script written for torchrun (``plain``: no helper API, so no steps, heartbeats or
boundary) is known only by its processes: the wrapper says they are alive, a stop ends them
(torchrun's restart), and a process that exits by itself with a status of its own failed its
*script* (the group restarts, the host stays: torchrun's restart too) while one whose wrapper
died or whose host stopped answering lost its *host* (dropped, as with the helper API).

Every time here is ``time.monotonic()`` (so is the ``now`` the checks are given): a step of the
wall clock (NTP, a VM resumed) must not look like silence or a stall.
"""

from __future__ import annotations

import math
import time

from ..contract.protocol import EXIT_STOPPED
from ..contract.shared_volume import clean_text

# A worker's ``@@DT`` message is hostile input (the user's code, its dependencies, a compromised
# node): the fields the launcher uses are coerced here, once, and a field of the wrong type is dropped.
INT_FIELDS = ("step", "epoch", "rank", "generation", "rc", "world")
FLOAT_FIELDS = ("samples_per_s", "seconds", "time")
TEXT_FIELDS = ("kind", "path", "reason", "error", "host", "role", "state", "at")
MAX_INT = 1 << 62
PLAIN_PROGRESS_S = 60.0     # a torchrun script's group that trained this long made progress (it reports no steps)


def clean_int(value, default=None):
    """An int (not a bool, not beyond +-2**62), else ``default``."""
    if isinstance(value, int) and not isinstance(value, bool) and -MAX_INT < value < MAX_INT:
        return value
    return default


def clean_message(msg):
    """A copy of a worker's message whose known fields have their types (``None``: not a message)."""
    if not isinstance(msg, dict):
        return None
    out = dict(msg)
    for key in INT_FIELDS:
        if key in out and clean_int(out[key]) is None:
            del out[key]
    for key in FLOAT_FIELDS:
        value = out.get(key)
        if key in out and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                               and math.isfinite(value)):
            del out[key]
    for key in TEXT_FIELDS:
        if key in out:
            out[key] = clean_text(out[key], limit=1000)
    if "phases" in out and not isinstance(out["phases"], dict):
        del out["phases"]
    if "failed" in out and not isinstance(out["failed"], list):
        del out["failed"]
    return out


class Generation:
    """The processes started for one membership, from start to done, stop or failure."""

    holds_state = False                     # before its first step its members hold no boundary state

    def __init__(self, gid, membership, port, resume, plain=False, procs=1):
        self.id = gid
        self.plain = plain                      # a torchrun script: no @@DT messages but "alive"
        self.script_failed = set()              # plain: hosts whose script exited badly (kept)
        self.membership = list(membership)
        self.per_node = procs                   # processes per host (torch: one per GPU), behind one wrapper
        self.port = port
        self.resume = resume                    # (path, meta) or None
        self.resume_step = resume[1]["step"] if resume else 0
        self.workers = {}                       # ip -> Proc
        self.servers = []                       # scheduler first
        self.started = time.monotonic()
        self.first_step_at = None
        self.stop_at = None
        self.stop_reason = None
        self.stop_mode = "step"                 # "step" | "epoch"
        self.stop_acks = {}                     # ip -> steps it had completed when it got "stop"
        self.stop_boundary = None               # the step S sent in "stop_at"
        self.exited = {}                        # ip -> rc
        self.hb = {}                            # ip -> last hb msg
        self.progress_at = time.monotonic()
        self.max_step = self.resume_step
        self.started_hosts = set()
        self.done = False
        self.resize = None                      # info dict of the resize that created this generation
        self.last_ckpt = None
        self.samples_per_s = 0.0
        self.epoch = resume[1]["epoch"] if resume else 0
        self.server_exit_at = None
        self.server_exit = None
        self.server_exit_host = None
        self.spares_warm_s = None               # first step -> every wanted spare ready, s
        self.failed_at = None                   # when a failure was detected
        self.recovery = None                    # a survivor's answer to "recover" ({"ok": ..., "step": ...})
        self.step_time = 0.0                    # observed seconds per step (smoothed), 0 = not yet known
        self._rate_ref = None                   # (time, step) of the last progress used for step_time

    @property
    def world(self):
        """The processes of the group: hosts x processes per host."""
        return len(self.membership) * self.per_node

    def procs(self):
        return list(self.workers.values()) + self.servers

    def on_heartbeat(self, proc, msg):
        """Record a worker's heartbeat; True when it is this generation's first step."""
        msg = clean_message(msg) or {}
        proc.last_hb = msg
        if msg.get("state") == "stopped":
            proc.stopped = True
        self.hb[proc.host] = msg
        self.started_hosts.add(proc.host)
        step = clean_int(msg.get("step"), 0)
        if step > self.max_step:
            now = time.monotonic()
            if self._rate_ref is not None and self.first_step_at is not None:
                per_step = (now - self._rate_ref[0]) / (step - self._rate_ref[1])
                self.step_time = per_step if not self.step_time else 0.7 * self.step_time + 0.3 * per_step
            self._rate_ref = (now, step)
            self.max_step = step
            self.progress_at = now
        self.epoch = clean_int(msg.get("epoch"), self.epoch)
        if msg.get("rank") == 0 and msg.get("samples_per_s"):
            self.samples_per_s = float(msg["samples_per_s"])
        return self.first_step_at is None and step > self.resume_step

    def survivors(self, failed):
        """Workers that can still give the last completed step's state: alive, not failed; rank order."""
        alive = [w for host, w in self.workers.items()
                 if host not in failed and host not in self.exited and w.alive()]
        return sorted(alive, key=lambda w: ((w.last_hb or {}).get("rank", 1 << 30), w.host))

    def survivors_hold_state(self):
        """Can a survivor give the last completed step's state?  Not a torchrun script's (no helper API),
        nor before the first step (the group is at its resume point) unless it was formed in place."""
        return not self.plain and (self.first_step_at is not None or self.holds_state)

    def made_progress(self, now=None):
        """Did the group move the job on?  Steps past its resume point; a torchrun script (no steps):
        a group that trained PLAIN_PROGRESS_S.  The give-up counter counts failures in a row without it."""
        if not self.plain:
            return self.max_step > self.resume_step
        end = self.failed_at or (time.monotonic() if now is None else now)
        return self.first_step_at is not None and end - self.first_step_at >= PLAIN_PROGRESS_S

    # ------------------------------------------------------------------ failure detection
    def exited_badly(self, now, master):
        """Workers whose process ended without being asked; the master if a server died."""
        failed = {}
        for host, w in self.workers.items():
            rc = w.poll()
            if rc is None or host in self.exited:
                continue
            self.exited[host] = rc
            if rc == 0 or (rc == EXIT_STOPPED and self.stop_at is not None):
                continue
            if self.plain and self.stop_at is not None:
                continue    # ended by the stop (SIGTERM): whatever status its script gives
            if self.plain and 0 < rc < 255:
                self.script_failed.add(host)
                failed[host] = f"the script exited with status {rc} (the group restarts; the host stays)"
                continue
            if w.stopped or getattr(w, "done", False):
                continue    # it reported its boundary (or the end) before: how its exit went changes nothing
            hint = " (ssh: host unreachable?)" if rc == 255 else ""
            failed[host] = f"worker process exited with status {rc}{hint}"
        for s in self.servers:
            if s.poll() is not None and self.server_exit_at is None:
                self.server_exit_at = now
                self.server_exit = f"{s.role} exited with status {s.rc}"
                # a server next to a worker (--num-servers per-node) is that host's; the scheduler the master's
                self.server_exit_host = s.host if s.role == "server" else master
        if (self.server_exit_at is not None and now - self.server_exit_at > 3.0 and self.stop_at is None
                and not self.done and len(self.exited) < len(self.workers)):
            failed.setdefault(self.server_exit_host or master, self.server_exit)   # workers can't go on without it
        return failed

    def silent(self, now, failed, start_timeout, dead_timeout):
        """Workers with no sign of life (dead host, frozen VM).

        A worker that reported "stopped" at the stop boundary is left out: it is winding down
        (interpreter exit silences its alive thread; ps-lite's finalize may wait for its peers)
        while rank 0 may still be writing the stop checkpoint on a slow volume.  So is one that said
        "done" (training finished): a torch process's interpreter exit alone can take seconds."""
        out = {}
        for host, w in self.workers.items():
            if host in self.exited or host in failed or w.stopped or getattr(w, "done", False):
                continue
            if w.last_alive is None and now - self.started > start_timeout:
                out[host] = f"worker did not start within {start_timeout:.0f} s"
            elif w.last_alive is not None and now - w.last_alive > dead_timeout:
                out[host] = f"no sign of life for {now - w.last_alive:.1f} s"
        return out

    def stalled(self, now, master, start_timeout, stall_timeout):
        """Everybody alive but no step progress: the laggards, or the whole job (blamed on the master)."""
        if self.stop_at is not None or self.plain:
            return {}                           # (a torchrun script reports no steps)
        ref = self.progress_at if self.first_step_at else self.started
        limit = stall_timeout if self.first_step_at else start_timeout
        if now - ref <= limit:
            return {}
        behind = [h for h, w in self.workers.items()
                  if (w.last_hb or {}).get("step", self.resume_step) < self.max_step]
        if behind and len(behind) < len(self.workers):
            return {h: f"stalled at step {(self.workers[h].last_hb or {}).get('step')} "
                       f"while others reached {self.max_step}" for h in behind}
        return {master: f"no progress for {now - ref:.0f} s (whole job stalled)"}

    def finished_training(self):
        """Every worker said "done" or exited with status 0: the job is complete (some may still be exiting)."""
        return self.done and all(getattr(w, "done", False) or self.exited.get(host) == 0
                                 for host, w in self.workers.items())

    def lost(self, failed):
        """The failed hosts that are gone (dropped from the job), not those whose script failed."""
        return [h for h in failed if h not in self.script_failed]

    def stopped_at_boundary(self):
        """Every worker is past the stop boundary and rank 0 has checkpointed (plain: every one ended)."""
        if self.plain:
            return self.stop_at is not None and len(self.exited) == len(self.workers)
        return (self.stop_at is not None
                and all(w.stopped or host in self.exited for host, w in self.workers.items())
                and any(w.stopped and (w.last_hb or {}).get("rank") == 0 for w in self.workers.values()))
