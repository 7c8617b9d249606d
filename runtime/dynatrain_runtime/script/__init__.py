"""The script API: what a training script imports, and what runs inside its process.

* ``elastic`` -- ``Elastic`` and ``Batch``: rank, world size, this worker's share of every
  global step, checkpoint/resume, stop at a boundary, survivor recovery;
* ``data`` -- the data plan: the epoch order, each worker's share, the learning-rate policy;
* ``recovery`` -- when every worker takes its in-memory boundary snapshot and which one a
  survivor writes as a recovery checkpoint (the snapshots themselves are the engines').

A script imports them from the package's top level (``from dynatrain_runtime import
Elastic, CheckpointStore, audit_check, ...``).  Below this API, the engine seam
(``dynatrain_runtime.engines``) holds what differs per framework; the checkpoint store and
the launcher channel it uses are ``dynatrain_runtime.contract``'s; the devices a worker
trains on are ``engines.devices``.  Imports run one way: ``contract`` -> ``engines`` ->
``script`` -> ``examples`` (``tests/unit/runtime/test_import_layers.py``); the launcher
imports nothing here.
"""
