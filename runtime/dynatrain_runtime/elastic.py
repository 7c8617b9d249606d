"""The helper API an elastic training script uses under the launcher (``Elastic``).

MXNet Gluon is first-class.  A script does::

    from dynatrain_runtime import Elastic
    el = Elastic(num_samples=len(X), global_batch=64, epochs=5, seed=0, lr=0.1)
    net = build_net(); net.initialize(...)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                            kvstore=el.kv, update_on_kvstore=False)
    el.attach(net, trainer)                 # resumes from the latest checkpoint, if any
    for batch in el.batches():              # this worker's share of each global step
        x, y, w = X[batch.indices], Y[batch.indices], nd.array(batch.weights)
        with autograd.record():
            loss = loss_fn(net(x), y) * w
        loss.backward()
        trainer.step(batch.global_size)     # aggregated gradient = mean over the global batch
        batch.report(loss=loss.sum().asscalar(), correct=...)
    sys.exit(el.finish())

Semantics:

* each epoch has one deterministic order (``epoch_order(n, seed, epoch)``);
  a global step consumes the next ``global_batch`` not-yet-consumed samples of
  that order and splits them among the *current* workers (``shard``), so across
  any number of resizes every sample is used exactly once per epoch;
* every step each worker contributes a control flag (one pushpull of a small
  control vector); when the sum is > 0 every worker stops at that same step
  boundary and rank 0 writes an atomic checkpoint (``CheckpointStore``);
* a worker that dies costs at most the step in flight: at every boundary each worker keeps
  an in-memory ``BoundarySnapshot`` (``recovery``) and, asked by the launcher (``recover``
  on the stdin channel, served while the training thread is blocked with the dead peer),
  one survivor writes it as a recovery checkpoint (``DT_RECOVERY=checkpoint`` turns this
  off: a failure then rolls back to the last regular checkpoint);
* ``--batch-policy fixed-global`` (per-worker batch = global / workers) or
  ``fixed-per-worker`` with linear LR scaling warmed up over K steps
  (``LrSchedule``; Goyal et al. 2017).

This module imports MXNet lazily (in ``Elastic()``); the pure parts live in
``data`` (sharding, LR policy), ``checkpoint`` and ``protocol``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import weakref

from .checkpoint import CheckpointStore
from .data import BATCH_POLICIES, LrSchedule, epoch_order, plan_step, step_global_batch
from .jobfiles import JobFiles, append_jsonl, read_stop_request, write_json
from .protocol import EXIT_STOPPED, emit, receive_assignment
from .recovery import BoundarySnapshot

CONTROL_KEY = 999983       # int kvstore key of the per-step control vector (Trainer uses 0..n-1)

# control vector layout: [stop, loss_sum, correct, count] + audit counts (optional)
_C_STOP, _C_LOSS, _C_CORRECT, _C_COUNT, _C_HEAD = 0, 1, 2, 3, 4


class Batch:
    """This worker's share of one global step."""

    __slots__ = ("epoch", "step", "pos", "indices", "weights", "global_size", "world", "rank",
                 "lr", "last_in_epoch", "loss", "correct", "count")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))
        self.loss, self.correct, self.count = 0.0, 0.0, float(sum(1 for w in self.weights if w > 0))

    def report(self, loss=0.0, correct=0.0):
        """Report this worker's summed (weighted) loss and correct predictions for the step."""
        self.loss, self.correct = float(loss), float(correct)


