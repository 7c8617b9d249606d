"""The in-place launch strategy: a membership change keeps the survivors' processes (torch + helper API).

Built on the restart strategy (``restart``: a new set of processes per generation, each resuming from a
checkpoint -- MXNet, whose ps-lite cannot change its worker count, and scripts written for torchrun),
chosen by ``--resize-mode`` (``auto``: in place for the torch engine with the helper API and one
process per node; restart otherwise; ``strategy.choose``).  Beside the strategy's interface:

* ``hold(g, outcome, info)`` (from ``stop``): keep ``g``'s survivors instead of ending them -- a planned
  change whose workers all paused in place at the agreed boundary (no checkpoint written), or a lost
  worker (the master survived and the group had trained: the survivors hold the boundary state in memory);
* ``start(membership)``: the next generation from the held one (none held: the restart path's) -- a fresh
  rendezvous port, ``regroup`` on each survivor's stdin channel (its rank, world and port), ``leave`` to a
  removed host, a warm spare assigned with ``DT_JOIN=peer`` for each joiner (it receives the state from
  the survivors);
* ``release(g, checkpoint)``: give up holding (a shutdown, a fallback): rank 0 writes the stop checkpoint
  from its live boundary state and every held process exits.

A regroup that fails (a worker says ``regroup_failed``, or no first step within ``--regroup-timeout``) is
a failure of its ``InPlaceGeneration`` that is never held again: the loop's survivor recovery writes a
survivor's boundary snapshot and the job goes on by the restart path.  The resize record gets the bytes
moved, the transfer's seconds and rate, chunks refetched and the survivors' pause (``resize_end``).
"""

from __future__ import annotations

import math
import threading
import time

from ..contract.protocol import CMD_LEAVE, CMD_REGROUP
from ..contract.shared_volume import clear_stop_request
from .generation import Generation, clean_int
from .ports import free_port
from .proc import reap
from .restart import Restart
from .torchenv import torch_worker_env

IN_PLACE_REASONS = ("resize", "drain")      # a shutdown's stop still checkpoints and exits
LEAVE_GRACE_S = 5.0                         # a removed worker exits by itself within this, else it is ended
# A regroup that fails on a peer's connection is most often that peer's death, which the launcher sees a poll
# later: the blame waits this long for a member's exit before it falls on the whole group.
BLAME_GRACE_S = 1.0


def resize_mode(setting, engine, script_api, procs, gpus=0):
    """``in-place`` or ``restart`` for ``--resize-mode`` ``setting`` (``auto``: in place where it works and
    was tested -- CPU nodes (gloo); on GPU nodes NCCL's handling of a dead peer is not validated yet, so
    ``auto`` restarts there and ``in-place`` must be asked for)."""
    possible = engine == "torch" and script_api == "elastic" and int(procs) == 1
    if setting == "auto":
        return "in-place" if possible and not gpus else "restart"
    if setting == "in-place" and not possible:
        raise ValueError("--resize-mode in-place needs --engine torch, --script-api elastic and one process per "
                         f"node (got {engine}, {script_api}, {procs} per node): use restart")
    return setting


