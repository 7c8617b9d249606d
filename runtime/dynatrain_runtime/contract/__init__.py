"""The contracts between the runtime's parts: what both sides of each one import.

* ``shared_volume`` -- every path, format, reader and writer on the shared volume
  (``host_worker`` and its log, ``events.jsonl``, ``status.json``, the ``control/``
  requests, the checkpoint layout): the launcher, the script API, the node daemons and the
  examples here, the collection's modules on the controller.  Not in the source tree:
  ``runtime/build.py`` copies the collection's ``plugins/module_utils/shared_volume.py`` in,
  byte-identical.
* ``checkpoint`` -- the checkpoints on the volume (``CheckpointStore``: atomic commit, digests,
  the newest that verifies) and the exact-once audit: written by the script API (rank 0, a
  survivor), read by the launcher (the step to resume from) and ``dt-checkpoint-sync``.
* ``protocol`` -- the launcher <-> process channel (``@@DT`` lines on stdout, JSON commands
  on stdin) and the exit statuses: the launcher on one side, the processes it starts (the
  script API's ``Elastic``, ``engines.mxnet_serve``) on the other.

Standard library only; nothing here imports another part of the runtime.
"""
