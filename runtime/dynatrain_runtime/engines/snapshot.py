"""The engine-neutral part of a boundary snapshot (survivor recovery): meta, audit, waiting, writing.

A snapshot is one step boundary's state kept in memory by every worker (``script/recovery.py``
says when ``Elastic`` takes one and which one a survivor writes); rank 0's periodic checkpoint is
one too, written by the background writer (``script/ckpt_writer.py``).  What is the same for every
engine lives here: the checkpoint meta (a private copy without ``audit``; the append-only
audit log kept by reference with its lengths), the recovery marks a written snapshot carries,
waiting for the copies on a helper thread, and the commit through ``CheckpointStore``.  An
engine's subclass says how the state is copied (``issue``), when its copies are complete
(``wait``) and what a checkpoint of it holds (``payload``): ``engines.mxnet.MXNetSnapshot``
(copies queued on MXNet's engine, complete later), ``engines.torch.TorchSnapshot`` (CPU clones,
complete when taken).  Standard library only.
"""

from __future__ import annotations

import threading
import time


class Snapshot:
    """One step boundary's state, immutable once taken (a new one replaces it)."""

    def __init__(self, step, meta, params, states, counters, audit=None, complete=True):
        self.step = int(step)
        self.meta = meta                      # checkpoint meta without "audit", a private copy
        self.params = params                  # the model's state (the engine's copies)
        self.states = states                  # the optimizer's state (the engine's copies)
        self.counters = counters              # the optimizer's update counters at the boundary (plain data), or None
        self.audit = audit                    # (audit_log, n_steps, n_completed) or None
        self.taken = time.time()
        self.complete = complete              # every copy is known to have completed

    @classmethod
    def issue(cls, model, optimizer, meta, audit_log=None):
        """Start copying the boundary state of ``model``/``optimizer`` (call after the step committed)."""
        raise NotImplementedError

    @classmethod
    def take(cls, model, optimizer, meta, audit_log=None):
        """``issue`` and wait for the copies."""
        return cls.issue(model, optimizer, meta, audit_log).wait()

    def wait(self):
        """Block until every copy is complete; this base's copies are complete when taken."""
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

    def payload(self, tmp):
        """Write the model's and the optimizer's state into ``tmp`` in the engine's checkpoint format."""
        raise NotImplementedError

    def write(self, store, **recovery):
        """Commit this snapshot as checkpoint ``step`` (atomically, ``CheckpointStore.write``); returns its path."""
        return store.write(self.step, self.checkpoint_meta(**recovery), self.payload)


def boundary_meta(meta, audit_log=None):
    """``(meta, audit)`` of a snapshot: a private copy of the checkpoint meta without ``audit``, and the
    append-only ``audit_log`` kept by reference with its lengths (``None`` without the audit mode)."""
    meta = {k: v for k, v in meta.items() if k != "audit"}
    if meta.get("lr_state") is not None:        # the only mutable part: a private copy
        meta["lr_state"] = dict(meta["lr_state"])
    audit = None
    if audit_log is not None:
        audit = (audit_log, len(audit_log["steps"]), len(audit_log["completed_epochs"]))
    return meta, audit
