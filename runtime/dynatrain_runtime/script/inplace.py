"""In-place membership changes for ``Elastic`` (torch engine, ``DT_RESIZE_MODE=in-place``: the launcher's
``--resize-mode``): the survivors of a change keep their process and their state.

* **A planned change** (``host_worker`` edit, drain): the stop boundary is agreed as today (``stop`` /
  ``stop_ack`` / ``stop_at``); at it, instead of rank 0's checkpoint and an exit, each worker says
  "stopped" with ``inplace`` and waits (``pause``) for the launcher's ``regroup`` -- the new generation's
  rank, world and fresh rendezvous port -- or ``leave`` (a removed host; ``checkpoint``: rank 0 writes the
  stop checkpoint first, the restart path's fallback and a shutdown).  ``regroup``: ``rejoin`` the new
  group in this process, ``settle`` (the joiners receive the state from the survivors, chunked and
  verified), wrap DDP again without a broadcast, and go on with the next step.  The sampler's split,
  the audit and the DT log are untouched: the step count, position and audit log carry on in memory.
* **A lost peer**: DDP's exchange fails (``guard_backward`` sets ``lost``; no exception in the
  script) or the metrics all-reduce raises; the worker says ``peer_lost`` and waits for ``regroup``.
  When the exchange failed it restores its newest boundary snapshot (the copy taken as the exchange failed:
  the step in flight is redone); when a later collective of the step failed, the exchange had completed and
  the model holds the step's update, so it keeps the step (``keep``: committed before the group re-forms)
  instead of going back to a boundary snapshot, which on a large model may be many steps old.  The members
  agree on the newest boundary any of them holds (``settle``'s first collective): a member holds step s + 1
  only if its exchange of step s completed, i.e. every old member's gradient reached it, so a member still
  at s takes that state rather than redoing the step -- the step is committed once either way.
* **A joiner** (a warm spare assigned with ``DT_JOIN=peer``) joins the new group in ``Elastic()``, and
  in ``attach`` receives the header (sampler state, layout) from the survivors; the model and optimizer
  tensors follow behind the first step at the new size, in which the joiner takes a placeholder batch and
  every member's optimizer step waits for the transfer (``_heal``; ``DT_JOIN_OVERLAP=0``, or a kill's
  recovery: before the first step, as the survivors wait).

Whatever fails on the way (the group does not form, a chunk fails its check twice) is said to the
launcher (heartbeat ``regroup_failed``); the worker then stays alive for the launcher's ``recover``
(its boundary snapshot becomes the recovery checkpoint) and the job goes on by the restart path.
"""

from __future__ import annotations

import os
import threading
import time

from ..contract.protocol import CMD_LEAVE, CMD_REGROUP, emit

MODE_VAR = "DT_RESIZE_MODE"
JOIN_VAR = "DT_JOIN"
IN_PLACE_REASONS = ("resize", "drain")      # a shutdown still checkpoints and exits
FAIL_VAR = "DT_TEST_REGROUP_FAIL"           # tests: the worker of this host fails its first regroup
OVERLAP_VAR = "DT_JOIN_OVERLAP"             # "0": a joiner's state moves while the survivors wait (no overlap)


def wanted(engine_name, channel, environ=None):
    """True when this worker runs in place: the torch engine, under the launcher, which asked for it."""
    environ = os.environ if environ is None else environ
    return engine_name == "torch" and channel is not None and environ.get(MODE_VAR) == "in-place"


