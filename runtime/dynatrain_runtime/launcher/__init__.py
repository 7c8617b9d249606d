"""The elastic launcher of dynatrain.elastic (runs on the master): ``dt-launcher``.

Starts the MXNet parameter-server job (scheduler + servers on the master, one worker
per host of ``$EFS_MOUNT/host_worker``), watches ``host_worker`` and applies every
change at the next step (or epoch) boundary; see ``loop``.  ``host_worker_log`` gets
``SEQ ADDED|REMOVED IP NS`` once the new group has completed its first step,
``SEQ FAILED IP NS`` as soon as a lost worker is dropped; ``events.jsonl`` the same and
more; ``status.json`` the current state.

The parts: ``transport`` (local or ssh command lines), ``proc`` (a started process),
``child`` (the wrapper that ties a process's life to the launcher's), ``spares``
(pre-warmed processes), ``membership`` (host_worker and its log), ``records``
(events and status), ``generation`` (one process group and its failure checks),
``loop`` (the main loop, over a launch strategy: ``strategy``, ``restart``, ``inplace``),
``resize`` (a change's record), ``intake`` (drain and warm requests), ``failures`` (a lost
worker), ``config`` (the settings), ``cli`` (options).
"""

from __future__ import annotations

from .cli import main, parse_args

__all__ = ["main", "parse_args"]
