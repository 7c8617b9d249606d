"""The node daemons: services a role runs beside the launcher, each with its own console script.

* ``spot`` (``dt-spot-watch``, roles/spot_watch, every worker): a spot interruption notice
  becomes a drain request on the shared volume;
* ``s3sync`` (``dt-checkpoint-sync``, ``dt-checkpoint-restore``, roles/launcher on the master):
  the job's copy in S3 and its restore onto a fresh volume.

Neither is imported by the launcher or by a training script; they meet them on the shared
volume only (``shared_volume``).
"""
