"""The PyTorch engine: ``torch.distributed`` with torchrun's environment, DistributedDataParallel.

Workers connect with ``init_process_group(init_method="env://")`` on the environment the
launcher gives every generation (torchrun's: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT`` -- a fresh port, so a fresh TCPStore on the master, rank 0),
``gloo`` on the CPU, ``nccl`` on a GPU (``cuda:LOCAL_RANK`` when CUDA is there and
``DEEPLEARNING_WORKER_GPU_COUNT`` allows it).  Under plain torchrun the same environment is
there; alone (none of it) the worker is a world of one without a process group.

* The model is wrapped in DistributedDataParallel when the world has more than one worker
  (its constructor broadcasts rank 0's parameters); DDP *averages* gradients over the world,
  so the loss a worker backpropagates is its weighted per-sample sum times
  ``world / global_size`` (``grad_scale``): the aggregated gradient is the mean over the global
  batch, whatever the shares (uneven, or a placeholder of weight 0), as MXNet's
  ``trainer.step(global_size)``.
* Checkpoints: ``model.pt`` and ``optimizer.pt``, ``torch.save`` of the ``state_dict``s, loaded
  with ``torch.load(..., weights_only=True)``: tensors and plain containers only, never an
  arbitrary pickle (``read_state``).
* The boundary snapshot (``TorchSnapshot``): CPU clones of both ``state_dict``s taken after the
  step (complete when taken: the step's collectives have returned; from a GPU through pinned
  memory), written in the checkpoint format when a survivor is asked (survivor recovery) and by
  the background writer for a periodic checkpoint (``script/ckpt_writer.py``).
* A collective with a dead peer *raises* here (gloo: "Connection reset by peer"; or hangs until
  the timeout for a host that vanished): ``is_peer_error`` tells such errors from the
  script's own, so ``Elastic`` keeps the survivor alive for the launcher's ``recover``.

torch is imported when the engine is created (``prewarm`` imports it, and what DDP's first
construction imports -- ``torch._dynamo``, 1-2 s -- in a pre-started process).
"""

from __future__ import annotations

import datetime
import os
import socket
import threading
import time
import weakref

from . import devices
from .denormals import flush_denormals
from .snapshot import Snapshot, boundary_meta

MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"
TIMEOUT_VAR = "DT_PG_TIMEOUT"           # s, the process group's timeout (connect and collectives)
DEFAULT_TIMEOUT = 120.0
# RuntimeError texts of a collective whose peer is gone (torch 2.x raises DistError subclasses for most)
PEER_ERROR_MARKS = ("gloo/transport", "Connection reset by peer", "Connection closed by peer",
                    "Connection refused", "Broken pipe", "NCCL communicator was aborted",
                    "ProcessGroupGloo", "ProcessGroupNCCL", "Timed out waiting", "DistNetworkError")
OWN_ERROR_MARKS = ("EADDRINUSE", "address already in use")


def prewarm():
    """Import torch, torch.distributed and what DistributedDataParallel imports on first use."""
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    from torch.nn.parallel import DistributedDataParallel  # noqa: F401
    try:
        import torch._dynamo  # noqa: F401  (DDP's constructor imports it)
    except Exception:  # noqa: BLE001 - an optional speed-up only  # pylint: disable=broad-except
        pass


def is_peer_error(exc):
    """True for an exception of a collective (or the rendezvous) whose peer is gone: torch's DistError
    family, or a RuntimeError from gloo/NCCL's transport; the script's own errors are not."""
    try:
        from torch.distributed import DistError
    except ImportError:
        DistError = ()                    # noqa: N806
    text = str(exc)
    if any(mark in text for mark in OWN_ERROR_MARKS):
        return False                      # our own rendezvous port is taken: fail fast, the next one is fresh
    if DistError and isinstance(exc, DistError):
        return True
    return isinstance(exc, RuntimeError) and any(mark in text for mark in PEER_ERROR_MARKS)