def _number(value, default=0.0):
    """A finite number from a worker's message (hostile input), else ``default``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return value
    return default


class InPlaceGeneration(Generation):
    """A generation formed in place: its survivors' processes came from the previous one."""

    holds_state = True                      # before its first step, its members hold the boundary state

    def __init__(self, gid, membership, port, procs, boundary, epoch, regroup_timeout, paused_at, step_time):
        super().__init__(gid, membership, port, None, procs=procs)
        self.resume_step = self.max_step = int(boundary)
        self.epoch = epoch
        self.regroup_timeout = regroup_timeout
        self.regroup_failed = {}            # host -> why its regroup failed
        self.regroup_failed_at = None       # monotonic: the first such report
        self.transfer = {}                  # host -> the transfer stats of its "regrouped" heartbeat
        self.pids = {}                      # host -> its training process (a survivor's: the same as before)
        self.paused_at = paused_at          # monotonic: the old group's boundary (or the failure's detection)
        self.prev_step_time = step_time

    def on_heartbeat(self, proc, msg):
        state = msg.get("state")
        if state == "regroup_failed":
            self.regroup_failed[proc.host] = f"in-place regroup failed on {proc.host}: {str(msg.get('error'))[:300]}"
            if self.regroup_failed_at is None:
                self.regroup_failed_at = time.monotonic()
        elif state == "regrouped" and isinstance(msg.get("transfer"), dict):
            self.transfer[proc.host] = msg["transfer"]
            if isinstance(msg.get("pid"), int) and not isinstance(msg.get("pid"), bool):
                self.pids[proc.host] = msg["pid"]
            if self.first_step_at is None:   # the boundary the members agreed on (a kill: their snapshot's)
                self.resume_step = self.max_step = clean_int(msg.get("step"), self.resume_step)
        elif isinstance(msg.get("transfer"), dict):   # an overlapped transfer's figures: with the first step
            self.transfer[proc.host] = msg["transfer"]
        first = super().on_heartbeat(proc, msg)
        if first and self.resize is not None:
            self.resize.set(**self.summary(time.monotonic()))
        return first

    def summary(self, now):
        """The change's cost for ``resize_end``: bytes moved, transfer s and MB/s, refetched chunks, pause."""
        stats = list(self.transfer.values())
        moved = max([int(_number(s.get("bytes"))) for s in stats] or [0])
        seconds = max([float(_number(s.get("seconds"))) for s in stats] or [0.0])
        pause = now - self.paused_at - (self.prev_step_time or 0.0)
        return {"mode": "in-place", "bytes_moved": moved, "transfer_s": round(seconds, 4),
                "transfer_overlapped": any(s.get("overlap") is True for s in stats),
                # s a member's first optimizer step waited at most for the transfer behind it (None: synchronous)
                "transfer_waited_s": max([float(_number(s["waited_s"])) for s in stats if "waited_s" in s]
                                         or [None]),
                "transfer_mb_s": round(moved / 1e6 / seconds, 1) if seconds > 0 and moved else None,
                "chunks": max([int(_number(s.get("chunks"))) for s in stats] or [0]),
                "refetched": max([int(_number(s.get("refetched"))) for s in stats] or [0]),   # every member: the total
                "pause_s": round(max(0.0, pause), 3), "checkpoint_written": False, "pids": dict(self.pids)}

    def exited_badly(self, now, master):
        failed = super().exited_badly(now, master)
        if self.regroup_failed and not failed and now - self.regroup_failed_at >= BLAME_GRACE_S:
            # no member died: whose fault is unknown, blamed on the master, who is never dropped (nobody
            # leaves the log). A member that died meanwhile is the failure instead (its host leaves, FAILED).
            failed[master] = "; ".join(sorted(self.regroup_failed.values()))
        return failed

    def stalled(self, now, master, start_timeout, stall_timeout):
        if self.first_step_at is None:
            start_timeout = min(start_timeout, self.regroup_timeout)
        return super().stalled(now, master, start_timeout, stall_timeout)

    def survivors(self, failed):
        """Before its first step every live member holds the boundary state: the master too when blamed."""
        if self.first_step_at is None:
            failed = {h: why for h, why in failed.items() if h not in self.workers or not self.workers[h].alive()}
        return super().survivors(failed)


