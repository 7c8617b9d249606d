"""dynatrain_runtime: the node side of dynatrain.elastic.

* ``Elastic`` -- the helper API a training script uses (rank, world size, its share of
  every global step, checkpoint/resume, stop at a boundary); see ``elastic``.
* ``dynatrain_runtime.launcher`` -- the elastic launcher on the master (``dt-launcher``).
* ``shared_volume`` -- every path, format, reader and writer on the shared volume (the same
  code as the collection's ``module_utils/shared_volume.py``, copied in at build time).
* ``examples`` -- the digits data set and training script (``dt-prepare-digits``,
  ``dt-train-digits``).

Importing the package needs only the standard library; MXNet is imported by
``Elastic()`` and the parameter-server processes.
"""

from __future__ import annotations

from ._version import __version__
from .checkpoint import CheckpointStore, audit_check
from .data import BATCH_POLICIES, LrSchedule, epoch_order, plan_step, shard
from .elastic import Batch, Elastic
from .contract.protocol import EXIT_STOPPED

__all__ = ["BATCH_POLICIES", "EXIT_STOPPED", "Batch", "CheckpointStore", "Elastic", "LrSchedule",
           "__version__", "audit_check", "epoch_order", "plan_step", "shard"]
