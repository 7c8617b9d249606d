"""The helper API an elastic training script uses under the launcher (``Elastic``).

MXNet Gluon and PyTorch are first-class: one copy of the logic below, an engine per framework
(``engines``: ``mxnet`` -- a dist_sync kvstore -- or ``torch`` -- torch.distributed with torchrun's
environment, DistributedDataParallel), chosen by ``engine=`` or ``$DT_ENGINE`` (the launcher's
``--engine``), default mxnet.  An MXNet script does::

    from dynatrain_runtime import Elastic
    el = Elastic(num_samples=len(X), global_batch=64, epochs=5, seed=0, lr=0.1)
    net = build_net(); net.initialize(...)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                            kvstore=el.kv, update_on_kvstore=False)
    el.attach(net, trainer)                 # resumes from the latest checkpoint, if any
    # el.ctx: the node's GPUs (or [cpu]); initialise the net on them and split each share across them
    for batch in el.batches():              # this worker's share of each global step
        x, y, w = X[batch.indices], Y[batch.indices], nd.array(batch.weights)
        with autograd.record():
            loss = loss_fn(net(x), y) * w
        loss.backward()
        trainer.step(batch.global_size)     # aggregated gradient = mean over the global batch
        batch.report(loss=loss.sum().asscalar(), correct=...)
    sys.exit(el.finish())

A PyTorch script::

    el = Elastic(num_samples=len(X), global_batch=64, epochs=5, seed=0, lr=0.1, engine="torch")
    model = Net(); opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt = el.wrap(model, opt)        # on el.device; DDP when world > 1; resumed from the checkpoint
    for batch in el.batches():
        x, y = X[batch.indices].to(el.device), Y[batch.indices].to(el.device)
        out = model(x)
        per_sample = F.cross_entropy(out, y, reduction="none")
        opt.zero_grad()
        batch.weighted_loss(per_sample).backward()   # sum(w * loss) * world / global_size: DDP's average
        opt.step()                                    # of it is the mean over the global batch
        batch.report(loss=..., correct=...)           # tensors: read at the metrics all-reduce only
    sys.exit(el.finish())

Semantics:

* each epoch has one deterministic order (``epoch_order(n, seed, epoch)``);
  a global step consumes the next ``global_batch`` not-yet-consumed samples of
  that order and splits them among the *current* workers (``shard``), so across
  any number of resizes every sample is used exactly once per epoch;
* a step does nothing a plain dist_sync step does not, besides cheap Python bookkeeping:
  the stop boundary is chosen by the launcher and sent on the stdin channel (``stop`` /
  ``stop_at``, see ``protocol``), every worker stops at that same step (or epoch) boundary
  and rank 0 writes an atomic checkpoint (``CheckpointStore``); the loss/accuracy sums are
  aggregated with one pushpull at the end of each epoch (every step only in the audit mode,
  which also sums the sample indices to check exactly-once use);
* a periodic checkpoint (``checkpoint_every``) costs the training thread only a boundary snapshot:
  a background writer (``ckpt_writer``) writes, digests and fsyncs it, one at a time (one due
  meanwhile is skipped, and said in events.jsonl); ``checkpoint_async=False`` or
  ``DT_CHECKPOINT_ASYNC=0`` writes it on the training thread;
* a worker that dies costs at most the step in flight and those since the newest boundary
  snapshot (``recovery`` states the bound): each worker issues an in-memory snapshot (its
  engine's ``snapshot``: MXNet's copies are asynchronous, confirmed when the next is issued) at every
  boundary, or every few of a toy model's so they cost <= 2 % (``SNAPSHOT_BUDGET``), and,
  asked by the launcher (``recover`` on the stdin channel, served while the training
  thread is blocked with the dead peer), one survivor writes it as a recovery checkpoint
  (``DT_RECOVERY=checkpoint`` turns this off: a failure then rolls back to the last
  regular checkpoint);
* in place (torch, the launcher's ``--resize-mode``: ``inplace``): at a change's boundary no checkpoint is
  written and the process stays -- it re-forms the process group, a joiner receives the state from the
  survivors, a lost peer's survivors go on from the last completed step (``docs/inplace.md``);
* ``--batch-policy fixed-global`` (per-worker batch = global / workers) or
  ``fixed-per-worker`` with linear LR scaling warmed up over K steps
  (``LrSchedule``; Goyal et al. 2017).

This module imports the framework lazily (its engine, in ``Elastic()``); the pure parts live in
``data`` (sharding, LR policy), ``checkpoint`` and ``protocol``.  With the torch engine a
collective whose peer died *raises* (in our all-reduce or in DDP's backward hooks, inside the
script): the worker then stays alive, bounded by ``PEER_LOST_WAIT``, for the launcher's
``recover`` (``_hold_for_launcher``; ``sys.excepthook`` for errors raised in the script).
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
import time
import weakref

from ..contract.checkpoint import CheckpointStore, load_meta
from .data import BATCH_POLICIES, LrSchedule, epoch_order, plan_step, step_global_batch
from ..contract.shared_volume import FLUSH_TIMEOUT, BackgroundAppender, JobFiles, write_json
from ..contract.protocol import CMD_RECOVER, CMD_STOP, CMD_STOP_AT, EXIT_STOPPED, MSG_STOP_ACK, emit, receive_assignment
from ..engines import create_engine, engine_name, peer_error_check, prewarm
from ..engines import mxnet as _mxnet_engine
from .recovery import CONFIRM_WAIT
from .ckpt_writer import CheckpointWriteError, CheckpointWriter, background_wanted, write_snapshot
from .inplace import InPlaceWorker, wanted as in_place_wanted

SNAPSHOT_BUDGET = 0.02     # recovery snapshots may take at most this share of the wall time (see _commit)
# s a worker whose collective failed waits for the launcher's recover
PEER_LOST_WAIT = float(os.environ.get("DT_PEER_LOST_WAIT", "60"))
# their home before the engine seam: the benchmarks' plain dist_sync baseline imports them from here
STATS_KEY = _mxnet_engine.STATS_KEY
init_trainer_kvstore = _mxnet_engine.init_trainer_kvstore

# metrics vector layout: [loss_sum, correct, count] + audit counts (audit mode); pushed at epoch ends
# (every step in the audit mode), never for control: the stop boundary comes from the launcher
_C_LOSS, _C_CORRECT, _C_COUNT, _C_HEAD = 0, 1, 2, 3


class Batch:
    """This worker's share of one global step."""

    __slots__ = ("epoch", "step", "pos", "indices", "weights", "global_size", "world", "rank",
                 "lr", "last_in_epoch", "loss", "correct", "count", "grad_scale", "engine")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))
        self.loss, self.correct, self.count = 0.0, 0.0, float(sum(1 for w in self.weights if w > 0))

    @property
    def placeholder(self):
        """True for a share with no sample (weight 0): the worker takes part in the step, adds nothing."""
        return self.count == 0

    def weighted_loss(self, per_sample):
        """The loss to backpropagate: ``sum(weights * per_sample) * grad_scale``.

        ``grad_scale`` makes the aggregated gradient the mean over the global batch: 1 for MXNet
        (``trainer.step(global_size)`` divides), ``world / global_size`` for torch (DDP averages
        over the world), so uneven shares and a placeholder (weight 0) give the right mean.
        """
        return self.engine.weighted_loss(per_sample, self.weights, self.grad_scale)

    def report(self, loss=0.0, correct=0.0):
        """Report this worker's summed (weighted) loss and correct predictions for the step.

        Floats, or one-element MXNet NDArrays / torch tensors: those are summed on the device and
        read only when the metrics are aggregated (epoch end), so reporting needs no per-step sync.
        """
        if self.engine is not None:
            self.loss, self.correct = self.engine.keep(loss), self.engine.keep(correct)
            return
        self.loss = loss if hasattr(loss, "asnumpy") else float(loss)
        self.correct = correct if hasattr(correct, "asnumpy") else float(correct)


