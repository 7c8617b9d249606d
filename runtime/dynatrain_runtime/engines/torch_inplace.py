"""The torch engine's in-place membership change: re-form the process group in the same process, and move
the model and optimizer state from live peers to the members that lack it.

Built on ``torch.distributed``'s own primitives (the decision and its figures: ``docs/inplace.md``):

* ``rejoin`` -- the old DistributedDataParallel is dropped, the default process group destroyed, and the
  new one initialised in the same process from the generation's environment (a fresh ``MASTER_PORT``:
  a fresh TCPStore on rank 0, the master, which never leaves).  The model is wrapped again with
  ``init_sync=False``: nothing a member already holds is broadcast a second time.
* ``StableModel`` -- what ``Elastic.wrap`` returns in place mode: the script keeps one object across any
  number of changes; its ``forward`` is the current DDP's (the bare module in a world of one).
* ``guard_backward`` -- DDP's own exchange (C++, no comm hook: a Python hook cost a small model's step
  ~10 %), but a backward pass whose exchange lost a peer (``torch.is_peer_error``) sets ``lost``
  instead of raising inside the script's ``backward()``, and the step's later forwards run on the bare
  module; the step is then discarded and redone from the boundary state (torchft's stock DDP wrapper
  crashed every survivor there: ``shared/anchors/torchft.md``).
* ``settle`` -- once the group formed, its members agree (one ``all_gather``) who holds the newest
  state; the lowest such rank broadcasts the header (the checkpoint meta and the tensors' layout: JSON,
  never a pickle) and the holders *send the bytes in chunks, spread over every holder* (chunk ``i`` from
  holder ``i mod n``), pipelined (no round trip per chunk); each chunk carries its size and adler32, the
  receiver refuses a chunk that does not match and fetches it once more, then fails (the launcher falls
  back to the restart path).  A receiver's bytes then back its first snapshot (``keep_for_snapshots``).
  An add's chunks may travel behind the first step at the new size instead (``Healing``: a thread, a gloo
  group of their own; the optimizer's first step waits for them).
  Sharded models (HSDP: a joiner's local rank r receives shard r from the holders of shard r) would
  plug in at ``tensors_of`` / ``holders``: ``docs/inplace.md``.

Only ``torch`` is needed; the chunk arithmetic and the checksum are pure Python (unit-tested alone).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import signal
import threading
import time
import zlib

from .torch import DEFAULT_TIMEOUT, TIMEOUT_VAR, is_peer_error, wait_for_store

CHUNK_BYTES = int(os.environ.get("DT_CHUNK_BYTES", str(32 << 20)))   # one chunk of the state transfer
CORRUPT_VAR = "DT_TEST_CORRUPT_CHUNK"   # tests: this chunk index goes out damaged once ("i:2": twice, refused)
DIE_SENDING_VAR = "DT_TEST_DIE_SENDING"  # tests: "HOST:N" -- that host's worker is killed once it posted N chunks
ACK_OK, ACK_FAILED = 0, 2


class TransferError(RuntimeError):
    """A chunk failed its check twice, or the layout does not fit this model."""


# ----------------------------------------------------------------------------- pure parts
def chunk_plan(total, chunk_bytes, holders):
    """``[(index, start, end, sender)]``: the byte stream ``[0, total)`` in chunks, chunk i from holder i mod n."""
    if not holders:
        raise ValueError("no member holds the state")
    size = max(1, int(chunk_bytes))
    return [(i, start, min(start + size, total), holders[i % len(holders)])
            for i, start in enumerate(range(0, int(total), size))]


def checksum(view):
    """adler32 of a byte buffer (a NumPy view of a chunk): cheap (~3 GB/s here), catches a flipped byte."""
    return zlib.adler32(memoryview(view).cast("B"))


def agree(steps):
    """``(step, holders, receivers)`` from every rank's step (-1: holds nothing): the newest step, the ranks
    holding it (senders), and the ranks that need it."""
    best = max(steps)
    if best < 0:
        raise TransferError("no member of the group holds any state")
    holders = [r for r, s in enumerate(steps) if s == best]
    return best, holders, [r for r, s in enumerate(steps) if s != best]


# ----------------------------------------------------------------------------- the group
def _timeout():
    return datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_VAR) or DEFAULT_TIMEOUT))


def rejoin(engine, env, phases=None):
    """Leave the current process group and join generation ``env``'s in this process (model state kept).

    ``env``: torchrun's variables of this member (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT``, ...), applied to ``os.environ`` so anything reading them later sees the new group.
    ``phases``: a dict that gets the wall-clock time of each part (where a regroup's time goes).
    """
    phases = {} if phases is None else phases
    dist = engine.dist
    drop_ddp(engine)
    phases["ddp_dropped"] = time.time()
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a group broken by a dead peer: dropping it is all we want
            pass
    for key, value in env.items():
        os.environ[str(key)] = str(value)
    world = int(os.environ["WORLD_SIZE"])
    engine.distributed = True
    phases["group_destroyed"] = time.time()
    if int(os.environ["RANK"]) != 0:
        wait_for_store(timeout=_timeout().total_seconds())
    phases["store_up"] = time.time()
    dist.init_process_group(engine.backend, init_method="env://", timeout=_timeout())
    engine.rank, engine.world = dist.get_rank(), world
    return engine.rank, engine.world


def drop_ddp(engine):
    """Forget the DDP wrapper: its reducer's hooks on the parameters are removed now, and the last reference
    dropped (freed at once; no ``gc.collect()``, which costs 0.15-0.8 s in a process that imported torch)."""
    stable = getattr(engine, "_model", None)
    if isinstance(stable, StableModelMixin):
        ddp = stable._ddp                       # pylint: disable=protected-access
        stable.set_target(None)
        if ddp is not None and hasattr(ddp, "_remove_autograd_hooks"):
            ddp._remove_autograd_hooks()        # pylint: disable=protected-access


def wrap(engine, lost, init_sync):
    """Wrap ``engine.module`` for this group: DDP for world > 1 (``init_sync``: broadcast rank 0's state, only
    when members may differ), its lost peers turned into ``lost`` (``guard_backward``), behind one
    ``StableModel`` for the script."""
    stable = getattr(engine, "_model", None)
    if not isinstance(stable, StableModelMixin):
        stable = make_stable(engine.module)
        engine._model = stable            # what engine.model (and so el.wrap / el.model) hands out
    if engine.world > 1:
        from torch.nn.parallel import DistributedDataParallel
        ids = [engine.device.index] if engine.device.type == "cuda" else None
        stable.set_target(DistributedDataParallel(engine.module, device_ids=ids, init_sync=init_sync), lost)
    else:
        stable.set_target(None)
    return stable


class StableModelMixin:
    """Marker of the script's stable model (see ``make_stable``)."""


def make_stable(module):
    """An ``nn.Module`` around ``module`` whose forward is the current DDP's (or the module's)."""
    from torch import nn

    class StableModel(nn.Module, StableModelMixin):
        def __init__(self, inner):
            super().__init__()
            self.module = inner                     # as DDP's .module: parameters(), state_dict() prefixes
            object.__setattr__(self, "_ddp", None)  # not a submodule: it is rebuilt on every change
            object.__setattr__(self, "_lost", None)

        def set_target(self, ddp, lost=None):
            """The DDP to run (None: the bare module) and the flag its lost peers set (the backward guard
            armed with it while a DDP is current)."""
            lost = lost if ddp is not None else None
            object.__setattr__(self, "_ddp", ddp)
            object.__setattr__(self, "_lost", lost)
            guard_backward(lost)

        def forward(self, *args, **kwargs):         # pylint: disable=arguments-differ
            ddp, lost = self._ddp, self._lost
            if ddp is None or (lost is not None and lost.is_set()):
                # one process, or the group lost a peer: the rest of this step (discarded) runs locally
                return self.module(*args, **kwargs)
            try:
                return ddp(*args, **kwargs)
            except RuntimeError as exc:             # DDP's forward talks too (buffers, the buckets' order)
                if not _lost_to(lost, exc):
                    raise
                return self.module(*args, **kwargs)

    return StableModel(module)


class LostFlag:
    """Set when DDP's exchange failed (a peer is gone: ``guard_backward``); read at the step's commit.

    ``on_set()`` runs once, when it is first set: the backward pass failed and the optimizer has not stepped,
    so the model and optimizer still hold the last completed step's state -- the moment to copy it
    (``InPlaceWorker``), so a kill redoes only the step in flight."""

    def __init__(self, on_set=None):
        self.event = threading.Event()
        self.error = None
        self.on_set = on_set

    def set(self, exc):
        if not self.event.is_set():
            self.error = exc
            if self.on_set is not None:
                try:
                    self.on_set()
                except Exception:  # noqa: BLE001 - the periodic boundary snapshot is still there
                    pass
            self.event.set()

    def is_set(self):
        return self.event.is_set()

    def clear(self):
        self.error = None
        self.event.clear()


_ARMED = [None]          # the LostFlag of this process's current multi-member DDP (None: nothing to guard)


def _lost_to(lost, exc):
    """True, with ``lost`` set, when ``exc`` says a peer is gone and a flag is armed; else the caller re-raises."""
    if lost is None or not is_peer_error(exc):
        return False
    lost.set(exc)
    return True


def guard_backward(lost):
    """Arm (``lost``) or disarm (None) the backward guard: once armed, a backward pass -- ``loss.backward()``
    or ``torch.autograd.backward`` -- whose DDP exchange lost a peer sets ``lost`` and returns, where DDP
    would raise in the script; any other error still raises.

    DDP's exchange stays its own (C++: the reducer's allreduce and its average); only the error is caught,
    around the call, which costs nothing per step.  A comm hook catching it in the exchange's future cost
    a Python call and a callback per bucket: ~0.15 ms, 10 % of the digits MLP's step."""
    import torch
    _ARMED[0] = lost
    current = torch.autograd.backward
    if getattr(current, "dt_guarded", False):
        return

    def backward(*args, **kwargs):
        try:
            return current(*args, **kwargs)
        except RuntimeError as exc:
            if not _lost_to(_ARMED[0], exc):
                raise
            return None         # the step is discarded at its commit: its gradients do not matter

    backward.dt_guarded = True
    backward.__doc__ = current.__doc__
    torch.autograd.backward = backward      # Tensor.backward calls torch.autograd.backward by name


# ----------------------------------------------------------------------------- the state
def tensors_of(module, optimizer):
    """``(layout, tensors)``: the model's ``state_dict`` tensors and the optimizer state's tensors in a fixed
    order, and a JSON-able layout a receiver rebuilds both ``state_dict``s from (plain values inline)."""
    import torch
    tensors, model_layout, opt_layout = [], [], []
    for key, value in module.state_dict().items():
        model_layout.append([key, list(value.shape), str(value.dtype).replace("torch.", "")])
        tensors.append(value)
    opt = optimizer.state_dict()
    for idx, entry in opt["state"].items():
        for name, value in entry.items():
            if isinstance(value, torch.Tensor):
                opt_layout.append([int(idx), name, list(value.shape), str(value.dtype).replace("torch.", ""), None])
                tensors.append(value)
            else:
                opt_layout.append([int(idx), name, None, None, value])
    return {"model": model_layout, "optimizer": opt_layout, "param_groups": opt["param_groups"]}, tensors


def _dtype(name):
    """The torch dtype a peer's layout names (a name that is not a dtype is refused)."""
    import torch
    found = getattr(torch, str(name), None)
    if not isinstance(found, torch.dtype):
        raise TransferError(f"the layout names {name!r}, not a torch dtype")
    return found


def _nbytes(shape, dtype):
    import torch
    n = 1
    for d in shape:
        if int(d) < 0:
            raise TransferError(f"a negative dimension in the layout: {shape!r}")
        n *= int(d)
    return n * torch.empty((), dtype=_dtype(dtype)).element_size()


def layout_bytes(layout):
    return sum(_nbytes(s, d) for _k, s, d in layout["model"]) + \
        sum(_nbytes(s, d) for _i, _n, s, d, _v in layout["optimizer"] if s is not None)


class ByteStream:
    """A sender's view of its tensors as one byte stream: ``read(start, end)`` copies that range."""

    def __init__(self, tensors, copy=()):
        import torch
        self.parts, offset = [], 0
        for t in tensors:
            if t.data_ptr() in copy:         # (data_ptrs) tensors that change before the stream is read
                t = t.clone()
            flat = t.detach().to("cpu").reshape(-1).contiguous().view(torch.uint8)   # gloo: host memory
            self.parts.append((offset, flat))
            offset += flat.numel()
        self.total = offset

    def read(self, start, end):
        import torch
        pieces = [flat[max(start, off) - off:min(end, off + flat.numel()) - off]
                  for off, flat in self.parts if off < end and off + flat.numel() > start]
        return torch.cat(pieces) if len(pieces) != 1 else pieces[0]


def load_stream(module, optimizer, layout, flat, device):
    """Rebuild both ``state_dict``s from the received byte stream ``flat`` and load them."""
    import torch
    offset, model_state, opt_state = 0, {}, {}

    def take(shape, dtype):
        nonlocal offset
        n = _nbytes(shape, dtype)
        if offset + n > flat.numel():
            raise TransferError("the layout is larger than the bytes received")
        t = flat[offset:offset + n].view(_dtype(dtype)).reshape(shape)
        offset += n
        return t

    for key, shape, dtype in layout["model"]:
        model_state[key] = take(shape, dtype)
    for idx, name, shape, dtype, value in layout["optimizer"]:
        # a copy: the optimizer's state must not keep the whole received buffer alive
        opt_state.setdefault(int(idx), {})[name] = take(shape, dtype).to(device, copy=True) if shape is not None \
            else value
    module.load_state_dict(model_state)          # copies into the parameters
    optimizer.load_state_dict({"state": opt_state, "param_groups": layout["param_groups"]})


def keep_for_snapshots(engine, flat):
    """(a receiver, once ``load_stream`` copied out of it) Hand the received byte stream -- memory already
    touched -- to the engine's snapshot buffers, cut as the next boundary snapshot's copies: the joiner's first
    recovery snapshot then costs a copy, not the first touch of fresh memory (3.5-4 s at 780 MB on the 2-core
    machine, a stall the whole group waited for at the next step).  Nothing is handed over where the cut does
    not fit exactly (a GPU node's snapshots want pinned memory; a state of another shape)."""
    host = getattr(engine, "_host", None)
    if host is None or engine.device.type != "cpu" or not hasattr(host, "give"):
        return False
    states = [engine.module.state_dict(), engine.optimizer.state_dict()]
    layout = host.layout(states)
    views, offset = [], 0
    try:
        for shape, dtype, on_gpu in layout:
            size = math.prod(shape) * dtype.itemsize
            if on_gpu or offset + size > flat.numel():
                return False
            views.append(flat[offset:offset + size].view(dtype).reshape(shape))
            offset += size
    except RuntimeError:             # a view the byte offset cannot give (alignment)
        return False
    if offset != flat.numel():
        return False
    host.give(layout, views)
    return True


# ----------------------------------------------------------------------------- the transfer
def _bcast_bytes(dist, data, src, group):
    import torch
    size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64)
    dist.broadcast(size, src, group=group)
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data is not None \
        else torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(buf, src, group=group)
    return bytes(buf.numpy().tobytes())