class Elastic:
    """Rank, world size, data share, checkpoint/resume and stop agreement for one worker."""

    def __init__(self, num_samples, global_batch, epochs, seed=0, lr=0.1, batch_policy="fixed-global",
                 per_worker_batch=None, warmup_steps=0, checkpoint_every=0, audit_samples=False,
                 efs_mount=None, checkpoint_dir=None, keep_checkpoints=2, kvstore="dist_sync"):
        if batch_policy not in BATCH_POLICIES:
            raise ValueError(f"unknown batch policy {batch_policy!r}")
        self.num_samples = int(num_samples)
        self.global_batch = int(global_batch)
        self.epochs = int(epochs)
        self.seed = int(seed)
        self.batch_policy = batch_policy
        self.per_worker_batch = int(per_worker_batch or max(1, global_batch // 2))
        self.checkpoint_every = int(checkpoint_every or 0)
        self.audit = bool(audit_samples)
        self.channel = receive_assignment()
        self.efs_mount = efs_mount or os.environ.get("EFS_MOUNT") or os.getcwd()
        self.files = JobFiles(self.efs_mount, checkpoint_dir or os.environ.get("DT_CHECKPOINT_DIR"))
        self.store = CheckpointStore(self.files.checkpoints, keep=keep_checkpoints)
        self.generation = int(os.environ.get("DT_GENERATION", "0"))
        self.host = os.environ.get("DT_WORKER_IP") or os.environ.get("DMLC_NODE_HOST") or socket.gethostname()
        if os.environ.get("DT_EVENTS"):
            self.files.events = os.environ["DT_EVENTS"]
        import mxnet as mx  # noqa: E402 (lazy: the pure parts above must not need MXNet)
        self.mx = mx
        distributed = "DMLC_ROLE" in os.environ
        self.kv = mx.kv.create(kvstore if distributed else "local")
        self.rank, self.world = self.kv.rank, self.kv.num_workers
        self.lr = LrSchedule(batch_policy, lr, self.global_batch, self.per_worker_batch, warmup_steps)
        self.epoch, self.pos, self.step = 0, 0, 0
        self.audit_log = {"steps": [], "completed_epochs": []}
        self.stopped = False
        self.finished = False
        self.job_start = time.time()
        self.train_time = 0.0
        self.resumed_from = None
        self.net = self.trainer = None
        self._gen_start = time.time()
        self._gen_first_step = None
        self._epoch_stats = [0.0, 0.0, 0.0]     # loss, correct, count
        self._epoch_t0 = None
        self._recent = []                        # (time, samples) of recent steps
        self._last_hb = 0.0
        self._on_epoch_end = []
        self._control_len = _C_HEAD + (self.num_samples if self.audit else 0)
        self._meta_extra = {}
        self._stop_checked = 0.0
        self._stop_file = None
        # survivor recovery: the last completed step's state, replaced at every boundary
        self.recovery = os.environ.get("DT_RECOVERY", "survivor") == "survivor"
        self._snapshot = None
        if self.channel is not None:     # weakly: the kvstore must be freed with us, not at interpreter exit
            self.channel.on("recover", _weak_handler(self._on_recover))

    # ----------------------------------------------------------------- setup / resume
    def on_epoch_end(self, fn):
        """Register ``fn(summary_dict)``, called on every rank after the last step of an epoch."""
        self._on_epoch_end.append(fn)

    def attach(self, net, trainer):
        """Bind the Gluon net and Trainer; resume from the latest checkpoint when there is one."""
        mx = self.mx
        self.net, self.trainer = net, trainer
        latest = None
        resume = os.environ.get("DT_RESUME_PATH")
        if resume:   # the launcher names the checkpoint so every worker loads the same one
            with open(os.path.join(resume, "meta.json")) as handle:
                latest = resume, json.load(handle)
        elif os.environ.get("DT_RESUME", "latest") == "latest":
            latest = self.store.latest()
        if latest is not None:
            path, meta = latest
            net.load_parameters(os.path.join(path, "params"), ctx=self._ctx())
            states = os.path.join(path, "trainer.states")
            if os.path.exists(states):
                trainer.load_states(states)
            self.epoch, self.pos, self.step = meta["epoch"], meta["pos"], meta["step"]
            self.seed = meta.get("seed", self.seed)
            self.job_start = meta.get("job_start", self.job_start)
            self.train_time = meta.get("train_time", 0.0)
            self.finished = bool(meta.get("finished"))
            if meta.get("lr_state"):
                self.lr.state = dict(meta["lr_state"])
            if self.audit:
                self.audit_log = meta.get("audit") or self.audit_log
            self.resumed_from = self.step
        self.kv.init(CONTROL_KEY, mx.nd.zeros((self._control_len,)))
        # Initialise the Trainer's kvstore keys now and wait for the broadcast of rank 0's parameters
        # to land.  Left lazy (first trainer.step), MXNet 1.9.1 dist_sync can race the broadcast pull
        # against the first gradient push and hand rank 0 a corrupted weight (seen here: a layer's
        # weights ~0 on rank 0 only, diverging training).
        if getattr(trainer, "_kvstore_params", None) is not None and hasattr(trainer, "_init_kvstore"):
            if not trainer._kv_initialized:
                trainer._init_kvstore()
            if trainer._params_to_init:
                trainer._init_params()
        mx.nd.waitall()
        if "dist" in self.kv.type:
            self.kv._barrier()
        mx.random.seed(self.seed * 1000003 + self.step * 7 + self.rank)
        self.lr.on_world(self.world, self.step)
        if getattr(trainer, "_update_on_kvstore", False):
            self.recovery = False        # the optimizer state lives on the servers, not here
        self._emit_hb("started", force=True)
        return self

    def _ctx(self):
        return self.mx.cpu()

    # ----------------------------------------------------------------- the loop
    def step_batch(self):
        return step_global_batch(self.batch_policy, self.global_batch, self.per_worker_batch, self.world)

    def batches(self):
        """Yield this worker's ``Batch`` for each global step until done or stopped."""
        if self.net is None:
            raise RuntimeError("call attach(net, trainer) before batches()")
        order_epoch, order = None, None
        while self.epoch < self.epochs and not self.finished:
            if order_epoch != self.epoch:
                order_epoch, order = self.epoch, epoch_order(self.num_samples, self.seed, self.epoch)
                if self._epoch_t0 is None or self.pos == 0:
                    self._epoch_t0 = time.time()
            size = self.step_batch()
            indices, weights, global_size = plan_step(order, self.pos, self.world, self.rank, size)
            lr = self.lr.lr_at(self.step)
            self.trainer.set_learning_rate(lr)
            batch = Batch(epoch=self.epoch, step=self.step, pos=self.pos, indices=indices, weights=weights,
                          global_size=global_size, world=self.world, rank=self.rank, lr=lr,
                          last_in_epoch=self.pos + global_size >= self.num_samples)
            t0 = time.time()
            yield batch
            self._commit(batch, time.time() - t0)
            if self.stopped:
                return
        self.finished = True

    def _stop_flag(self, batch):
        req = None
        if self.channel is not None and self.channel.stop is not None \
                and int(self.channel.stop.get("generation", -1)) == self.generation:
            req = self.channel.stop
        else:
            now = time.time()
            if now - self._stop_checked >= 0.2:        # the file is polled at most 5x/s per worker
                self._stop_checked = now
                self._stop_file = read_stop_request(self.files)
            filed = self._stop_file
            if filed and int(filed.get("generation", -1)) == self.generation:
                req = filed
        if req is None:
            return 0.0
        if req.get("at", "step") == "epoch" and not batch.last_in_epoch:
            return 0.0
        return 1.0

    def _commit(self, batch, step_time):
        mx = self.mx
        ctl = [0.0] * self._control_len
        ctl[_C_STOP] = self._stop_flag(batch)
        ctl[_C_LOSS], ctl[_C_CORRECT], ctl[_C_COUNT] = batch.loss, batch.correct, batch.count
        if self.audit:
            for i, w in zip(batch.indices, batch.weights):
                if w > 0:
                    ctl[_C_HEAD + i] += 1.0
        arr, out = mx.nd.array(ctl), mx.nd.zeros((self._control_len,))
        self.kv.pushpull(CONTROL_KEY, arr, out=out)
        agg = out.asnumpy()
        now = time.time()
        # state after the step
        self.pos += batch.global_size
        self.step += 1
        self.train_time += step_time
        self._recent.append((now, batch.global_size))
        self._recent = self._recent[-50:]
        for k, c in ((0, _C_LOSS), (1, _C_CORRECT), (2, _C_COUNT)):
            self._epoch_stats[k] += float(agg[c])
        if self.audit:
            nz = [int(i) for i in (agg[_C_HEAD:] > 0).nonzero()[0]]
            rec = {"step": batch.step, "epoch": batch.epoch, "world": self.world, "gen": self.generation,
                   "idx": nz}
            dup = {str(i): int(agg[_C_HEAD + i]) for i in nz if agg[_C_HEAD + i] > 1.5}
            if dup:
                rec["dup"] = dup
            self.audit_log["steps"].append(rec)
        if self._gen_first_step is None:
            self._gen_first_step = now
        epoch_done = self.pos >= self.num_samples
        if epoch_done:
            loss, correct, count = self._epoch_stats
            summary = {"epoch": self.epoch, "step": self.step, "world": self.world,
                       "train_loss": loss / max(count, 1.0), "train_acc": correct / max(count, 1.0),
                       "samples": int(count), "epoch_time": now - (self._epoch_t0 or now),
                       "samples_per_s": self.samples_per_s(), "generation": self.generation}
            if self.audit:
                self.audit_log["completed_epochs"].append(self.epoch)
            self.epoch += 1
            self.pos = 0
            self._epoch_stats = [0.0, 0.0, 0.0]
            self._epoch_t0 = now
            for fn in self._on_epoch_end:
                fn(summary)
        if self.epoch >= self.epochs:
            self.finished = True
        if agg[_C_STOP] > 0.5 and not self.finished:
            self._snapshot = None        # the stop checkpoint is the boundary state
            self.stopped = True
            self.save_checkpoint(reason="stop")
            self._emit_hb("stopped", force=True)
            return
        if self.finished:
            self.save_checkpoint(reason="final")
        elif self.checkpoint_every and self.step % self.checkpoint_every == 0:
            self.save_checkpoint(reason="periodic")
        if self.recovery and not self.finished:
            self._snapshot = BoundarySnapshot.take(self.net, self.trainer, self.meta(),
                                                   self.audit_log if self.audit else None)
        self._emit_hb("running", force=(self.step == (self.resumed_from or 0) + 1))

    def samples_per_s(self):
        if len(self._recent) < 2:
            return 0.0
        dt = self._recent[-1][0] - self._recent[0][0]
        return sum(n for _when, n in self._recent[1:]) / dt if dt > 0 else 0.0

    # ----------------------------------------------------------------- checkpoint
    def meta(self):
        meta = {"epoch": self.epoch, "pos": self.pos, "step": self.step, "seed": self.seed,
                "world": self.world, "generation": self.generation, "epochs": self.epochs,
                "num_samples": self.num_samples, "global_batch": self.global_batch,
                "batch_policy": self.batch_policy, "lr_state": self.lr.state,
                "job_start": self.job_start, "train_time": self.train_time,
                "finished": self.finished, "time": time.time()}
        if self.audit:
            meta["audit"] = self.audit_log
        meta.update(self._meta_extra)
        return meta

    def save_checkpoint(self, reason="periodic"):
        """Rank 0 writes the checkpoint of the current boundary (other ranks return at once)."""
        if self.rank != 0:
            return None
        t0 = time.time()

        def payload(tmp):
            self.net.save_parameters(os.path.join(tmp, "params"))
            self.trainer.save_states(os.path.join(tmp, "trainer.states"))

        path = self.store.write(self.step, self.meta(), payload)
        emit("checkpoint", step=self.step, epoch=self.epoch, pos=self.pos, path=path, reason=reason,
             seconds=round(time.time() - t0, 4), generation=self.generation)
        return path

    def _on_recover(self, msg):
        """(channel thread) A peer failed: write the last boundary's state as a recovery checkpoint."""
        gen = int(msg.get("generation", -1))
        snap = self._snapshot
        fields = {"generation": self.generation, "host": self.host, "rank": self.rank}
        if gen != self.generation or snap is None:
            why = "another generation" if gen != self.generation else "no completed step to give"
            emit("recovery", ok=False, reason=why, **fields)
            return
        t0 = time.time()
        try:
            path = snap.write(self.mx, self.store, generation=self.generation, writer=self.host, rank=self.rank,
                              failed=msg.get("failed") or [])
        except Exception as exc:            # noqa: BLE001 - reported to the launcher, which falls back
            emit("recovery", ok=False, reason=f"{type(exc).__name__}: {exc}", **fields)
            return
        emit("recovery", ok=True, step=snap.step, epoch=snap.meta["epoch"], pos=snap.meta["pos"], path=path,
             seconds=round(time.time() - t0, 4), **fields)

    # ----------------------------------------------------------------- reporting
    def _emit_hb(self, state, force=False):
        now = time.time()
        if not force and now - self._last_hb < 0.5:
            return
        self._last_hb = now
        emit("hb", state=state, generation=self.generation, host=self.host, rank=self.rank,
             world=self.world, epoch=self.epoch, pos=self.pos, step=self.step,
             samples_per_s=round(self.samples_per_s(), 2), time=now)

    def log_event(self, event, **fields):
        """Rank 0 appends a record to events.jsonl (and tells the launcher)."""
        if self.rank != 0:
            return
        rec = dict(fields, event=event, time=time.time(), generation=self.generation, source="train")
        try:
            append_jsonl(self.files.events, rec)
        except OSError as exc:
            print(f"dynatrain_runtime: cannot append to {self.files.events}: {exc}", file=sys.stderr)

    def write_result(self, result, path=None):
        """Rank 0 writes the final result JSON atomically (default ``$EFS_MOUNT/results/final.json``)."""
        if self.rank != 0:
            return None
        path = path or self.files.result
        res = dict(result, steps=self.step, epochs=self.epoch, wall_time_s=round(time.time() - self.job_start, 3),
                   train_time_s=round(self.train_time, 3), world_at_end=self.world, generation=self.generation)
        write_json(path, res, indent=1)
        return path

    def finish(self):
        """Exit status for the script: 0 = training complete, EXIT_STOPPED = stopped on request."""
        if self.stopped:
            return EXIT_STOPPED
        if self.finished:
            emit("done", step=self.step, epoch=self.epoch, generation=self.generation)
        return 0


def _weak_handler(method):
    """A channel handler that does not keep ``method``'s object alive."""
    ref = weakref.WeakMethod(method)

    def handler(msg):
        fn = ref()
        if fn is None:
            emit("recovery", ok=False, generation=msg.get("generation"), reason="training finished")
        else:
            fn(msg)
    return handler