class Elastic:
    """Rank, world size, data share, checkpoint/resume and stop agreement for one worker."""

    def __init__(self, num_samples, global_batch, epochs, seed=0, lr=0.1, batch_policy="fixed-global",
                 per_worker_batch=None, warmup_steps=0, checkpoint_every=0, audit_samples=False,
                 efs_mount=None, checkpoint_dir=None, keep_checkpoints=2, kvstore="dist_sync", engine=None,
                 checkpoint_async=None):
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
        prewarm(engine_name(engine))             # a pre-started process imports its framework before the assignment
        self.channel = receive_assignment()
        self.engine_name = engine_name(engine)   # (the assignment may name it)
        launched = os.environ.get("DT_ENGINE") if self.channel is not None else None
        if launched and engine_name(launched) != self.engine_name:
            raise ValueError(f"the launcher runs the {launched} engine (dt-launcher --engine {launched}) but this "
                             f"script uses {self.engine_name}: start the launcher with --engine {self.engine_name}")
        self._phases = {"assigned": time.time()}    # a generation's start, phase by phase (resize latency)
        self.efs_mount = efs_mount or os.environ.get("EFS_MOUNT") or os.getcwd()
        self.files = JobFiles(self.efs_mount, checkpoint_dir or os.environ.get("DT_CHECKPOINT_DIR"))
        self.store = CheckpointStore(self.files.checkpoints, keep=keep_checkpoints)
        self.generation = int(os.environ.get("DT_GENERATION", "0"))
        self.host = os.environ.get("DT_WORKER_IP") or os.environ.get("DMLC_NODE_HOST") or socket.gethostname()
        if os.environ.get("DT_EVENTS"):
            self.files.events = os.environ["DT_EVENTS"]
        self._events = None                      # rank 0's events.jsonl writer (``log_event``)
        # torch: a collective whose peer died raises -- also in the rendezvous, in DDP's hooks, in the
        # script.  A survivor must not exit then: the launcher would take it for lost too.  It waits for
        # the launcher's "recover" (survivor recovery) or the end of the generation (``_hold_for_launcher``).
        self._peer_lost = False
        self._peer_error = peer_error_check(self.engine_name) if self.channel is not None else None
        if self._peer_error is not None:
            _hold_on_peer_errors(self)
        # the framework's side: connect to this generation's workers (the kvstore, or the process group)
        self.engine = create_engine(self.engine_name, kvstore=kvstore)
        self._phases["kv"] = time.time()
        self.rank, self.world = self.engine.rank, self.engine.world
        self.mx = getattr(self.engine, "mx", None)    # MXNet's module and kvstore (the Trainer is built on it)
        self.kv = getattr(self.engine, "kv", None)
        # under the launcher, or in a process group of its own (torchrun's environment: the GPU check's group)
        if self.engine_name == "torch" and (self.channel is not None or getattr(self.engine, "distributed", False)):
            atexit.register(_exit_at_once, self)
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
        self._local_stats = [0.0, 0.0, 0.0]      # this worker's sums since the last metrics pushpull
        self._local_nd = []                      # reported NDArrays (loss, correct), summed at the pushpull
        self._meta_extra = {}
        # the stop boundary (protocol.stop_command): the step count this worker may not pass
        # before it knows the boundary, the boundary, and its epoch/step mode
        self._lock = threading.Lock()
        self._stop_gate = None
        self._stop_step = None
        self._stop_mode = "step"
        self._stop_known = threading.Event()
        self._stop_reason = None          # why the launcher stops us (in place: "resize" and "drain")
        # survivor recovery: the last confirmed boundary's state, and the newest one still copying
        self.recovery = os.environ.get("DT_RECOVERY", "survivor") == "survivor"
        self._snapshot = None
        self._pending = None
        self._snap_cost = 0.0             # s one snapshot costs the training thread (smoothed)
        self._snap_at = 0.0               # when the last one was issued
        # rank 0's checkpoints: periodic ones written off the training thread (``ckpt_writer``)
        self._ckpt_writer = CheckpointWriter(background_wanted(checkpoint_async), on_done=_checkpoint_written,
                                             on_failed=_weakly(self._checkpoint_failed))
        self._ckpt_snapshot = None        # the boundary snapshot of the last periodic checkpoint
        if self.channel is not None:     # weakly: the kvstore must be freed with us, not at interpreter exit
            self.channel.on(CMD_RECOVER, _weak_handler(self._on_recover))
            self.channel.on(CMD_STOP, _weak_handler(self._on_stop))
            self.channel.on(CMD_STOP_AT, _weak_handler(self._on_stop_at))
        # in place (torch, --resize-mode in-place): a change keeps this process and its state (``inplace``)
        self.inplace = InPlaceWorker(self, PEER_LOST_WAIT) if in_place_wanted(self.engine_name, self.channel) \
            else None
        if self.inplace is not None:
            for kind, handler in self.inplace.handlers().items():
                self.channel.on(kind, _weak_handler(handler))

    # ----------------------------------------------------------------- setup / resume
    def on_epoch_end(self, fn):
        """Register ``fn(summary_dict)``, called on every rank after the last step of an epoch."""
        self._on_epoch_end.append(fn)

    def attach(self, net, trainer):
        """Bind the model and its optimizer (Gluon net and Trainer; torch module and optimizer); resume
        from the latest checkpoint when there is one.  torch scripts call ``wrap``."""
        self.engine.bind(net, trainer)
        self.net, self.trainer = self.engine.module if self.engine_name == "torch" else net, trainer
        self._phases["attach"] = time.time()
        latest = None
        resume = os.environ.get("DT_RESUME_PATH")
        if self.inplace is not None and self.inplace.joining:
            pass                                  # a joiner gets the state from live peers (inplace.start)
        elif resume:   # the launcher names the checkpoint so every worker loads the same one
            latest = resume, load_meta(resume)    # its files' digests verified (CheckpointError if not)
        elif os.environ.get("DT_RESUME", "latest") == "latest":
            latest = self.store.latest()
        if latest is not None:
            path, meta = latest
            if meta.get("engine", "mxnet") != self.engine_name:
                raise ValueError(f"checkpoint {path} was written by the {meta.get('engine', 'mxnet')} engine, "
                                 f"this job runs {self.engine_name}: start it with that engine or a new job")
            self.engine.load(path)
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
        self._phases["loaded"] = time.time()
        if self.inplace is not None:       # DDP with the guarded exchange behind a stable model; a joiner's state
            self.inplace.start()
        else:
            self.engine.after_load(self._control_len)     # MXNet: the kvstore keys; torch: DDP (rank 0's state)
        self._phases["synced"] = time.time()
        self.engine.seed(self.seed * 1000003 + self.step * 7 + self.rank)
        self.lr.on_world(self.world, self.step)
        if not self.engine.supports_recovery():
            self.recovery = False        # (MXNet update_on_kvstore) the optimizer state lives on the servers
        self._emit_hb("started", force=True)
        return self

    def wrap(self, model, optimizer):
        """(torch) Bind ``model`` and ``optimizer``, resume from the checkpoint the launcher names, and
        return ``(model, optimizer)`` to train with: the model on ``el.device``, in
        DistributedDataParallel when the world has more than one worker (``el.module`` is the bare one).
        """
        self.attach(model, optimizer)
        return self.engine.model, optimizer

    @property
    def model(self):
        """What the script trains with (torch: the DDP-wrapped module; MXNet: the net)."""
        return self.engine.model

    @property
    def module(self):
        """The bare model (torch: inside DDP), e.g. for evaluation on one worker."""
        return self.net

    @property
    def ctx(self):
        """This worker's devices: MXNet, every GPU of the node (``devices.contexts``), else ``[mx.cpu()]``;
        torch, ``[el.device]``."""
        return self.engine.devices()

    @property
    def device(self):
        """The first of ``ctx`` (torch: ``cuda:LOCAL_RANK`` when CUDA is there, else the CPU)."""
        return self.ctx[0]

    # ----------------------------------------------------------------- the loop
    def step_batch(self):
        return step_global_batch(self.batch_policy, self.global_batch, self.per_worker_batch, self.world)

    def batches(self):
        """Yield this worker's ``Batch`` for each global step until done or stopped."""
        if self.net is None:
            raise RuntimeError("call attach(net, trainer) (torch: wrap(model, optimizer)) before batches()")
        order_epoch, order = None, None
        while self.epoch < self.epochs and not self.finished:
            if order_epoch != self.epoch:
                order_epoch, order = self.epoch, epoch_order(self.num_samples, self.seed, self.epoch)
                if self._epoch_t0 is None or self.pos == 0:
                    self._epoch_t0 = time.time()
            size = self.step_batch()
            healing = self.inplace.healing_ranks(self.step) if self.inplace is not None else ()
            indices, weights, global_size = plan_step(order, self.pos, self.world, self.rank, size, healing)
            lr = self.lr.lr_at(self.step)
            self.engine.set_lr(lr)
            batch = Batch(epoch=self.epoch, step=self.step, pos=self.pos, indices=indices, weights=weights,
                          global_size=global_size, world=self.world, rank=self.rank, lr=lr,
                          last_in_epoch=self.pos + global_size >= self.num_samples, engine=self.engine,
                          grad_scale=self.engine.grad_scale(self.world, global_size))
            t0 = time.time()
            yield batch
            self._commit(batch, time.time() - t0)
            if self.stopped:
                return
        self.finished = True

    # ----------------------------------------------------------------- stop boundary (channel thread)
    def _on_stop(self, msg):
        """``stop``: report the steps completed; from now on complete at most one more before ``stop_at``."""
        if int(msg.get("generation", -1)) != self.generation:
            return
        with self._lock:
            if self._stop_gate is None:
                self._stop_gate = self.step + 1
            self._stop_reason = msg.get("reason")
            done = self._stop_gate - 1
        emit(MSG_STOP_ACK, generation=self.generation, host=self.host, rank=self.rank, step=done)

    def _on_stop_at(self, msg):
        """``stop_at``: the boundary every worker stops at (the first >= step, or epoch end >= step)."""
        if int(msg.get("generation", -1)) != self.generation:
            return
        with self._lock:
            self._stop_step, self._stop_mode = int(msg["step"]), msg.get("at", "step")
        self._stop_known.set()

    def _stop_here(self, epoch_done):
        """(training thread, at a boundary) True when this boundary is the agreed stop boundary."""
        with self._lock:
            gate = self._stop_gate
        if gate is None:
            return False
        if self.step >= gate:              # the launcher waits for every worker's answer, then tells us
            while not self._stop_known.wait(1.0):
                pass
        with self._lock:
            target, mode = self._stop_step, self._stop_mode
        if target is None or self.step < target:
            return False
        return mode != "epoch" or epoch_done

    # ----------------------------------------------------------------- a step's commit
    def _sync_stats(self, batch):
        """The metrics pushpull (epoch ends; every step in the audit mode); adds the sums to the epoch."""
        ctl = [0.0] * self._control_len
        for k in (0, 1):
            values = [v for j, v in self._local_nd if j == k]
            if values:                     # one sum on the engine, one read
                self._local_stats[k] += self.engine.sum_kept(values)
        self._local_nd = []
        ctl[_C_LOSS], ctl[_C_CORRECT], ctl[_C_COUNT] = self._local_stats
        self._local_stats = [0.0, 0.0, 0.0]
        if self.audit:
            for i, w in zip(batch.indices, batch.weights):
                if w > 0:
                    ctl[_C_HEAD + i] += 1.0
        agg = self.engine.allreduce(ctl)
        for k, c in ((0, _C_LOSS), (1, _C_CORRECT), (2, _C_COUNT)):
            self._epoch_stats[k] += float(agg[c])
        if self.audit:
            nz = [int(i) for i in (agg[_C_HEAD:] > 0).nonzero()[0]]
            rec = self._audit_record(batch, nz)
            dup = {str(i): int(agg[_C_HEAD + i]) for i in nz if agg[_C_HEAD + i] > 1.5}
            if dup:
                rec["dup"] = dup
            self.audit_log["steps"].append(rec)

    def _audit_record(self, batch, idx=None):
        """The audit's record of ``batch``'s step: the samples it used (``idx``: the metrics all-reduce's, else
        the data plan's -- every worker's shares of a step together are its chunk of the epoch's order)."""
        if idx is None:
            order = epoch_order(self.num_samples, self.seed, batch.epoch)
            idx = sorted(order[batch.pos:batch.pos + batch.global_size])
        return {"step": batch.step, "epoch": batch.epoch, "world": self.world, "gen": self.generation,
                "idx": [int(i) for i in idx]}

    def _commit(self, batch, step_time):
        if self.inplace is not None and self.inplace.peer_lost():
            self.inplace.recover()         # DDP's exchange lost a peer: re-formed in place, this step redone
            return
        healed = self.inplace.after_step() if self.inplace is not None else {}   # an add's overlapped transfer
        local = self._local_stats
        for k, value in ((0, batch.loss), (1, batch.correct)):
            if isinstance(value, float):
                local[k] += value
            else:
                self._local_nd.append((k, value))
        local[2] += batch.count
        epoch_done = self.pos + batch.global_size >= self.num_samples
        ended = []                         # the step's summary once ``_advance`` committed it
        if self.audit or epoch_done:
            try:
                self._sync_stats(batch)
            except Exception as exc:      # torch: the all-reduce raises when a peer is gone
                if self._peer_error is None or not self._peer_error(exc):
                    raise
                if self.inplace is None:
                    self._hold_for_launcher(exc)
                    raise
                # the step's gradient exchange completed (DDP's hook saw no loss), so its update is in the
                # model: the recovery keeps the step, committed here before the group re-forms (its record
                # from the data plan: the dead peer's share is known); the metrics' sums of it are lost
                record = self._audit_record(batch) if self.audit else None

                def keep():
                    if record is not None:
                        self.audit_log["steps"].append(record)
                    ended.append(self._advance(batch, step_time, epoch_done))

                if not self.inplace.recover(exc, keep):
                    return                 # re-formed in place from the boundary state: redo
        if not ended:
            ended.append(self._advance(batch, step_time, epoch_done))
        now = time.time()
        if ended[0] is not None:
            for fn in self._on_epoch_end:
                fn(ended[0])
        if not self.finished and self._stop_here(epoch_done):
            if self.inplace is not None and self.inplace.applies(self._stop_reason):
                self.inplace.pause()       # no checkpoint: regrouped in this process (or told to leave)
                return
            self._snapshot = self._pending = None    # the stop checkpoint is the boundary state
            self.stopped = True
            self.save_checkpoint(reason="stop")
            self._emit_hb("stopped", force=True)
            return
        taken = None
        if self.finished:
            self.save_checkpoint(reason="final")
        elif self.checkpoint_every and self.step % self.checkpoint_every == 0:
            self.save_checkpoint(reason="periodic")
            taken = self._ckpt_snapshot            # this boundary's copy: also the recovery snapshot
        if self.recovery and not self.finished and (
                taken is not None or now - self._snap_at >= self._snap_cost / SNAPSHOT_BUDGET):
            self._take_snapshot(now, taken)
        first = self.step == (self.resumed_from or 0) + 1
        if first and self._phases is not None:
            self._phases["first_step"] = now
        if first and self.checkpoint_every and self.rank == 0 and self._ckpt_writer.background \
                and hasattr(self.engine, "prepare_snapshots"):
            self.engine.prepare_snapshots()   # the first checkpoint's host memory, touched in the background
        self._emit_hb("running", force=first or bool(healed), **healed)

    def _advance(self, batch, step_time, epoch_done):
        """The state after ``batch``'s step: position, step count, time; at an epoch's end its summary (returned,
        for the callbacks; None mid-epoch), the audit's completed epoch and the next epoch."""
        now = time.time()
        with self._lock:                   # the channel thread reads the step count (stop_ack)
            self.pos += batch.global_size
            self.step += 1
        self.train_time += step_time
        self._recent.append((now, batch.global_size))
        if len(self._recent) > 50:
            del self._recent[0]
        if self._gen_first_step is None:
            self._gen_first_step = now
        summary = None
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
        if self.epoch >= self.epochs:
            self.finished = True
        return summary

    def _take_snapshot(self, now, taken=None):
        """Confirm the pending snapshot, issue this boundary's.

        Each costs the training thread a few engine calls (a copy per array), so one is issued
        only when the wall time since the last is at least ``1 / SNAPSHOT_BUDGET`` times that
        cost: every step for steps longer than that (a real model), every few steps of a toy
        one.  A lost worker then costs the steps since the newest usable snapshot: at most two
        such intervals (~0.1 s of training) plus the step in flight.
        """
        t0 = time.perf_counter()
        if self._pending is not None:
            # issued an interval ago and ordered before the weights' next update, which later forward
            # passes needed: this returns at once (unless that step's collective never finishes)
            self._snapshot = self._pending.wait()
        if taken is not None:              # a periodic checkpoint's snapshot of this boundary: no second copy
            self._pending, self._snap_at = taken, now
            return
        self._pending = self.engine.snapshot(self.meta(), self.audit_log if self.audit else None)
        cost = time.perf_counter() - t0
        self._snap_cost = cost if not self._snap_cost else 0.8 * self._snap_cost + 0.2 * cost
        self._snap_at = now

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
                "finished": self.finished, "time": time.time(), "engine": self.engine_name}
        if self.audit:
            meta["audit"] = self.audit_log
        meta.update(self._meta_extra)
        return meta

    def save_checkpoint(self, reason="periodic"):
        """Rank 0 checkpoints the current boundary (other ranks return at once); the checkpoint's path
        (a periodic one's: where it is being written), or None when one due is skipped.

        A periodic checkpoint is this boundary's snapshot (``engine.snapshot``, survivor recovery's),
        written, digested and fsynced by the background writer (``ckpt_writer``): the training thread
        waits for the copy only.  One due while the last is still being written is skipped, and said in
        events.jsonl (``checkpoint_skipped``).  The stop and final checkpoints are written here from the
        live state, after the write in flight: the launcher takes rank 0's next message ("stopped",
        "done") for their completion.  ``DT_CHECKPOINT_ASYNC=0``: every one written here.
        """
        if self.rank != 0:
            return None
        t0 = time.perf_counter()
        writer = self._ckpt_writer
        info = {"step": self.step, "epoch": self.epoch, "pos": self.pos, "reason": reason,
                "generation": self.generation, "t0": t0}
        self._ckpt_snapshot = None
        if reason != "periodic" or not writer.background or not self.engine.supports_recovery():
            in_flight = writer.writing      # (a snapshot holds the full state only where recovery works)
            if in_flight is not None:
                self.log_event("checkpoint_waited", step=self.step, reason=reason, writing=in_flight["step"])
            return writer.write_now(lambda: self.store.write(self.step, self.meta(), self.engine.save), info)
        in_flight = writer.writing
        if in_flight is not None:
            self.log_event("checkpoint_skipped", step=self.step, reason=reason, writing=in_flight["step"])
            return None
        snap = self.engine.snapshot(self.meta(), self.audit_log if self.audit else None)
        info["stall"] = time.perf_counter() - t0
        store = self.store
        writer.submit(lambda: write_snapshot(store, snap), info)
        self._ckpt_snapshot = snap
        return store.path_for(snap.step)

    def _checkpoint_failed(self, exc, info):
        """(writer thread) A checkpoint write failed: said in events.jsonl; raised on the training thread next."""
        self.log_event("checkpoint_failed", step=info.get("step"), reason=info.get("reason"),
                       error=f"{type(exc).__name__}: {str(exc)[:300]}")

    def _on_recover(self, msg):
        """(channel thread) A peer failed: write the last boundary's state as a recovery checkpoint."""
        gen = int(msg.get("generation", -1))
        snap, pending = self._snapshot, self._pending
        if pending is not None and pending.ready_within(CONFIRM_WAIT):
            snap = pending              # its step's collective finished: the newest boundary
        fields = {"generation": self.generation, "host": self.host, "rank": self.rank}
        if gen != self.generation or snap is None:
            why = "another generation" if gen != self.generation else "no completed step to give"
            emit("recovery", ok=False, reason=why, **fields)
            return
        t0 = time.time()
        try:
            path = snap.write(self.store, generation=self.generation, writer=self.host,
                              rank=self.rank, failed=msg.get("failed") or [])
        except Exception as exc:            # noqa: BLE001 - reported to the launcher, which falls back
            emit("recovery", ok=False, reason=f"{type(exc).__name__}: {exc}", **fields)
            return
        emit("recovery", ok=True, step=snap.step, epoch=snap.meta["epoch"], pos=snap.meta["pos"], path=path,
             seconds=round(time.time() - t0, 4), **fields)

    def _hold_for_launcher(self, exc):
        """A collective failed under us (torch: a peer is gone).  Stay alive -- the channel thread serves
        the launcher's ``recover`` from the last boundary's snapshot, then the launcher ends this
        generation -- for at most ``PEER_LOST_WAIT`` s; the caller then lets the error end the process."""
        if self._peer_lost:
            return
        self._peer_lost = True
        emit("peer_lost", generation=self.generation, host=self.host, rank=getattr(self, "rank", None),
             step=getattr(self, "step", None), error=f"{type(exc).__name__}: {str(exc)[:300]}")
        deadline = time.monotonic() + PEER_LOST_WAIT
        while time.monotonic() < deadline:
            time.sleep(0.1)

    # ----------------------------------------------------------------- reporting
    def _emit_hb(self, state, force=False, **fields):
        now = time.time()
        if not force and now - self._last_hb < 0.5:
            return
        self._last_hb = now
        extra = {}
        if force and self._phases:         # the start's phases, s after the assignment (first forced hbs)
            t0 = self._phases["assigned"]
            extra["phases"] = {k: round(v - t0, 3) for k, v in self._phases.items() if k != "assigned"}
            if "first_step" in self._phases:
                self._phases = None
        emit("hb", state=state, generation=self.generation, host=self.host, rank=self.rank,
             world=self.world, epoch=self.epoch, pos=self.pos, step=self.step,
             samples_per_s=round(self.samples_per_s(), 2), time=now, **extra, **fields)

    def log_event(self, event, **fields):
        """Rank 0 appends a record to events.jsonl, off the training thread (``finish`` waits for it)."""
        if self.rank != 0:
            return
        if self._events is None:
            self._events = BackgroundAppender(self.files.events)
        self._events.put(dict(fields, event=event, time=time.time(), generation=self.generation, source="train"))

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
        """Exit status for the script: 0 = training complete, EXIT_STOPPED = stopped on request.

        Waits for the checkpoint being written (raises ``CheckpointWriteError`` if it failed)."""
        try:
            self._ckpt_writer.wait()      # a periodic write in flight: committed before the process ends
        finally:
            if self._events is not None:
                self._events.flush(timeout=FLUSH_TIMEOUT)     # bounded: a stuck volume must not hang the exit
        if self.stopped:
            return EXIT_STOPPED
        if self.finished:
            emit("done", step=self.step, epoch=self.epoch, generation=self.generation)
        return 0