def settle(engine, step, header_fn, transfer_group=None, overlap=False):
    """Every member of the new group, right after it formed: make everyone hold the newest state.

    ``step``: the boundary this member holds (-1: nothing, a joiner).  ``header_fn()``: the checkpoint
    meta of this member's boundary (called on the source only).  ``overlap``: this member may let the
    tensors travel behind the first step (``Healing``); it does only where every member may and every
    receiver is a joiner (a survivor with an older snapshot must load it before it trains).
    Returns ``(meta or None, stats, healing or None)``: the meta a receiver must apply (None for a
    holder), what moved (bytes, seconds, chunks, refetched; ``overlap``), and the transfer in flight.
    """
    import torch
    dist, rank = engine.dist, engine.rank
    # the bytes go through host memory: on a GPU node (NCCL) a gloo side group carries them
    group = transfer_group or (dist.new_group(backend="gloo") if engine.backend != "gloo" else None)
    mine = torch.tensor([int(step), int(bool(overlap))], dtype=torch.int64)
    gathered = [torch.zeros(2, dtype=torch.int64) for _rank in range(engine.world)]
    dist.all_gather(gathered, mine, group=group)
    best, holders, receivers = agree([int(t[0].item()) for t in gathered])
    # every member computes the same answer from the same gathered values
    background = bool(receivers) and all(int(t[1].item()) for t in gathered) and \
        all(int(gathered[r][0].item()) < 0 for r in receivers)
    stats = {"step": best, "holders": holders, "receivers": receivers, "bytes": 0, "seconds": 0.0,
             "chunks": 0, "refetched": 0, "overlap": background}
    if not receivers:
        return None, stats, None
    t0 = time.monotonic()
    source = holders[0]
    if rank == source:
        layout, _tensors = tensors_of(engine.module, engine.optimizer)
        header = json.dumps({"meta": header_fn(), "layout": layout}).encode()
    else:
        header = None
    header = json.loads(_bcast_bytes(dist, header, source, group).decode())
    layout, total = header["layout"], layout_bytes(header["layout"])
    plan = chunk_plan(total, CHUNK_BYTES, holders)
    stats.update(bytes=total * len(receivers), chunks=len(plan))
    meta = header["meta"] if rank in receivers else None
    if background:
        # a side group of its own: the chunks must not interleave with the main thread's DDP exchange;
        # the caller starts it once the optimizer waits for it
        side = group if group is not None else dist.new_group(backend="gloo")
        return meta, stats, Healing(engine, layout, total, plan, holders, receivers, side, stats, t0)
    flat = _move(engine, total, plan, holders, receivers, group)
    if flat is not None:
        load_stream(engine.module, engine.optimizer, layout, flat[0], engine.device)
        keep_for_snapshots(engine, flat[0])
    stats["refetched"] = _refetched_in_all(dist, flat[1] if flat is not None else 0, group)
    stats["seconds"] = round(time.monotonic() - t0, 4)
    return meta, stats, None


