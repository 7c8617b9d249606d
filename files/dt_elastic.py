# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""dt_elastic: the helper API an elastic training script uses under dt_launcher.

MXNet Gluon is first-class.  A script does::

    import dt_elastic
    el = dt_elastic.Elastic(num_samples=len(X), global_batch=64, epochs=5, seed=0, lr=0.1)
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

Semantics (DESIGN.md section 4):

* each epoch has one deterministic order (``epoch_order(n, seed, epoch)``);
  a global step consumes the next ``global_batch`` not-yet-consumed samples of
  that order and splits them among the *current* workers (``shard``), so across
  any number of resizes every sample is used exactly once per epoch;
* every step each worker contributes a control flag (one pushpull of a small
  control vector); when the sum is > 0 every worker stops at that same step
  boundary and rank 0 writes an atomic checkpoint (``CheckpointStore``);
* ``--batch-policy fixed-global`` (per-worker batch = global / workers) or
  ``fixed-per-worker`` with linear LR scaling warmed up over K steps
  (``LrSchedule``; Goyal et al. 2017).

This module's top level imports only the standard library: the pure parts
(sharding, LR policy, checkpoint store, control files) are used by the launcher
and by unit tests that have no MXNet.  MXNet and NumPy are imported lazily.

Run as ``python dt_elastic.py serve`` it is a pre-warmed parameter-server /
scheduler process: it imports MXNet, reads its role assignment (one JSON line)
from stdin and then runs that ps-lite role.
"""

from __future__ import absolute_import, division, print_function

import errno
import fcntl
import json
import os
import random
import shutil
import socket
import sys
import tempfile
import threading
import time

EXIT_STOPPED = 75          # stopped at a boundary on request; checkpoint written
EXIT_RETIRED = 0           # a pre-warmed process that was never used
CONTROL_KEY = 999983       # int kvstore key of the per-step control vector (Trainer uses 0..n-1)
MSG_PREFIX = "@@DT "       # worker -> launcher messages on stdout
CKPT_PREFIX = "ckpt-"
BATCH_POLICIES = ("fixed-global", "fixed-per-worker")
RESIZE_AT = ("step", "epoch")

# control vector layout: [stop, loss_sum, correct, count] + audit counts (optional)
_C_STOP, _C_LOSS, _C_CORRECT, _C_COUNT, _C_HEAD = 0, 1, 2, 3, 4


# --------------------------------------------------------------------------- pure data plan
def epoch_order(num_samples, seed, epoch):
    """The one deterministic sample order of an epoch (seed + epoch)."""
    order = list(range(int(num_samples)))
    random.Random("dynatrain:%d:%d" % (int(seed), int(epoch))).shuffle(order)
    return order


def shard(n, world, rank):
    """Contiguous [start, end) of worker ``rank`` when ``n`` items are split among ``world``.

    Uneven splits differ by at most one item; the ``world`` slices tile [0, n).
    """
    if world < 1 or not 0 <= rank < world:
        raise ValueError("rank %r outside a world of %r workers" % (rank, world))
    base, extra = divmod(int(n), int(world))
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def step_global_batch(policy, global_batch, per_worker_batch, world):
    """Samples one global step consumes (before the end-of-epoch remainder)."""
    if policy == "fixed-global":
        return int(global_batch)
    if policy == "fixed-per-worker":
        return int(per_worker_batch) * int(world)
    raise ValueError("unknown batch policy %r (one of %s)" % (policy, ", ".join(BATCH_POLICIES)))


def plan_step(order, pos, world, rank, step_batch):
    """This worker's share of the next global step.

    Returns ``(indices, weights, global_size)``: the chunk is ``order[pos:pos+step_batch]``
    (shorter at the end of the epoch), split among ``world`` workers.  A worker whose share is
    empty (chunk shorter than the world) gets one placeholder sample with weight 0 so every
    worker still takes part in the synchronous step; it consumes nothing.
    """
    chunk = order[pos:pos + step_batch]
    if not chunk:
        raise ValueError("no samples left at position %d of %d" % (pos, len(order)))
    start, end = shard(len(chunk), world, rank)
    indices = chunk[start:end]
    if indices:
        return list(indices), [1.0] * len(indices), len(chunk)
    return [chunk[0]], [0.0], len(chunk)


class LrSchedule(object):
    """Learning rate under a batch policy, with linear warm-up after every world change.

    ``fixed-global``: the global batch never changes, so the LR is ``base_lr``.
    ``fixed-per-worker``: the global batch is ``per_worker_batch * world``; the target LR is
    scaled linearly, ``base_lr * global / ref_batch`` (``ref_batch`` = the batch ``base_lr`` is
    tuned for, i.e. ``--global-batch``), and reached by a linear ramp over ``warmup_steps``
    steps from the LR in force when the world changed (at the start: one worker's LR).
    The state is three numbers saved in every checkpoint.
    """

    def __init__(self, policy, base_lr, ref_batch, per_worker_batch=None, warmup_steps=0, state=None):
        if policy not in BATCH_POLICIES:
            raise ValueError("unknown batch policy %r" % (policy,))
        self.policy = policy
        self.base_lr = float(base_lr)
        self.ref_batch = int(ref_batch)
        self.per_worker_batch = int(per_worker_batch or ref_batch)
        self.warmup_steps = int(warmup_steps)
        self.state = dict(state) if state else None  # {"from": lr, "to": lr, "start": step}

    def target(self, world):
        if self.policy == "fixed-global":
            return self.base_lr
        return self.base_lr * self.per_worker_batch * int(world) / float(self.ref_batch)

    def lr_at(self, step):
        if self.state is None:
            return self.base_lr
        s = self.state
        if self.warmup_steps <= 0 or step >= s["start"] + self.warmup_steps:
            return s["to"]
        frac = max(0.0, float(step - s["start"])) / self.warmup_steps
        return s["from"] + (s["to"] - s["from"]) * frac

    def on_world(self, world, step):
        """Call when a process group (re)starts at ``step`` with ``world`` workers."""
        target = self.target(world)
        if self.state is None:
            start_lr = self.target(1) if self.policy == "fixed-per-worker" else target
            self.state = {"from": start_lr, "to": target, "start": int(step)}
        elif abs(self.state["to"] - target) > 1e-15:
            self.state = {"from": self.lr_at(step), "to": target, "start": int(step)}
        return self.lr_at(step)


# --------------------------------------------------------------------------- files
def fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path, text):
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.rename(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def append_jsonl(path, record):
    """Append one JSON line under an exclusive lock on ``<path>.lock`` (safe across NFS clients)."""
    line = json.dumps(record, sort_keys=True) + "\n"
    lock_fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        with open(path, "a") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
    finally:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
        finally:
            os.close(lock_fd)


def control_dir(efs_mount):
    return os.path.join(efs_mount, "control")


def stop_request_path(efs_mount):
    return os.path.join(control_dir(efs_mount), "stop.json")


def write_stop_request(efs_mount, generation, reason, at="step"):
    os.makedirs(control_dir(efs_mount), exist_ok=True)
    atomic_write_text(stop_request_path(efs_mount), json.dumps(
        {"generation": int(generation), "reason": reason, "at": at, "time": time.time()}))


def clear_stop_request(efs_mount):
    try:
        os.unlink(stop_request_path(efs_mount))
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise


def read_stop_request(efs_mount):
    try:
        with open(stop_request_path(efs_mount)) as handle:
            return json.loads(handle.read() or "null")
    except (OSError, ValueError):
        return None


class CheckpointStore(object):
    """Checkpoints under ``directory`` as ``ckpt-<step>/`` directories.

    A checkpoint is written into a hidden temp directory, every file fsync'd, ``meta.json``
    last, then renamed into place in one ``rename``; old ones are renamed to a hidden trash
    name before being deleted.  A reader listing ``ckpt-*`` therefore only ever sees complete
    checkpoints.  The last ``keep`` are kept.
    """

    def __init__(self, directory, keep=2):
        self.directory = directory
        self.keep = max(1, int(keep))

    def path_for(self, step):
        return os.path.join(self.directory, "%s%010d" % (CKPT_PREFIX, int(step)))

    def steps(self):
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        out = []
        for name in names:
            if name.startswith(CKPT_PREFIX):
                try:
                    out.append(int(name[len(CKPT_PREFIX):]))
                except ValueError:
                    continue
        return sorted(out)

    def latest(self):
        """``(path, meta)`` of the newest checkpoint, or ``None``."""
        for _attempt in range(5):
            steps = self.steps()
            if not steps:
                return None
            path = self.path_for(steps[-1])
            try:
                with open(os.path.join(path, "meta.json")) as handle:
                    return path, json.load(handle)
            except (OSError, ValueError):
                time.sleep(0.05)   # pruned between listdir and open: list again
        return None

    def write(self, step, meta, write_files=None):
        """Write checkpoint ``step``: ``write_files(tmpdir)`` adds the payload, then meta."""
        os.makedirs(self.directory, exist_ok=True)
        final = self.path_for(step)
        if os.path.isdir(final):
            return final       # same step = same committed state (e.g. resumed and stopped again)
        tmp = tempfile.mkdtemp(prefix=".tmp-%s%010d-" % (CKPT_PREFIX, int(step)), dir=self.directory)
        try:
            if write_files is not None:
                write_files(tmp)
            with open(os.path.join(tmp, "meta.json"), "w") as handle:
                json.dump(meta, handle, sort_keys=True)
            for name in os.listdir(tmp):
                with open(os.path.join(tmp, name), "rb") as handle:
                    os.fsync(handle.fileno())
            fsync_dir(tmp)
            os.chmod(tmp, 0o755)
            os.rename(tmp, final)
            fsync_dir(self.directory)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.prune()
        return final

    def prune(self):
        steps = self.steps()
        for old in steps[:-self.keep]:
            path = self.path_for(old)
            trash = os.path.join(self.directory, ".trash-%s-%d" % (os.path.basename(path), os.getpid()))
            try:
                os.rename(path, trash)
            except OSError:
                continue
            shutil.rmtree(trash, ignore_errors=True)
        for name in os.listdir(self.directory):   # leftovers of a writer that died
            if name.startswith(".trash-"):
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)


def audit_check(audit, num_samples):
    """Verify a committed audit: every finished epoch used each sample exactly once.

    Returns a list of problems (empty = proven).  ``audit`` is the ``audit`` dict of a
    checkpoint's meta (``steps``: one record per committed global step).
    """
    problems = []
    by_epoch = {}
    for rec in audit.get("steps", []):
        by_epoch.setdefault(rec["epoch"], []).append(rec)
    for epoch, recs in sorted(by_epoch.items()):
        seen = {}
        for rec in recs:
            for i in rec["idx"]:
                seen[i] = seen.get(i, 0) + 1
            for i, count in rec.get("dup", {}).items():
                seen[int(i)] = seen.get(int(i), 0) + count - 1
        repeated = sorted(i for i, c in seen.items() if c > 1)
        complete = epoch in audit.get("completed_epochs", [])
        missing = sorted(set(range(num_samples)) - set(seen)) if complete else []
        if repeated:
            problems.append("epoch %d: samples used more than once: %s" % (epoch, repeated[:20]))
        if missing:
            problems.append("epoch %d: samples never used: %s" % (epoch, missing[:20]))
    return problems


# --------------------------------------------------------------------------- runtime
_EMIT_LOCK = threading.Lock()


def _emit(kind, **fields):
    """One machine-readable line for the launcher (it reads our stdout)."""
    fields["kind"] = kind
    line = (MSG_PREFIX + json.dumps(fields, sort_keys=True) + "\n").encode()
    with _EMIT_LOCK:   # raw write: safe from the alive thread, even at interpreter exit
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        os.write(1, line)


class _StdinChannel(object):
    """Launcher -> process channel: first line = assignment, later lines = commands.

    Reads fd 0 with ``os.read`` (not ``sys.stdin``): a daemon thread blocked in a buffered
    read aborts the interpreter at exit on Python 3.11 ("_enter_buffered_busy").
    """

    def __init__(self):
        self.stop = None          # the launcher's stop request {"generation": g, "at": "step"|"epoch"}
        self._thread = None
        self._buf = b""

    def _readline(self):
        while b"\n" not in self._buf:
            try:
                chunk = os.read(0, 4096)
            except OSError:
                chunk = b""
            if not chunk:
                rest, self._buf = self._buf, b""
                return rest.decode("utf-8", "replace")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode("utf-8", "replace") + "\n"

    def read_assignment(self):
        line = self._readline()
        if not line.strip():
            sys.exit(EXIT_RETIRED)    # launcher went away before using us
        msg = json.loads(line)
        if msg.get("kind") == "retire":
            sys.exit(EXIT_RETIRED)
        return msg

    def start(self, alive_interval=1.0):
        self._thread = threading.Thread(target=self._loop, name="dt-stdin", daemon=True)
        self._thread.start()
        if alive_interval:
            threading.Thread(target=self._alive, args=(alive_interval,), name="dt-alive", daemon=True).start()

    def _alive(self, interval):
        """Liveness independent of training progress (a stalled step still answers; a dead host does not)."""
        role = os.environ.get("DMLC_ROLE", "worker")
        host = os.environ.get("DT_WORKER_IP") or os.environ.get("DMLC_NODE_HOST")
        gen = int(os.environ.get("DT_GENERATION", "0"))
        while True:
            try:
                _emit("alive", role=role, host=host, generation=gen, time=time.time())
            except (OSError, ValueError):
                os._exit(70)
            time.sleep(interval)

    def _loop(self):
        while True:
            line = self._readline()
            if not line:
                # the launcher (or our ssh session) is gone: nobody can coordinate us any more
                os._exit(70)
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("kind") == "stop":
                self.stop = msg


def receive_assignment():
    """If started by dt_launcher (pre-warmed), block until it assigns this process a role.

    Applies the assignment's environment (DMLC_* etc.) to ``os.environ`` and returns the
    stdin channel (or ``None`` when not under the launcher).
    """
    if os.environ.get("DT_ASSIGN") != "stdin":
        return None
    return _take_assignment()


def _take_assignment():
    """Say "ready", read the launcher's assignment, apply its environment; returns the channel."""
    chan = _StdinChannel()
    _emit("ready", pid=os.getpid())
    msg = chan.read_assignment()
    for key, value in msg.get("env", {}).items():
        os.environ[str(key)] = str(value)
    chan.start()
    return chan


class Batch(object):
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


class Elastic(object):
    """Rank, world size, data share, checkpoint/resume and stop agreement for one worker."""

    def __init__(self, num_samples, global_batch, epochs, seed=0, lr=0.1, batch_policy="fixed-global",
                 per_worker_batch=None, warmup_steps=0, checkpoint_every=0, audit_samples=False,
                 efs_mount=None, checkpoint_dir=None, keep_checkpoints=2, kvstore="dist_sync"):
        if batch_policy not in BATCH_POLICIES:
            raise ValueError("unknown batch policy %r" % (batch_policy,))
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
        self.store = CheckpointStore(checkpoint_dir or os.environ.get("DT_CHECKPOINT_DIR")
                                     or os.path.join(self.efs_mount, "checkpoints"), keep=keep_checkpoints)
        self.generation = int(os.environ.get("DT_GENERATION", "0"))
        self.host = os.environ.get("DT_WORKER_IP") or os.environ.get("DMLC_NODE_HOST") or socket.gethostname()
        self.events_path = os.environ.get("DT_EVENTS") or os.path.join(self.efs_mount, "events.jsonl")
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
                self._stop_file = read_stop_request(self.efs_mount)
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
            self.stopped = True
            self.save_checkpoint(reason="stop")
            self._emit_hb("stopped", force=True)
            return
        if self.finished:
            self.save_checkpoint(reason="final")
        elif self.checkpoint_every and self.step % self.checkpoint_every == 0:
            self.save_checkpoint(reason="periodic")
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
        _emit("checkpoint", step=self.step, epoch=self.epoch, pos=self.pos, path=path, reason=reason,
              seconds=round(time.time() - t0, 4), generation=self.generation)
        return path

    # ----------------------------------------------------------------- reporting
    def _emit_hb(self, state, force=False):
        now = time.time()
        if not force and now - self._last_hb < 0.5:
            return
        self._last_hb = now
        _emit("hb", state=state, generation=self.generation, host=self.host, rank=self.rank,
              world=self.world, epoch=self.epoch, pos=self.pos, step=self.step,
              samples_per_s=round(self.samples_per_s(), 2), time=now)

    def log_event(self, event, **fields):
        """Rank 0 appends a record to events.jsonl (and tells the launcher)."""
        if self.rank != 0:
            return
        rec = dict(fields, event=event, time=time.time(), generation=self.generation, source="train")
        try:
            append_jsonl(self.events_path, rec)
        except OSError as exc:
            print("dt_elastic: cannot append to %s: %s" % (self.events_path, exc), file=sys.stderr)

    def write_result(self, result, path=None):
        """Rank 0 writes the final result JSON atomically (default ``$EFS_MOUNT/results/final.json``)."""
        if self.rank != 0:
            return None
        path = path or os.path.join(self.efs_mount, "results", "final.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        res = dict(result, steps=self.step, epochs=self.epoch, wall_time_s=round(time.time() - self.job_start, 3),
                   train_time_s=round(self.train_time, 3), world_at_end=self.world, generation=self.generation)
        atomic_write_text(path, json.dumps(res, sort_keys=True, indent=1))
        return path

    def finish(self):
        """Exit status for the script: 0 = training complete, EXIT_STOPPED = stopped on request."""
        if self.stopped:
            return EXIT_STOPPED
        if self.finished:
            _emit("done", step=self.step, epoch=self.epoch, generation=self.generation)
        return 0


# --------------------------------------------------------------------------- serve
def serve_main():
    """Pre-warmed ps-lite server/scheduler: import MXNet now, run the role once assigned."""
    for key in ("DMLC_ROLE",):
        os.environ.pop(key, None)
    import mxnet  # noqa: F401  (the slow part, done before the assignment arrives)
    _take_assignment()
    _emit("serving", role=os.environ.get("DMLC_ROLE"))
    from mxnet.kvstore import kvstore_server
    kvstore_server._init_kvstore_server_module()   # runs the role's loop, then sys.exit()
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        sys.exit(serve_main())
    print("usage: dt_elastic.py serve   (pre-warmed ps-lite server/scheduler for dt_launcher)",
          file=sys.stderr)
    sys.exit(2)
