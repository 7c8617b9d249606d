"""Recovery from a survivor: the state of the last completed step, kept in memory by every worker.

With ``update_on_kvstore=False`` every worker applies the same aggregated gradient to the
same weights, so each one holds the job's full state: parameters, optimizer state and
sampler position.  At a step boundary a worker *issues* a ``BoundarySnapshot``: copies
of the parameters and optimizer states queued on MXNet's engine (ordered after this step's
update and before the next one's, so they hold exactly this boundary's state), the
optimizer's update counters and the checkpoint meta.  Nothing waits for them there: the training thread only
confirms a snapshot when it issues the next one, after later forward passes needed the same
update, so the wait is free.  A confirmed snapshot is never one whose step's collective did
not finish.  ``Elastic`` issues one at a boundary when the wall time since the last is at
least ``1 / SNAPSHOT_BUDGET`` (50) times what issuing costs (a few engine calls): every step
for steps longer than that, every few steps of a toy model, so snapshots take <= 2 % of
the time.

When a peer dies, the survivors block in the next collective; the launcher sends one of
them ``recover`` on the stdin channel, whose thread writes the newest snapshot with
``CheckpointStore`` -- the regular checkpoint format, marked ``meta["recovery"]`` -- the
pending one if its copies complete within ``CONFIRM_WAIT`` s (its step's collective
finished), else the confirmed one.  The next generation resumes from it.

Bound: a lost worker costs at most the steps since the newest usable snapshot -- the
pending one when its step's collective finished, else the confirmed one -- plus the step in
flight: at most two snapshot intervals (each the larger of one step and 50 times a copy's
cost, a few tens of ms of training) plus one step.  With steps longer than 50 copies
(a real model) that is the step in flight and, when the dead peer never pushed the previous
step's gradients, that step too.  Redone steps never reached the audit (it is written with
the snapshot), so every sample is still used once per epoch.

MXNet is passed in (``mx``); the meta handling is pure Python and shared with the torch
engine's snapshot (``engines.torch.TorchSnapshot``: CPU clones of the model's and the
optimizer's ``state_dict``, complete when taken).
"""

from __future__ import annotations

import os
import threading
import time

CONFIRM_WAIT = 1.0        # s the recover handler waits for a pending snapshot's copies


class BoundarySnapshot:
    """One step boundary's state, immutable once taken (a new one replaces it)."""

    def __init__(self, step, meta, params, states, counters, audit=None, complete=True):
        self.step = int(step)
        self.meta = meta                      # checkpoint meta without "audit", a private copy
        self.params = params                  # name -> NDArray copy (the save_parameters names)
        self.states = states                  # index -> NDArray / tuple / None copies
        self.counters = counters              # the optimizer's update counters at the boundary (plain data)
        self.audit = audit                    # (audit_log, n_steps, n_completed) or None
        self.taken = time.time()
        self.complete = complete              # every copy is known to have completed

    @classmethod
    def issue(cls, net, trainer, meta, audit_log=None):
        """Queue copies of the boundary state of ``net``/``trainer`` (call after the step committed).

        ``meta`` is the checkpoint meta of the boundary (its ``audit`` is ignored: the
        append-only ``audit_log`` is kept by reference with its lengths).  Returns at once;
        the snapshot is usable once ``wait()`` or ``ready_within()`` says its copies are
        complete: one that depends on a collective that may never finish (a dead peer)
        must never replace a good one.
        """
        meta, audit = boundary_meta(meta, audit_log)
        params = {key: p._reduce() for key, p in net._collect_params_with_prefix().items()}
        from ..engines.mxnet import optimizer_counters     # (pure Python: no MXNet import)
        states = {i: _copy_state(s) for i, s in trainer._updaters[0].states.items()}
        counters = optimizer_counters(trainer._updaters[0].optimizer)
        return cls(meta["step"], meta, params, states, counters, audit, complete=False)

    @classmethod
    def take(cls, net, trainer, meta, audit_log=None):
        """``issue`` and wait for the copies."""
        snap = cls.issue(net, trainer, meta, audit_log)
        snap.wait()
        return snap

    def wait(self):
        """Block until every copy is complete (forever if its step's collective never finishes)."""
        for arr in _arrays(list(self.params.values()) + list(self.states.values())):
            arr.wait_to_read()
        self.complete = True
        return self

    def ready_within(self, timeout):
        """True when the copies complete within ``timeout`` s (waited for on a helper thread)."""
        if self.complete:
            return True
        waiter = threading.Thread(target=self.wait, name="dt-snapshot-wait", daemon=True)
        waiter.start()
        waiter.join(timeout)
        return self.complete

    def checkpoint_meta(self, **recovery):
        """The checkpoint meta of this boundary, marked as a recovery checkpoint."""
        meta = dict(self.meta, recovery=dict(recovery, snapshot_time=self.taken))
        if self.audit is not None:
            log, n_steps, n_done = self.audit
            meta["audit"] = {"steps": list(log["steps"][:n_steps]),
                             "completed_epochs": list(log["completed_epochs"][:n_done])}
        return meta

    def write(self, mx, store, **recovery):
        """Commit this snapshot as checkpoint ``step`` (atomically); returns its path."""
        from ..engines.mxnet import save_optimizer_state   # the checkpoint's format: one home

        def payload(tmp):
            save = mx.npx.save if mx.util.is_np_array() else mx.nd.save
            save(os.path.join(tmp, "params"), self.params)
            save_optimizer_state(mx, self.states, self.counters, tmp)

        return store.write(self.step, self.checkpoint_meta(**recovery), payload)


def boundary_meta(meta, audit_log=None):
    """``(meta, audit)`` of a snapshot: a private copy of the checkpoint meta without ``audit``, and the
    append-only ``audit_log`` kept by reference with its lengths (``None`` without the audit mode).
    Shared by every engine's snapshot."""
    meta = {k: v for k, v in meta.items() if k != "audit"}
    if meta.get("lr_state") is not None:        # the only mutable part: a private copy
        meta["lr_state"] = dict(meta["lr_state"])
    audit = None
    if audit_log is not None:
        audit = (audit_log, len(audit_log["steps"]), len(audit_log["completed_epochs"]))
    return meta, audit


def _copy_state(state):
    if state is None:
        return None
    if isinstance(state, (tuple, list)):
        return type(state)(_copy_state(s) for s in state)
    return state.copy()


def _arrays(items):
    for item in items:
        if item is None:
            continue
        if isinstance(item, (tuple, list)):
            yield from _arrays(item)
        else:
            yield item