class InPlace(Restart):
    """The in-place launch strategy of ``launcher`` (see the module doc)."""

    mode = "in-place"

    def __init__(self, launcher, layout):
        super().__init__(launcher, layout)
        self.held = None                    # the generation whose survivors wait for their regroup
        self.paused_at = None
        self.regroup_timeout = float(launcher.config.regroup_timeout)

    def env(self):
        return dict(super().env(), DT_RESIZE_MODE="in-place")

    def stop(self, g, outcome, info):
        """Hold ``g``'s survivors for an in-place regroup, else end its processes (the restart path)."""
        if not self.hold(g, outcome, info):
            super().stop(g, outcome, info)

    def recovers_in_place(self, g, failed):
        return self.can_recover(g, failed)

    def after_failure(self, g, record):
        if self.holding(g):
            self.annotate(record)
        else:
            super().after_failure(g, record)

    # ------------------------------------------------------------------ hold
    def hold(self, g, outcome, info):
        """True when ``g``'s survivors stay for an in-place regroup (the loop then does not end them)."""
        L = self.launcher
        if outcome == "stopped" and not info.get("timeout") and g.stop_reason in IN_PLACE_REASONS:
            paused = [w for h, w in g.workers.items() if h not in g.exited]
            if not paused or not all((w.last_hb or {}).get("inplace") for w in paused):
                return False
            if L.shutdown:                  # stopping for good: rank 0 checkpoints its boundary state
                self.release(g, checkpoint=True)
                return False
            self.held, self.paused_at = g, time.monotonic()
            return True
        if outcome == "failed" and self.can_recover(g, info):
            lost = [g.workers[h] for h in info if h in g.workers]
            for w in lost:                  # a silent one may still run: it must not rejoin anything
                w.terminate()
            self.held, self.paused_at = g, g.failed_at or time.monotonic()
            return True
        return False

    def can_recover(self, g, failed):
        """A lost worker is recovered in place when the group had trained (its members hold a boundary),
        the master (rank 0, the rendezvous) survived and this is not a regroup that itself failed."""
        L = self.launcher
        if L.config.recovery != "survivor" or g.plain or g.first_step_at is None or L.shutdown:
            return False
        # only a host whose process ended: its connections are closed, so the survivors' collective fails
        # at once and they wait for the regroup.  A silent one (a frozen VM, a vanished host) leaves them
        # blocked until the group's timeout (gloo's pending operations cannot be aborted): restart path.
        if any(h in g.workers and g.workers[h].poll() is None for h in failed):
            return False
        master = g.workers.get(L.master)
        return L.master not in failed and master is not None and master.alive() and bool(g.survivors(failed))

    def holding(self, g):
        return self.held is g

    def annotate(self, resize):
        """A failure recovered in place: say so in its resize record (the boundary is known at the regroup)."""
        resize.set(recovered_from="in-place", resume_step=None, recomputed_steps=None)
        self.launcher.out(f"generation {resize.from_generation}: the survivors re-form in place from their "
                          "boundary state (the step in flight is redone, or kept when its gradient exchange had "
                          "completed)")

    # ------------------------------------------------------------------ start
    def start(self, membership):
        """The next generation from the held one; the restart path's when there is none held."""
        L, prev = self.launcher, self.held
        self.held = None
        if prev is None:
            return super().start(membership)
        survivors = {h: w for h, w in prev.workers.items()
                     if h in membership and h not in prev.exited and w.alive()}
        if L.master not in survivors:       # rank 0 hosts the rendezvous and never leaves
            self.release(prev, checkpoint=False)
            return super().start(membership)
        gid = L.intake.next_generation_id()
        port = free_port(L.config.port_base, gid)
        g = InPlaceGeneration(gid, membership, port, L.procs, prev.max_step, prev.epoch, self.regroup_timeout,
                              self.paused_at or time.monotonic(), prev.step_time or L.step_time)
        L.joining = None
        clear_stop_request(L.files)
        env = torch_worker_env(membership, L.master, port, gid, L.procs)
        leaving = [w for h, w in prev.workers.items() if h not in survivors]
        for w in leaving:
            w.send({"kind": CMD_LEAVE, "generation": prev.id, "checkpoint": False})
        self._retire(leaving, prev.id)
        joiners = []
        for host in membership:
            if host in survivors:
                w = survivors[host]
                w.generation, w.stopped, w.last_hb = gid, False, None
                w.send({"kind": CMD_REGROUP, "generation": gid, "env": env[host]})
            else:
                w = L.spares.take(host, "worker")
                w.assign("worker", gid, dict(env[host], DT_GENERATION=str(gid), DT_RESUME="none", DT_JOIN="peer"))
                joiners.append(host)
            g.workers[host] = w
        L.spares.plan(membership, L.master)
        L.gen, L.state = g, "resizing"
        L.out(f"generation {gid}: {len(membership)} worker(s) {membership} re-formed in place "
              f"(rendezvous {L.master}:{port}): survivors {sorted(survivors)}, joiners {joiners} "
              f"(state from live peers), left {sorted(h for h in prev.workers if h not in survivors)}")
        L.event("generation_start", generation=gid, membership=membership, world=g.world, port=port,
                procs_per_node=L.procs, servers=[], engine=L.config.engine, resume_step=g.resume_step,
                resume_path=None, inplace=True, survivors=sorted(survivors), joiners=joiners)
        return g

    def _retire(self, procs, gid):
        """Removed (or lost) workers: each exits by itself after ``leave``; whatever is left is ended."""
        procs = [p for p in procs if p is not None]
        if not procs:
            return

        def wait_then_reap():
            deadline = time.monotonic() + LEAVE_GRACE_S
            while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.05)
            reap(procs, 2.0)
        t = threading.Thread(target=wait_then_reap, name=f"leave-g{gid}", daemon=True)
        t.start()
        self.launcher.reapers.append(t)

    # ------------------------------------------------------------------ release
    def release(self, g=None, checkpoint=True):
        """Stop holding: every held worker leaves, rank 0 writing the stop checkpoint first (``checkpoint``);
        waits (``--stop-timeout``) for them to exit, reading their messages (the checkpoint's report)."""
        L = self.launcher
        g = g or self.held
        self.held = None
        if g is None:
            return
        alive = [w for h, w in g.workers.items() if h not in g.exited and w.alive()]
        for w in alive:
            w.send({"kind": CMD_LEAVE, "generation": g.id, "checkpoint": checkpoint})
        deadline = time.monotonic() + L.config.stop_timeout
        while time.monotonic() < deadline and any(w.poll() is None for w in alive):
            L.drain_messages()
        reap(alive, 2.0)
        L.out(f"generation {g.id}: held workers released" + (" (rank 0 wrote the stop checkpoint)" if checkpoint
                                                             else ""))