class InPlaceWorker:
    """One worker's side of in-place changes (see the module doc); ``el`` is its ``Elastic``."""

    def __init__(self, el, peer_wait):
        from ..engines.torch_inplace import LostFlag
        self.el = el
        self.peer_wait = peer_wait
        self.lost = LostFlag(on_set=self._snapshot_at_loss)
        self.loss_snapshot = None            # the boundary state copied when the exchange failed
        self.joining = os.environ.get(JOIN_VAR) == "peer"
        self.healing = None                  # an add's transfer behind the first step (``torch_inplace.Healing``)
        self._heal_hook = None
        self._cmd = None
        self._cmd_ready = threading.Event()

    def handlers(self):
        return {CMD_REGROUP: self._on_regroup, CMD_LEAVE: self._on_leave}

    # ------------------------------------------------------------------ channel thread
    def _on_regroup(self, msg):
        el = self.el
        with el._lock:                       # the new generation's stop commands may follow at once
            el.generation = int(msg["generation"])
            el._stop_gate = el._stop_step = None
            el._stop_known.clear()
            el._stop_reason = None
        os.environ["DT_GENERATION"] = str(el.generation)
        self._cmd = msg
        self._cmd_ready.set()

    def _on_leave(self, msg):
        self._cmd = msg
        self._cmd_ready.set()

    def _await(self, timeout=None):
        """(training thread) The next ``regroup`` or ``leave``; None after ``timeout`` s."""
        if not self._cmd_ready.wait(timeout):
            return None
        self._cmd_ready.clear()
        msg, self._cmd = self._cmd, None
        return msg

    # ------------------------------------------------------------------ training thread
    def applies(self, reason):
        return reason in IN_PLACE_REASONS

    def start(self):
        """(attach) A joiner receives the state from live peers; every member wraps the model (DDP with
        the guarded exchange, behind the stable model the script keeps across changes)."""
        from ..engines.torch_inplace import settle, wrap
        el = self.el
        if self.joining:
            meta, stats, healing = settle(el.engine, -1, self._header, overlap=self._overlap_wanted())
            self._apply(meta)
            self._heal(healing)
            el._phases["transferred"] = time.time()
            wrap(el.engine, self.lost, init_sync=False)
            el._emit_hb("regrouped", force=True, transfer=dict(stats), joined=True, pid=os.getpid())
        else:                                # a generation's start (fresh or from a checkpoint): as DDP does
            wrap(el.engine, self.lost, init_sync=True)

    def pause(self):
        """At the agreed boundary: wait for ``regroup`` (go on in the new group) or ``leave``."""
        el = self.el
        paused = time.time()
        el._emit_hb("stopped", force=True, inplace=True)
        msg = self._await()
        if msg.get("kind") == CMD_LEAVE:
            self._leave(msg)
            return
        self._regroup(msg, paused, restore=False)

    def peer_lost(self):
        return self.lost.is_set()

    # ------------------------------------------------------------------ the overlapped transfer
    def _overlap_wanted(self):
        opt = self.el.engine.optimizer
        return os.environ.get(OVERLAP_VAR, "1") != "0" and hasattr(opt, "register_step_pre_hook")

    def _heal(self, healing):
        """The transfer runs behind the first step: its receivers take a placeholder batch in it (``healing_ranks``)
        and every member's optimizer step waits for the transfer first."""
        self.healing = healing
        if healing is not None:
            self._heal_hook = self.el.engine.optimizer.register_step_pre_hook(
                lambda _opt, _args, _kwargs: self._finish_healing())
            healing.start()

    def healing_ranks(self, step):
        """The ranks that take a placeholder batch in global step ``step`` (the first after an add's regroup)."""
        healing = self.healing
        return frozenset(healing.receivers) if healing is not None and step == healing.stats["step"] else ()

    def _finish_healing(self):
        """(training thread) The transfer ended (a receiver holds the state now); a failure is said to the launcher
        (``regroup_failed``, as the synchronous transfer's) and raised."""
        healing = self.healing
        if healing is None or healing.done:
            return
        # the hook stays registered (a no-op once done) until the commit: removed here, inside the optimizer's
        # loop over its pre-hooks, it would break that loop for a hook the script registered after it
        try:
            healing.finish()
        except Exception as exc:  # noqa: BLE001 - the launcher falls back to the restart path
            self._failed(exc)
            raise

    def after_step(self):
        """(the step's commit) The first step's transfer stats, once: its end is waited for here if no optimizer
        step did (a script that skipped it); {} otherwise."""
        healing = self.healing
        if healing is None:
            return {}
        self._finish_healing()
        self._heal_hook.remove()
        self.healing = None
        return {"transfer": dict(healing.stats)}

    def recover(self, exc=None, keep=None):
        """A peer is gone (the exchange failed, or ``exc`` from a collective): wait for the launcher's
        ``regroup`` and go on from the newest boundary the survivors hold.  ``keep``: the step's update is in
        the model (its exchange completed); called before the group re-forms, it commits the step here.
        True when this member goes on from the kept step; False: the step in flight is redone (or it left)."""
        el = self.el
        exc = exc or self.lost.error
        lost_at = time.time()
        if self.healing is not None:         # the first step's transfer: its group dies with the regroup
            self._heal_hook.remove()
            self.healing.abandon(5.0)
            self.healing = None
        emit("peer_lost", generation=el.generation, host=el.host, rank=el.rank, step=el.step, inplace=True,
             error=f"{type(exc).__name__}: {str(exc)[:300]}")
        msg = self._await(self.peer_wait)
        if msg is None:
            raise RuntimeError(f"a peer is gone and the launcher sent no regroup within {self.peer_wait:.0f} s") \
                from exc
        if msg.get("kind") == CMD_LEAVE:
            self._leave(msg)
            return False
        return self._regroup(msg, lost_at, restore=True, keep=keep)

    # ------------------------------------------------------------------ the change
    def _regroup(self, msg, since, restore, keep=None):
        """Re-form in ``msg``'s group; returns True when this member kept its step in flight (``recover``)."""
        from ..engines.torch_inplace import rejoin, settle, wrap
        el = self.el
        phases = {"assigned": since, "regroup_received": time.time()}
        try:
            if os.environ.get(FAIL_VAR) == el.host and not getattr(self, "_failed_once", False):
                self._failed_once = True
                raise RuntimeError(f"{FAIL_VAR}: this host's regroup fails (a test)")
            step = self._restore(keep) if restore else el.step
            phases["restored"] = time.time()
            rejoin(el.engine, msg["env"], phases)
            el.rank, el.world = el.engine.rank, el.engine.world
            phases["regrouped"] = time.time()
            # a kill's recovery loads its snapshot and sends synchronously (its peers may hold older ones)
            overlap = not restore and self._overlap_wanted()
            meta, stats, healing = settle(el.engine, step, self._header, overlap=overlap)
            if meta is not None:
                self._apply(meta)
            self._heal(healing)
            phases["transferred"] = time.time()
            wrap(el.engine, self.lost, init_sync=False)
        except Exception as exc:  # noqa: BLE001 - the launcher falls back to the restart path
            self._failed(exc)
            raise
        self.lost.clear()
        el.resumed_from = el.step
        el._phases = phases
        el.engine.seed(el.seed * 1000003 + el.step * 7 + el.rank)    # as a restart at this step seeds
        el.lr.on_world(el.world, el.step)
        el._emit_hb("regrouped", force=True, transfer=dict(stats), pid=os.getpid(),
                    pause_to_ready_s=round(time.time() - since, 4))
        return keep is not None and meta is None       # kept, and the group went on from it

    def _failed(self, exc):
        el = self.el
        emit("hb", state="regroup_failed", generation=el.generation, host=el.host, rank=el.rank, step=el.step,
             error=f"{type(exc).__name__}: {str(exc)[:300]}", time=time.time())
        deadline = time.monotonic() + self.peer_wait      # the channel thread serves "recover" meanwhile
        while time.monotonic() < deadline:
            time.sleep(0.1)

    def _leave(self, msg):
        el = self.el
        if msg.get("checkpoint"):
            el._snapshot = el._pending = None
            el.save_checkpoint(reason="stop")
        el.stopped = True
        el._emit_hb("stopped", force=True)

    def _snapshot_at_loss(self):
        """(once, as the backward pass failed) The exchange failed before the optimizer stepped: the model and
        optimizer still hold the last completed step (``el.step``); copy them, as a boundary snapshot."""
        el = self.el
        self.loss_snapshot = el.engine.snapshot(el.meta(), el.audit_log if el.audit else None)

    def _restore(self, keep=None):
        """The boundary this member goes on from: the step in flight when ``keep`` commits it (its update is in
        the live state), else its newest boundary snapshot loaded (the last completed step); -1 without one."""
        from ..engines.torch import clone_to_cpu
        from .recovery import CONFIRM_WAIT
        el = self.el
        at_loss, self.loss_snapshot = self.loss_snapshot, None
        if keep is not None:
            keep()
            return el.step
        snap, pending = el._snapshot, el._pending
        if pending is not None and pending.ready_within(CONFIRM_WAIT):
            snap = pending
        if at_loss is not None and (snap is None or at_loss.step >= snap.step):
            snap = at_loss
        if snap is None:
            return -1
        el.engine.module.load_state_dict(snap.params)
        el.engine.optimizer.load_state_dict(clone_to_cpu(snap.states))   # a copy: the snapshot stays intact
        meta = snap.checkpoint_meta()
        meta.pop("recovery", None)
        self._apply(meta)
        return snap.step

    def _header(self):
        """What a receiver needs besides the tensors: the boundary's checkpoint meta and the epoch's sums."""
        return dict(self.el.meta(), epoch_stats=list(self.el._epoch_stats))

    def _apply(self, meta):
        el = self.el
        with el._lock:
            el.epoch, el.pos, el.step = int(meta["epoch"]), int(meta["pos"]), int(meta["step"])
        el.seed = meta.get("seed", el.seed)
        el.job_start = meta.get("job_start", el.job_start)
        el.train_time = meta.get("train_time", el.train_time)
        el.finished = bool(meta.get("finished"))
        if meta.get("lr_state"):
            el.lr.state = dict(meta["lr_state"])
        if el.audit and meta.get("audit") is not None:
            el.audit_log = meta["audit"]
        if meta.get("epoch_stats") is not None:
            el._epoch_stats = [float(v) for v in meta["epoch_stats"]]
        el.resumed_from = el.step
