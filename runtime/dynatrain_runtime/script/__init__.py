"""The script API: what a training script imports, and what runs inside its process.

* ``elastic`` -- ``Elastic`` and ``Batch``: rank, world size, this worker's share of every
  global step, checkpoint/resume, stop at a boundary, survivor recovery;
* ``data`` -- the data plan: the epoch order, each worker's share, the learning-rate policy;
* ``recovery`` -- the in-memory boundary snapshot every worker keeps, written by a survivor
  as a recovery checkpoint;
* ``devices`` -- the devices a worker trains on (also the launcher's count of a node's GPUs).

A script imports them from the package's top level (``from dynatrain_runtime import
Elastic, CheckpointStore, audit_check, ...``).  Below this API, the engine seam
(``dynatrain_runtime.engines``) holds what differs per framework; the checkpoint store and
the launcher channel it uses are ``dynatrain_runtime.contract``'s.  Nothing here is
imported by the launcher but ``devices``.
"""
