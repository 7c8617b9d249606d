"""Engines: what differs between the frameworks the runtime drives, behind one small interface.

``Elastic`` (the helper API) keeps one copy of everything else -- membership, the data plan,
checkpoints and their audit, the stop boundary, survivor recovery, drains and the launcher
protocol -- and asks its engine only for:

* connecting the generation's workers (``rank``, ``world``): MXNet's ``dist_sync`` kvstore
  (``mxnet``), ``torch.distributed`` with ``env://`` (``torch``);
* ``devices()``; ``bind(model, optimizer)``; ``load(path)`` / ``save(tmpdir)`` of the model and
  optimizer state; ``after_load()`` (every worker holds the same state, the group is ready:
  the Trainer's kvstore keys, DistributedDataParallel); ``seed``; ``set_lr``;
* ``allreduce(values)`` of the metrics vector and ``keep``/``sum_kept`` of reported values
  (summed on the device, read at the metrics all-reduce: no per-step sync);
* ``snapshot(meta, audit_log)`` -- the in-memory boundary state for survivor recovery, a
  ``snapshot.Snapshot`` (the engine-neutral part: meta, audit, waiting, ``write(store, **recovery)``);
* ``is_peer_error(exc)``: an exception that means a peer is gone (torch's collectives raise;
  MXNet's block), ``supports_recovery()``, ``grad_scale(world, global_size)`` and
  ``weighted_loss(per_sample, weights, scale)``.

The engine is the ``engine=`` argument of ``Elastic``, else ``$DT_ENGINE`` (the launcher's
``--engine`` sets it for every process), else ``mxnet``.  Importing this package needs only
the standard library; an engine imports its framework when it is created (``prewarm`` does
it earlier, in a pre-started process waiting for its assignment).
"""

from __future__ import annotations

import os

ENGINES = ("mxnet", "torch")
DEFAULT_ENGINE = "mxnet"
ENGINE_VAR = "DT_ENGINE"


def engine_name(explicit=None, environ=None):
    """The engine to use: ``explicit``, else ``$DT_ENGINE``, else mxnet; a ValueError for an unknown one."""
    environ = os.environ if environ is None else environ
    name = (explicit or environ.get(ENGINE_VAR) or DEFAULT_ENGINE).strip().lower()
    if name == "pytorch":
        name = "torch"
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r} (one of {', '.join(ENGINES)})")
    return name


def prewarm(name):
    """Import what ``name``'s first use would import (a pre-started process does it before its assignment)."""
    if name == "torch":
        from .torch import prewarm as torch_prewarm
        torch_prewarm()


def peer_error_check(name):
    """``fn(exc) -> bool``: the exception says a peer of the group is gone; None for an engine whose
    collectives block instead of raising (MXNet).  Usable before the engine is created."""
    if name == "torch":
        from .torch import is_peer_error
        return is_peer_error
    return None


def create_engine(name, kvstore="dist_sync", timeout=None):
    """The engine object of ``name``, connected to this generation's workers (if under a launcher)."""
    if name == "torch":
        from .torch import TorchEngine
        return TorchEngine(timeout=timeout)
    from .mxnet import MXNetEngine
    return MXNetEngine(kvstore=kvstore)