def _exit_at_once(elastic):
    """atexit (torch, under the launcher or in a process group of its own): once training finished or stopped at
    its boundary, end the process with ``finish()``'s status at once.  torch's own teardown (its atexit handlers and the interpreter's
    finalisation of its modules and process group) takes seconds on a busy node -- a silent worker the
    launcher would take for lost -- and now and then aborts ("terminate called without an active
    exception").  Everything of the job is written by then (checkpoint, events, result); stdio and
    logging are flushed here.  An uncaught error, or a script that ended otherwise, exits the normal way.
    """
    if getattr(sys, "last_value", None) is not None or not (elastic.finished or elastic.stopped):
        return
    code = EXIT_STOPPED if elastic.stopped else 0
    try:
        # a periodic write still in flight ends before the process does
        elastic._ckpt_writer.wait()        # pylint: disable=protected-access
    except CheckpointWriteError as exc:
        print(f"dynatrain_runtime: {exc}", file=sys.stderr)
        code = 1
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(code)


def _hold_on_peer_errors(elastic):
    """``sys.excepthook``: an uncaught error that says a peer is gone (raised in the script, e.g. by DDP's
    backward hooks) first waits for the launcher (``Elastic._hold_for_launcher``); others exit at once."""
    ref = weakref.ref(elastic)
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        el = ref()
        if el is not None and isinstance(exc, Exception) and el._peer_error(exc):   # pylint: disable=protected-access
            el._hold_for_launcher(exc)    # pylint: disable=protected-access
        previous(exc_type, exc, tb)

    sys.excepthook = hook


def _checkpoint_written(path, seconds, info):
    """(the writing thread) Tell the launcher a checkpoint is committed: its path, the write's seconds and
    the training thread's stall (the snapshot, or the whole write where it was written there)."""
    stall = info.get("stall", time.perf_counter() - info["t0"])
    emit("checkpoint", step=info["step"], epoch=info["epoch"], pos=info["pos"], path=path, reason=info["reason"],
         seconds=round(seconds, 4), stall=round(stall, 4), generation=info["generation"])


def _weakly(method):
    """``method`` as a callback that does not keep its object alive (a no-op once it is gone)."""
    ref = weakref.WeakMethod(method)

    def call(*args):
        fn = ref()
        return fn(*args) if fn is not None else None
    return call


def _weak_handler(method):
    """A channel handler that does not keep ``method``'s object alive."""
    ref = weakref.WeakMethod(method)

    def handler(msg):
        fn = ref()
        if fn is not None:
            fn(msg)
        elif msg.get("kind") == CMD_RECOVER:      # the launcher waits for an answer; a stop needs none
            emit("recovery", ok=False, generation=msg.get("generation"), reason="training finished")
    return handler
