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
* The boundary snapshot for survivor recovery (``TorchSnapshot``): CPU clones of both
  ``state_dict``s taken after the step (complete when taken: the step's collectives have
  returned), written in the checkpoint format when a survivor is asked.
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
import time

from ..script import devices
from ..script.recovery import BoundarySnapshot, boundary_meta

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


def clone_to_cpu(state):
    """A deep copy of a ``state_dict`` with every tensor cloned to the CPU (plain values kept)."""
    import torch
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return type(state)((k, clone_to_cpu(v)) for k, v in state.items())
    if isinstance(state, (list, tuple)):
        return type(state)(clone_to_cpu(v) for v in state)
    return state


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


class TorchSnapshot(BoundarySnapshot):
    """A step boundary's state: CPU clones of the model's and optimizer's ``state_dict`` (complete when taken)."""

    @classmethod
    def take(cls, module, optimizer, meta, audit_log=None):   # pylint: disable=arguments-renamed
        meta, audit = boundary_meta(meta, audit_log)
        return cls(meta["step"], meta, clone_to_cpu(module.state_dict()), clone_to_cpu(optimizer.state_dict()),
                   None, audit, complete=True)

    issue = take

    def wait(self):
        return self

    def ready_within(self, timeout):
        return True

    def write(self, store, **recovery):   # pylint: disable=arguments-differ
        """Commit this snapshot as checkpoint ``step`` in the regular format; returns its path."""
        return store.write(self.step, self.checkpoint_meta(**recovery),
                           lambda tmp: save_state(tmp, self.params, self.states))


class TorchEngine:
    """One worker's torch side: the process group, its device, the model (DDP-wrapped) and optimizer."""

    name = "torch"

    def __init__(self, timeout=None):
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
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
    def snapshot(self, meta, audit_log=None):
        return TorchSnapshot.take(self.module, self.optimizer, meta, audit_log)

    @staticmethod
    def write_snapshot(snap, store, **recovery):
        return snap.write(store, **recovery)

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