def _move(engine, total, plan, holders, receivers, group, stream=None):
    """The chunked transfer of ``plan``: a holder sends its chunks (of ``stream``, default its live state) to
    every receiver (None); a receiver returns ``(the byte stream, chunks refetched)``."""
    import torch
    dist, rank = engine.dist, engine.rank
    if rank in holders:
        if stream is None:
            stream = ByteStream(tensors_of(engine.module, engine.optimizer)[1])
        if stream.total != total:
            raise TransferError(f"holder {rank}: {stream.total} bytes of state, the source's layout says {total}")
        mine = [c for c in plan if c[3] == rank]
        for receiver in receivers if mine else ():        # a holder with no chunk of the plan sends nothing
            _send_chunks(dist, stream, mine, receiver, group)
        return None
    flat = torch.empty(total, dtype=torch.uint8)
    return flat, _receive_chunks(dist, flat, plan, group)


def _refetched_in_all(dist, mine, group):
    """The transfer's end (a barrier): the chunks refetched by every receiver, known to every member."""
    import torch
    count = torch.tensor([int(mine)], dtype=torch.int64)
    dist.all_reduce(count, group=group)
    return int(count.item())


class Healing:
    """An add's state transfer behind the first step at the new size (``settle(overlap=True)``).

    A thread moves the chunks on a gloo group of their own while the main thread trains the first step; in it
    the receivers take a placeholder (weight 0: their gradient is zero, DDP's average stays the global mean).
    The optimizer's step waits for the transfer (``finish``, from the worker's ``register_step_pre_hook``): a
    holder sends its live boundary state (no copy: the step would change it; buffers, which a forward pass
    may change, are copied first), a receiver loads the received state in place, then steps with the
    group's averaged gradients -- after the step every member holds the same state.
    """

    def __init__(self, engine, layout, total, plan, holders, receivers, group, stats, t0):
        self.engine, self.layout, self.total, self.plan = engine, layout, total, plan
        self.holders, self.receivers, self.group = holders, list(receivers), group
        self.stats, self.t0 = stats, t0
        self.receiving = engine.rank in receivers
        self.error = None
        self._received = None
        self._done = False
        self._stream = None
        if engine.rank in holders:
            buffers = {b.data_ptr() for b in engine.module.buffers()}
            self._stream = ByteStream(tensors_of(engine.module, engine.optimizer)[1], copy=buffers)
        self._thread = threading.Thread(target=self._run, name="dt-heal", daemon=True)

    @property
    def done(self):
        return self._done

    def start(self):
        self._thread.start()

    def _run(self):
        try:
            self._received = _move(self.engine, self.total, self.plan, self.holders, self.receivers, self.group,
                                   self._stream)
            self._stream = None
            mine = self._received[1] if self._received is not None else 0
            self.stats["refetched"] = _refetched_in_all(self.engine.dist, mine, self.group)
        except Exception as exc:  # noqa: BLE001 - raised on the training thread by finish()
            self.error = exc
        self.stats["seconds"] = round(time.monotonic() - self.t0, 4)

    def finish(self):
        """(training thread: the optimizer's first step, or the step's commit) Wait for the transfer; a receiver
        loads the state in place, keeping the learning rate set for this step.  Raises what the transfer raised."""
        if self._done:
            return
        self._done = True
        waited = time.monotonic()
        self._thread.join()
        self.stats["waited_s"] = round(time.monotonic() - waited, 4)
        if self.error is not None:
            raise TransferError(f"the state transfer behind the first step failed: {self.error}") from self.error
        if self.receiving:
            flat, self._received = self._received[0], None
            opt = self.engine.optimizer
            lrs = [group.get("lr") for group in opt.param_groups]
            load_stream(self.engine.module, opt, self.layout, flat, self.engine.device)
            keep_for_snapshots(self.engine, flat)
            for group, lr in zip(opt.param_groups, lrs):
                group["lr"] = lr

    def abandon(self, timeout):
        """A peer is gone during the first step: stop waiting on the transfer (its group dies with the regroup)."""
        self._done = True
        self._thread.join(timeout)


