"""dynatrain_runtime: the node side of dynatrain.elastic, one sub-package per user.

* ``Elastic`` (and the rest of ``__all__``) -- the helper API a training script uses (rank,
  world size, its share of every global step, checkpoint/resume, stop at a boundary); its
  modules are ``script`` (``elastic``, ``data``, ``recovery``, ``devices``).
* ``engines`` -- what differs per framework behind ``Elastic`` (``mxnet``, ``torch``), and the
  MXNet parameter-server process the launcher starts (``mxnet_serve``).
* ``launcher`` -- the elastic launcher on the master (``dt-launcher``).
* ``contract`` -- what both sides of each contract import: ``shared_volume`` (every path,
  format, reader and writer on the shared volume: the same code as the collection's
  ``module_utils/shared_volume.py``, copied in at build time), ``checkpoint`` (the checkpoints
  on it) and ``protocol`` (the launcher <-> process channel).
* ``daemons`` -- the node services beside the launcher: ``spot`` (``dt-spot-watch``) and
  ``s3sync`` (``dt-checkpoint-sync``, ``dt-checkpoint-restore``).
* ``examples`` -- the digits data set and training script (``dt-prepare-digits``,
  ``dt-train-digits``).

Importing the package needs only the standard library; MXNet is imported by
``Elastic()`` and the parameter-server processes.
"""

from __future__ import annotations

from ._version import __version__
from .contract.checkpoint import CheckpointStore, audit_check
from .contract.protocol import EXIT_STOPPED
from .script.data import BATCH_POLICIES, LrSchedule, epoch_order, plan_step, shard
from .script.elastic import Batch, Elastic

__all__ = ["BATCH_POLICIES", "EXIT_STOPPED", "Batch", "CheckpointStore", "Elastic", "LrSchedule",
           "__version__", "audit_check", "epoch_order", "plan_step", "shard"]
