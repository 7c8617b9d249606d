"""Recovery from a survivor: the state of the last completed step, kept in memory by every worker.

With ``update_on_kvstore=False`` every worker applies the same aggregated gradient to the
same weights, so each one holds the job's full state: parameters, optimizer state and
sampler position.  At every step boundary (all workers agreed on the step through the
control pushpull) a worker takes a ``BoundarySnapshot``: device copies of the parameters
and optimizer states (asynchronous engine copies, made before the next step can write
them), the pickled optimizer and the checkpoint meta.  When a peer dies, the survivors
block in the next collective; the launcher sends one of them ``recover`` on the stdin
channel, whose thread writes the snapshot with ``CheckpointStore`` -- the regular
checkpoint format, marked ``meta["recovery"]`` -- and the next generation resumes from
it: only the step in flight is redone (its samples never reached the audit).

MXNet is passed in (``mx``); the meta handling is pure Python.
"""

from __future__ import annotations

import json
import os
import pickle
import time


class BoundarySnapshot:
    """One step boundary's state, immutable once taken (a new one replaces it)."""

    def __init__(self, step, meta, params, states, optimizer_blob, audit=None):
        self.step = int(step)
        self.meta = meta                      # checkpoint meta without "audit", a private copy
        self.params = params                  # name -> NDArray copy (the save_parameters names)
        self.states = states                  # index -> NDArray / tuple / None copies
        self.optimizer_blob = optimizer_blob  # pickle of the optimizer at the boundary
        self.audit = audit                    # (audit_log, n_steps, n_completed) or None
        self.taken = time.time()

    @classmethod
    def take(cls, net, trainer, meta, audit_log=None):
        """Copy the boundary state of ``net``/``trainer`` (call after the step committed).

        ``meta`` is the checkpoint meta of the boundary (its ``audit`` is ignored: the
        append-only ``audit_log`` is kept by reference with its lengths).  Waits until the
        copies are complete: a snapshot that depends on a collective that may never finish
        (a dead peer) must never replace a good one.
        """
        meta = json.loads(json.dumps({k: v for k, v in meta.items() if k != "audit"}))
        params = {key: p._reduce() for key, p in net._collect_params_with_prefix().items()}
        states = {i: _copy_state(s) for i, s in trainer._updaters[0].states.items()}
        blob = pickle.dumps(trainer._updaters[0].optimizer)
        for arr in _arrays(list(params.values()) + list(states.values())):
            arr.wait_to_read()
        audit = None
        if audit_log is not None:
            audit = (audit_log, len(audit_log["steps"]), len(audit_log["completed_epochs"]))
        return cls(meta["step"], meta, params, states, blob, audit)

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
        def payload(tmp):
            save = mx.npx.save if mx.util.is_np_array() else mx.nd.save
            save(os.path.join(tmp, "params"), self.params)
            # the Trainer.save_states format (update_on_kvstore=False): pickle((states, optimizer))
            with open(os.path.join(tmp, "trainer.states"), "wb") as handle:
                handle.write(pickle.dumps((self.states, pickle.loads(self.optimizer_blob))))

        return store.write(self.step, self.checkpoint_meta(**recovery), payload)


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