_CORRUPTED = []          # the test hook's damaged sends in this process


def _maybe_corrupt(index, data):
    """The test hook: ``DT_TEST_CORRUPT_CHUNK=i`` damages chunk i's first send (``i:2``: its first two)."""
    want = os.environ.get(CORRUPT_VAR)
    if want is None or data.numel() == 0:
        return data
    chunk, _sep, times = want.partition(":")
    if int(chunk) != index or len(_CORRUPTED) >= int(times or 1):
        return data
    _CORRUPTED.append(index)
    bad = data.clone()
    bad[0] ^= 0xFF
    return bad


def _maybe_die_sending(posted):
    """The test hook: ``DT_TEST_DIE_SENDING=HOST:N`` kills HOST's worker once it has posted N chunks (a holder
    lost in the middle of a transfer)."""
    if os.environ.get(DIE_SENDING_VAR) == f"{os.environ.get('DT_WORKER_IP')}:{posted}":
        os.kill(os.getpid(), signal.SIGKILL)


def _send_chunks(dist, stream, mine, receiver, group):
    """A holder's chunks to ``receiver``, pipelined: every chunk and its ``[size, adler32]`` go out at once (the
    next checksum computed while the earlier chunks travel); then the receiver's list of refused chunks, each
    sent once more, and its verdict.  No round trip per chunk (a stop-and-wait per 32 MiB halved the rate)."""
    import torch
    works, sent = [], {}
    for index, start, end, _sender in mine:
        data = stream.read(start, end)
        check = torch.tensor([end - start, checksum(data.numpy())], dtype=torch.int64)
        sent[index] = (data, check)
        works.append(dist.isend(_maybe_corrupt(index, data), receiver, group=group))
        works.append(dist.isend(check, receiver, group=group))
        _maybe_die_sending(len(sent))
    for work in works:
        work.wait()
    count = torch.zeros(1, dtype=torch.int64)
    dist.recv(count, receiver, group=group)
    if not 0 <= int(count.item()) <= len(sent):        # a peer's number: never an allocation it sizes
        raise TransferError(f"rank {receiver} asked again for {int(count.item())} chunks of this holder's {len(sent)}")
    if int(count.item()):
        again = torch.zeros(int(count.item()), dtype=torch.int64)
        dist.recv(again, receiver, group=group)
        for index in again.tolist():
            if index not in sent:
                raise TransferError(f"rank {receiver} asked again for chunk {index}, which is not this holder's")
            data, check = sent[index]
            dist.send(_maybe_corrupt(index, data), receiver, group=group)
            dist.send(check, receiver, group=group)
    verdict = torch.zeros(1, dtype=torch.int64)
    dist.recv(verdict, receiver, group=group)
    if int(verdict.item()) != ACK_OK:
        raise TransferError(f"a chunk was refused twice by rank {receiver}")


