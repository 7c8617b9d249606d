"""The MXNet 1.9.1 engine: a ``dist_sync`` parameter-server kvstore, Gluon nets and Trainers.

Workers connect through the kvstore the launcher's ``DMLC_*`` environment describes (the
``local`` one outside the launcher); the metrics vector is one ``pushpull`` of key
``STATS_KEY``; checkpoints are ``params`` (``save_parameters``) and ``trainer.states``
(``Trainer.save_states``); the boundary snapshot is ``recovery.BoundarySnapshot`` (copies
queued on MXNet's engine).  MXNet is imported when the engine is created.
"""

from __future__ import annotations

import os

from .. import devices
from ..recovery import BoundarySnapshot

STATS_KEY = 999983         # int kvstore key of the metrics vector (Trainer uses 0..n-1)


class MXNetEngine:
    """One worker's MXNet side: kvstore, devices, the Gluon net and Trainer's state."""

    name = "mxnet"

    def __init__(self, kvstore="dist_sync"):
        import mxnet as mx  # noqa: E402 (lazy: the pure parts of the runtime must not need MXNet)
        self.mx = mx
        distributed = "DMLC_ROLE" in os.environ
        self.kv = mx.kv.create(kvstore if distributed else "local")
        self.rank, self.world = self.kv.rank, self.kv.num_workers
        self.net = self.trainer = None
        self._ctx = None

    # ----------------------------------------------------------------- devices, model
    def devices(self):
        """Every GPU of the node (``devices.contexts``), else ``[mx.cpu()]``."""
        if self._ctx is None:
            self._ctx = devices.contexts(self.mx)
        return self._ctx

    def bind(self, net, trainer):
        self.net, self.trainer = net, trainer

    @property
    def model(self):
        return self.net

    def load(self, path):
        self.net.load_parameters(os.path.join(path, "params"), ctx=self.devices())
        states = os.path.join(path, "trainer.states")
        if os.path.exists(states):
            self.trainer.load_states(states)

    def save(self, tmp):
        self.net.save_parameters(os.path.join(tmp, "params"))
        self.trainer.save_states(os.path.join(tmp, "trainer.states"))

    def after_load(self, control_len):
        """The metrics key, then the Trainer's keys: rank 0's parameters reach the servers before any pull."""
        mx = self.mx
        self.kv.init(STATS_KEY, mx.nd.zeros((control_len,)))
        init_trainer_kvstore(mx, self.trainer, self.kv)

    def supports_recovery(self):
        """With ``update_on_kvstore`` the optimizer state lives on the servers, not here."""
        return not getattr(self.trainer, "_update_on_kvstore", False)

    def seed(self, value):
        self.mx.random.seed(value)

    def set_lr(self, lr):
        self.trainer.set_learning_rate(lr)

    # ----------------------------------------------------------------- the loss
    @staticmethod
    def grad_scale(world, global_size):
        """``trainer.step(global_size)`` divides the summed gradient by the global batch: no scale here."""
        return 1.0

    def weighted_loss(self, per_sample, weights, scale=1.0):
        loss = (per_sample * self.mx.nd.array(weights, ctx=per_sample.context)).sum()
        return loss * scale if scale != 1.0 else loss

    # ----------------------------------------------------------------- metrics
    @staticmethod
    def keep(value):
        """A reported value: an NDArray stays on the engine (read at the metrics pushpull), else a float."""
        return value if hasattr(value, "asnumpy") else float(value)

    def sum_kept(self, values):
        return float(self.mx.nd.add_n(*values).asnumpy().sum())

    def allreduce(self, values):
        """The sum over the workers of ``values`` (a list of floats) as a NumPy array: one pushpull."""
        mx = self.mx
        arr, out = mx.nd.array(values), mx.nd.zeros((len(values),))
        self.kv.pushpull(STATS_KEY, arr, out=out)
        return out.asnumpy()

    # ----------------------------------------------------------------- recovery
    def snapshot(self, meta, audit_log=None):
        return BoundarySnapshot.issue(self.net, self.trainer, meta, audit_log)

    def write_snapshot(self, snap, store, **recovery):
        return snap.write(self.mx, store, **recovery)

    @staticmethod
    def is_peer_error(exc):
        return False

    def close(self):
        pass


def init_trainer_kvstore(mx, trainer, kv):
    """Initialise the Trainer's kvstore keys now: rank 0's parameters reach the servers before anyone pulls.

    Left lazy (first ``trainer.step``), MXNet 1.9.1 dist_sync can race the broadcast pull against
    the first gradient push and hand rank 0 a corrupted weight (seen: a layer's weights ~0 on rank 0
    only).  ``Trainer._init_params`` broadcasts key by key (init, then pull); here every key is
    initialised, rank 0 waits for its init pushes (the engine completes them on the servers'
    answer), a barrier, then every worker pulls: no pull can reach a server before its key's
    value.  Shared with the plain dist_sync baseline of the benchmarks.
    """
    if getattr(trainer, "_kvstore_params", None) is None or not hasattr(trainer, "_init_kvstore"):
        return
    if not trainer._kv_initialized:
        trainer._init_kvstore()
    store = trainer._kvstore
    ready = [p for p in trainer._params_to_init if not p._deferred_init]
    if store is not None and ready:
        arrays = [(trainer._param2idx[p.name], p._check_and_get(p._data, list)) for p in ready]
        for idx, arrs in arrays:
            store.init(idx, arrs[0])
        mx.nd.waitall()
        if "dist" in store.type:
            store._barrier()
        for idx, arrs in arrays:
            store.pull(idx, arrs, priority=-idx)
        trainer._params_to_init = [p for p in trainer._params_to_init if p._deferred_init]
    mx.nd.waitall()
    if "dist" in kv.type:
        kv._barrier()
