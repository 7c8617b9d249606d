"""The MXNet 1.9.1 engine: a ``dist_sync`` parameter-server kvstore, Gluon nets and Trainers.

Workers connect through the kvstore the launcher's ``DMLC_*`` environment describes (the
``local`` one outside the launcher); the metrics vector is one ``pushpull`` of key
``STATS_KEY``; checkpoints are ``params`` (``save_parameters``) and the optimizer's state
without pickle (``save_optimizer_state``: its arrays in MXNet's NDArray format, their layout
and the optimizer's update counters in JSON); the boundary snapshot is ``MXNetSnapshot``
(copies queued on MXNet's engine).  MXNet is imported when the engine is created.

A checkpoint is data, never code: ``Trainer.save_states`` pickles ``(states, optimizer)`` and
``load_states`` unpickles whatever the file holds, and a checkpoint can come from any prefix
``resume_from`` names.  The optimizer object itself is the script's (its hyperparameters as
the script builds it; the learning rate from the checkpoint meta); only its arrays and
counters are restored.  An older checkpoint's ``trainer.states`` is loaded only when
``DYNATRAIN_TRUST_PICKLED_STATES=1`` says its source is trusted.
"""

from __future__ import annotations

import json
import os

from . import devices
from .denormals import flush_denormals
from .snapshot import Snapshot, boundary_meta

STATS_KEY = 999983         # int kvstore key of the metrics vector (Trainer uses 0..n-1)
STATES_FILE = "optimizer.states"      # the optimizer state's arrays (MXNet's NDArray format)
STATES_LAYOUT = "optimizer.json"      # where each array goes in the updater's states, and the counters
LEGACY_STATES = "trainer.states"      # Trainer.save_states' pickle (checkpoints of older releases)
TRUST_PICKLE_VAR = "DYNATRAIN_TRUST_PICKLED_STATES"


class UntrustedCheckpoint(ValueError):
    """A checkpoint whose optimizer state is a pickle (it could run code when loaded)."""


class MXNetEngine:
    """One worker's MXNet side: kvstore, devices, the Gluon net and Trainer's state."""

    name = "mxnet"

    def __init__(self, kvstore="dist_sync"):
        import mxnet as mx  # noqa: E402 (lazy: the pure parts of the runtime must not need MXNet)
        self.mx = mx
        flush_denormals()        # before the first operation starts MXNet's engine threads (they inherit it)
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
        trainer = self.trainer
        if os.path.exists(os.path.join(path, STATES_LAYOUT)):
            if not trainer._kv_initialized:       # as Trainer.load_states: the updaters exist from here
                trainer._init_kvstore()
            if trainer._params_to_init:
                trainer._init_params()
            load_optimizer_state(self.mx, trainer_updaters(trainer), path)
        elif os.path.exists(os.path.join(path, LEGACY_STATES)):
            if os.environ.get(TRUST_PICKLE_VAR) != "1":
                raise UntrustedCheckpoint(
                    f"{path} holds its optimizer state as a pickle ({LEGACY_STATES}, a checkpoint of an older "
                    f"release): loading it would run whatever code it holds. Resume from a newer checkpoint, or, "
                    f"if you trust where this one comes from, set {TRUST_PICKLE_VAR}=1 in the job's environment "
                    f"(dt_train_env) to load it.")
            trainer.load_states(os.path.join(path, LEGACY_STATES))

    def save(self, tmp):
        self.net.save_parameters(os.path.join(tmp, "params"))
        updaters = trainer_updaters(self.trainer)
        optimizer = updaters[0].optimizer if updaters else None
        save_optimizer_state(self.mx, updaters[0].states if updaters else {}, optimizer_counters(optimizer), tmp)

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
        if all(w == 1.0 for w in weights):    # the usual share, every sample once: no weight array to build
            loss = per_sample.sum()
        else:
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
        return MXNetSnapshot.issue(self.net, self.trainer, meta, audit_log)

    @staticmethod
    def is_peer_error(exc):
        return False

    def close(self):
        pass