def _receive_chunks(dist, flat, plan, group):
    """Fetch every chunk of ``plan`` into ``flat``: every receive posted at once (each holder sends its chunks
    in plan order), each chunk checked as it lands; a chunk whose size or adler32 does not match is asked for
    again once (one list per holder, after its chunks).  Returns how many were refetched."""
    import torch
    pending, senders = [], sorted({chunk[3] for chunk in plan})
    for index, start, end, sender in plan:
        check = torch.zeros(2, dtype=torch.int64)
        works = [dist.irecv(flat[start:end], sender, group=group), dist.irecv(check, sender, group=group)]
        pending.append((index, start, end, sender, check, works))
    bad = {sender: [] for sender in senders}
    for index, start, end, sender, check, works in pending:
        for work in works:
            work.wait()
        if not _verify(flat[start:end], check):
            bad[sender].append((index, start, end))
    for sender in senders:
        dist.send(torch.tensor([len(bad[sender])], dtype=torch.int64), sender, group=group)
        if bad[sender]:
            dist.send(torch.tensor([c[0] for c in bad[sender]], dtype=torch.int64), sender, group=group)
    failed = None
    for sender in senders:
        for index, start, end in bad[sender]:
            check = torch.zeros(2, dtype=torch.int64)
            dist.recv(flat[start:end], sender, group=group)
            dist.recv(check, sender, group=group)
            if failed is None and not _verify(flat[start:end], check):
                failed = (index, sender)
    for sender in senders:          # every holder hears the verdict (none is left waiting)
        dist.send(torch.tensor([ACK_OK if failed is None else ACK_FAILED], dtype=torch.int64), sender, group=group)
    if failed is not None:
        raise TransferError(f"chunk {failed[0]} from rank {failed[1]} failed its check twice")
    return sum(len(v) for v in bad.values())


def _verify(data, check):
    size, want = int(check[0].item()), int(check[1].item())
    return data.numel() == size and checksum(data.numpy()) == want
