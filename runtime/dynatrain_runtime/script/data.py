"""The data plan: one sample order per epoch, split among whoever the workers are now.

Pure Python (no MXNet, no NumPy): the launcher, the helper API and the tests share it.
Each epoch has one deterministic order (``epoch_order``); a global step consumes the
next ``step_batch`` samples not yet consumed and splits them among the *current*
workers (``plan_step``), so across any number of resizes every sample is used exactly
once per epoch.
"""

from __future__ import annotations

import random

BATCH_POLICIES = ("fixed-global", "fixed-per-worker")


def epoch_order(num_samples, seed, epoch):
    """The one deterministic sample order of an epoch (seed + epoch)."""
    order = list(range(int(num_samples)))
    random.Random(f"dynatrain:{int(seed)}:{int(epoch)}").shuffle(order)
    return order


def shard(n, world, rank):
    """Contiguous [start, end) of worker ``rank`` when ``n`` items are split among ``world``.

    Uneven splits differ by at most one item; the ``world`` slices tile [0, n).
    """
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank!r} outside a world of {world!r} workers")
    base, extra = divmod(int(n), int(world))
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def step_global_batch(policy, global_batch, per_worker_batch, world):
    """Samples one global step consumes (before the end-of-epoch remainder)."""
    if policy == "fixed-global":
        return int(global_batch)
    if policy == "fixed-per-worker":
        return int(per_worker_batch) * int(world)
    raise ValueError(f"unknown batch policy {policy!r} (one of {', '.join(BATCH_POLICIES)})")


def plan_step(order, pos, world, rank, step_batch, healing=()):
    """This worker's share of the next global step.

    Returns ``(indices, weights, global_size)``: the chunk is ``order[pos:pos+step_batch]``
    (shorter at the end of the epoch), split among ``world`` workers.  A worker whose share is
    empty (chunk shorter than the world) gets one placeholder sample with weight 0 so every
    worker still takes part in the synchronous step; it consumes nothing.  ``healing``: ranks
    still receiving the state (an in-place joiner's first step): they get the placeholder, the
    chunk is split among the others.
    """
    chunk = order[pos:pos + step_batch]
    if not chunk:
        raise ValueError(f"no samples left at position {pos} of {len(order)}")
    if rank in healing:
        return [chunk[0]], [0.0], len(chunk)
    others = [r for r in range(int(world)) if r not in healing]
    if rank not in others:
        raise ValueError(f"rank {rank!r} outside a world of {world!r} workers")
    start, end = shard(len(chunk), len(others), others.index(rank))
    indices = chunk[start:end]
    if indices:
        return list(indices), [1.0] * len(indices), len(chunk)
    return [chunk[0]], [0.0], len(chunk)


class LrSchedule:
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
            raise ValueError(f"unknown batch policy {policy!r}")
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