class MXNetSnapshot(Snapshot):
    """A step boundary's state: copies of the parameters and optimizer states queued on MXNet's engine.

    With ``update_on_kvstore=False`` every worker applies the same aggregated gradient to the
    same weights, so each one holds the job's full state.  ``issue`` queues the copies after
    this step's update and before the next one's, so they hold exactly this boundary's state,
    and returns at once; they are complete when this step's collective finished (``wait``,
    ``ready_within``): a snapshot whose step depends on a collective that may never finish (a
    dead peer) must never replace a good one.
    """

    @classmethod
    def issue(cls, net, trainer, meta, audit_log=None):   # pylint: disable=arguments-renamed
        """Queue copies of the boundary state of ``net``/``trainer`` (call after the step committed).

        ``meta`` is the checkpoint meta of the boundary (its ``audit`` is ignored: the
        append-only ``audit_log`` is kept by reference with its lengths).
        """
        meta, audit = boundary_meta(meta, audit_log)
        params = {key: p._reduce() for key, p in net._collect_params_with_prefix().items()}
        states = {i: _copy_state(s) for i, s in trainer._updaters[0].states.items()}
        counters = optimizer_counters(trainer._updaters[0].optimizer)
        return cls(meta["step"], meta, params, states, counters, audit, complete=False)

    def wait(self):
        """Block until every copy is complete (forever if its step's collective never finishes)."""
        for arr in _arrays(list(self.params.values()) + list(self.states.values())):
            arr.wait_to_read()
        self.complete = True
        return self

    def payload(self, tmp):
        """``params`` and the optimizer state without pickle: the checkpoint format (``MXNetEngine.save``'s)."""
        import mxnet as mx  # noqa: E402 (imported by the engine that issued this snapshot)
        save = mx.npx.save if mx.util.is_np_array() else mx.nd.save
        save(os.path.join(tmp, "params"), self.params)
        save_optimizer_state(mx, self.states, self.counters, tmp)


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


def trainer_updaters(trainer):
    """The updaters that hold the optimizer state here: the Trainer's, or a local kvstore's; ``[]`` when the
    state lives on the parameter servers (``update_on_kvstore`` with a dist kvstore: nothing to save here)."""
    if not getattr(trainer, "_update_on_kvstore", False):
        return list(trainer._updaters)
    updater = getattr(getattr(trainer, "_kvstore", None), "_updater", None)
    return [updater] if updater is not None else []


def optimizer_counters(optimizer):
    """The optimizer's update counters (what its schedules and Adam's bias correction read): plain data."""
    if optimizer is None:
        return {}
    counts = getattr(optimizer, "_all_index_update_counts", None) or {0: optimizer._index_update_count}
    return {"num_update": int(optimizer.num_update),
            "index_update_counts": {str(dev): {str(i): int(n) for i, n in c.items()} for dev, c in counts.items()}}


def _flatten(state, key, arrays):
    """The JSON layout of one updater state (None, an array, or a tuple/list of them), its arrays into ``arrays``."""
    if state is None:
        return None
    if isinstance(state, (tuple, list)):
        return {"seq": type(state).__name__, "items": [_flatten(s, f"{key}.{j}", arrays) for j, s in enumerate(state)]}
    if not hasattr(state, "asnumpy"):
        raise TypeError(f"optimizer state {key} is a {type(state).__name__}, not an array: it cannot be checkpointed")
    arrays[key] = state
    return key


def _rebuild(layout, arrays, copy):
    if layout is None:
        return None
    if isinstance(layout, dict):
        items = [_rebuild(item, arrays, copy) for item in layout["items"]]
        return tuple(items) if layout["seq"] == "tuple" else list(items)
    return arrays[layout].copy() if copy else arrays[layout]


def save_optimizer_state(mx, states, counters, directory):
    """Write an updater's ``states`` (index -> array / tuple / None) and ``counters`` without pickle."""
    arrays, layout = {}, {}
    for index in sorted(states):
        layout[str(index)] = _flatten(states[index], str(index), arrays)
    if arrays:
        save = mx.npx.save if mx.util.is_np_array() else mx.nd.save
        save(os.path.join(directory, STATES_FILE), arrays)
    with open(os.path.join(directory, STATES_LAYOUT), "w") as handle:
        json.dump({"format": 1, "states": layout, "counters": counters}, handle, sort_keys=True)


def load_optimizer_state(mx, updaters, directory):
    """Restore what ``save_optimizer_state`` wrote into ``updaters`` and their optimizer; no pickle."""
    with open(os.path.join(directory, STATES_LAYOUT)) as handle:
        doc = json.load(handle)
    if doc.get("format") != 1:
        raise ValueError(f"{directory}/{STATES_LAYOUT}: format {doc.get('format')!r} is not one this runtime reads")
    arrays = {}
    if os.path.exists(os.path.join(directory, STATES_FILE)):
        load = mx.npx.load if mx.util.is_np_array() else mx.nd.load
        arrays = load(os.path.join(directory, STATES_FILE))
    for n, updater in enumerate(updaters):
        updater.states = {int(i): _rebuild(lay, arrays, copy=n > 0) for i, lay in doc["states"].items()}
        updater.states_synced = dict.fromkeys(updater.states, False)   # moved to the weights' devices on use
    counters = doc.get("counters") or {}
    optimizer = updaters[0].optimizer if updaters else None
    if optimizer is not None and counters:
        optimizer.num_update = int(counters["num_update"])
        optimizer._all_index_update_counts = {int(dev): {int(i): int(c) for i, c in per.items()}
                                              for dev, per in counters["index_update_counts"].items()}
        optimizer._index_update_count = optimizer._all_index_update_counts.setdefault(0, {})


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