def under_torch_distributed(environ=None):
    """True when the environment describes a process group (our launcher's or torchrun's)."""
    environ = os.environ if environ is None else environ
    return all(environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"))


def wait_for_store(environ=None, timeout=DEFAULT_TIMEOUT, poll=0.01):
    """A rank other than 0: wait until rank 0's rendezvous store (``MASTER_ADDR:MASTER_PORT``) accepts
    connections, looking every ``poll`` s; True once it does, False after ``timeout`` s.

    torch's own store client retries a refused connection with a growing back-off: a rank that asks
    before rank 0 has bound the generation's fresh port starts up to a second late (measured here:
    a store up 50 ms after its client cost that client 0.58 s; after this wait, 0.05 s). The probe
    connects and closes; the store counts only clients that hand-shake."""
    environ = os.environ if environ is None else environ
    addr = (environ["MASTER_ADDR"], int(environ["MASTER_PORT"]))
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(addr, timeout=min(1.0, timeout)).close()
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False      # init_process_group then says what is wrong, within its own timeout
            time.sleep(poll)


def pick_device(torch, environ=None):
    """``cuda:<id>`` of this process's GPU (``LOCAL_RANK``-th of the node's usable ones), else the CPU."""
    environ = os.environ if environ is None else environ
    try:
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0   # CUDA_VISIBLE_DEVICES applied
    except Exception:  # noqa: BLE001 - no driver  # pylint: disable=broad-except
        available = 0
    ids = devices.plan_devices(available, devices.gpu_limit(environ))
    local_rank = int(environ.get("LOCAL_RANK") or 0)
    if 0 <= local_rank < len(ids):
        return torch.device("cuda", ids[local_rank])
    return torch.device("cpu")


def clone_to_cpu(state, reuse=None):
    """A deep copy of a ``state_dict`` with every tensor cloned to the CPU (plain values kept), complete on return.

    A GPU tensor goes to pinned (page-locked) host memory by an asynchronous copy on its device's current
    stream; one synchronisation per device at the end, instead of a blocking pageable copy per tensor.
    ``reuse``: an iterator of host tensors of the same layout (a freed snapshot's, ``HostBuffers``) copied
    into instead of fresh memory -- a fresh copy of a large state costs ~4x more, in first-touch page faults.
    """
    import torch
    gpus = set()
    out = _clone_to_cpu(torch, state, gpus, reuse)
    for device in gpus:
        torch.cuda.current_stream(device).synchronize()
    return out


def _clone_to_cpu(torch, state, gpus, reuse):
    if isinstance(state, torch.Tensor):
        tensor = state.detach()
        if tensor.is_cuda:
            gpus.add(tensor.device)
        into = next(reuse) if reuse is not None else None
        if into is None:
            into = torch.empty(tensor.size(), dtype=tensor.dtype, pin_memory=tensor.is_cuda)
        return into.copy_(tensor, non_blocking=tensor.is_cuda)
    if isinstance(state, dict):
        return type(state)((k, _clone_to_cpu(torch, v, gpus, reuse)) for k, v in state.items())
    if isinstance(state, (list, tuple)):
        return type(state)(_clone_to_cpu(torch, v, gpus, reuse) for v in state)
    return state


def _tensors(state, torch):
    """The tensors of a (nested) state, in ``clone_to_cpu``'s order."""
    if isinstance(state, torch.Tensor):
        yield state
    elif isinstance(state, dict):
        for value in state.values():
            yield from _tensors(value, torch)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from _tensors(value, torch)


class HostBuffers:
    """Host memory of freed snapshots, reused by the next (``keep`` sets at most, matched by layout).

    A snapshot's tensors come back here when the snapshot object is freed (``weakref.finalize``; whoever
    still uses a snapshot holds the object), so a buffer is never overwritten while a snapshot uses it.
    """

    def __init__(self, keep=1):
        self.keep = keep
        self._free = []                   # (layout, [tensor, ...])
        self._lock = threading.Lock()

    def take(self, layout):
        """A free set of tensors with ``layout`` (shape, dtype, from-GPU), or None."""
        with self._lock:
            for i, (have, tensors) in enumerate(self._free):
                if have == layout:
                    del self._free[i]
                    return tensors
        return None

    def give(self, layout, tensors):
        with self._lock:
            self._free.append((layout, tensors))
            del self._free[:-self.keep]

    @staticmethod
    def layout(states):
        """What a set of buffers for ``states`` must match: (shape, dtype, from-GPU) of each tensor, in order."""
        import torch
        return [(tuple(t.shape), t.dtype, t.is_cuda) for state in states for t in _tensors(state, torch)]

    def prepare(self, states):
        """Allocate and touch a set of buffers for ``states`` on a background thread, into the pool: the first
        snapshot then pays for copying only, not for the first touch of fresh memory."""
        layout = self.layout(states)

        def allocate():
            import torch
            self.give(layout, [torch.empty(shape, dtype=dtype, pin_memory=pinned).zero_()
                               for shape, dtype, pinned in layout])
        threading.Thread(target=allocate, name="dt-snapshot-buffers", daemon=True).start()

    def clone(self, states):
        """CPU copies of each of ``states`` (``clone_to_cpu``), into reused memory where a free set matches;
        ``(copies, release)``: ``release(snapshot)`` gives the memory back once ``snapshot`` is freed."""
        import torch
        layout = self.layout(states)
        reused = self.take(layout)
        it = iter(reused) if reused is not None else None
        gpus = set()
        copies = [_clone_to_cpu(torch, state, gpus, it) for state in states]
        for device in gpus:
            torch.cuda.current_stream(device).synchronize()
        held = [t for copy in copies for t in _tensors(copy, torch)]

        def release(snapshot):
            weakref.finalize(snapshot, self.give, layout, held)
        return copies, release


def save_state(tmp, model_state, optimizer_state):
    """The checkpoint payload: ``model.pt`` and ``optimizer.pt``."""
    import torch
    torch.save(model_state, os.path.join(tmp, MODEL_FILE))
    torch.save(optimizer_state, os.path.join(tmp, OPTIMIZER_FILE))


def read_state(path, map_location="cpu"):
    """A state file written by ``save_state``: tensors and plain containers only (``weights_only``).

    A file holding any other object (a pickled class, a ``__reduce__`` payload) is refused with
    ``pickle.UnpicklingError`` and nothing of it runs.
    """
    import torch
    return torch.load(path, map_location=map_location, weights_only=True)


class TorchSnapshot(Snapshot):
    """A step boundary's state: CPU clones of the model's and optimizer's ``state_dict`` (complete when taken:
    the step's collectives have returned)."""

    @classmethod
    def issue(cls, module, optimizer, meta, audit_log=None, buffers=None):   # pylint: disable=arguments-renamed
        """``buffers``: a ``HostBuffers`` whose memory the copies reuse (and get back when this is freed)."""
        meta, audit = boundary_meta(meta, audit_log)
        if buffers is None:
            return cls(meta["step"], meta, clone_to_cpu(module.state_dict()), clone_to_cpu(optimizer.state_dict()),
                       None, audit, complete=True)
        (params, states), release = buffers.clone([module.state_dict(), optimizer.state_dict()])
        snap = cls(meta["step"], meta, params, states, None, audit, complete=True)
        release(snap)
        return snap

    def payload(self, tmp):
        """``model.pt`` and ``optimizer.pt``: the checkpoint format (``TorchEngine.save``'s)."""
        save_state(tmp, self.params, self.states)


class TorchEngine:
    """One worker's torch side: the process group, its device, the model (DDP-wrapped) and optimizer."""

    name = "torch"

    def __init__(self, timeout=None):
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
        flush_denormals()        # before the process group starts gloo's threads (they inherit it) and any op
        self.device = pick_device(torch)
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        self.distributed = under_torch_distributed() and dist.is_available()
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if self.distributed and not dist.is_initialized():
            seconds = float(timeout or os.environ.get(TIMEOUT_VAR) or DEFAULT_TIMEOUT)
            if int(os.environ.get("RANK") or 0) != 0:
                wait_for_store(timeout=seconds)
            dist.init_process_group(self.backend, init_method="env://",
                                    timeout=datetime.timedelta(seconds=seconds))
        if self.distributed:
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
        else:
            self.rank, self.world = 0, 1
        self.module = self.optimizer = None
        self._model = None
        self._host = HostBuffers()        # the boundary snapshots' host memory, reused

    # ----------------------------------------------------------------- devices, model
    def devices(self):
        return [self.device]

    def bind(self, model, optimizer):
        """The model moves to this worker's device (in place: the optimizer keeps its parameters)."""
        self.module = model.to(self.device)
        self.optimizer = optimizer

    @property
    def model(self):
        """What the script trains with: DistributedDataParallel(module) for more than one worker."""
        return self._model if self._model is not None else self.module

    def load(self, path):
        model_file = os.path.join(path, MODEL_FILE)
        if not os.path.exists(model_file):
            raise FileNotFoundError(f"{path} has no {MODEL_FILE}: not a checkpoint of the torch engine")
        self.module.load_state_dict(read_state(model_file, self.device))
        optimizer_file = os.path.join(path, OPTIMIZER_FILE)
        if os.path.exists(optimizer_file):
            self.optimizer.load_state_dict(read_state(optimizer_file, self.device))

    def save(self, tmp):
        save_state(tmp, self.module.state_dict(), self.optimizer.state_dict())

    def after_load(self, control_len):
        """Wrap the model for data parallelism (DDP broadcasts rank 0's state: every worker starts equal)."""
        if self.distributed and self.world > 1:
            from torch.nn.parallel import DistributedDataParallel
            ids = [self.device.index] if self.device.type == "cuda" else None
            self._model = DistributedDataParallel(self.module, device_ids=ids)
        else:
            self._model = self.module

    @staticmethod
    def supports_recovery():
        return True

    def seed(self, value):
        self.torch.manual_seed(value)

    def set_lr(self, lr):
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # ----------------------------------------------------------------- the loss
    @staticmethod
    def grad_scale(world, global_size):
        """DDP averages the workers' gradients: ``world / global_size`` makes the result the global mean."""
        return float(world) / float(global_size)

    @staticmethod
    def weighted_loss(per_sample, weights, scale=1.0):
        if all(w == 1.0 for w in weights):    # the usual share, every sample once: no weight tensor to build
            return per_sample.sum() * scale
        return (per_sample * per_sample.new_tensor(weights)).sum() * scale

    # ----------------------------------------------------------------- metrics
    def keep(self, value):
        """A reported tensor stays on its device, out of the graph (read at the metrics all-reduce)."""
        if isinstance(value, self.torch.Tensor):
            return value.detach()
        return float(value)

    def sum_kept(self, values):
        torch = self.torch
        return float(torch.stack([v.reshape(-1).sum().to(torch.float64) for v in values]).sum())

    def allreduce(self, values):
        """The sum over the workers of ``values`` (a list of floats) as a NumPy array: one all_reduce."""
        t = self.torch.tensor(values, dtype=self.torch.float64, device=self.device)
        if self.distributed and self.world > 1:
            self.dist.all_reduce(t)
        return t.cpu().numpy()

    # ----------------------------------------------------------------- recovery
    def prepare_snapshots(self):
        """Get host memory for the boundary snapshots ready in the background (after a step: the optimizer's
        state exists), so that the first periodic checkpoint stalls the training thread no longer than the next."""
        self._host.prepare([self.module.state_dict(), self.optimizer.state_dict()])

    def snapshot(self, meta, audit_log=None):
        return TorchSnapshot.issue(self.module, self.optimizer, meta, audit_log, buffers=self._host)   # complete

    @staticmethod
    def is_peer_error(exc):
        return is_peer_error(exc)

    def close(self):
        """Leave the process group (best effort)."""
        try:
            if self.distributed and self.dist.is_initialized():
                self.dist.destroy_process_group()
        except Exception:  # noqa: BLE001  # pylint: disable=broad-except
            pass
