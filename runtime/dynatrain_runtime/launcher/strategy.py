"""The launch strategy's interface, and the choice of one for a job (once, at the launcher's start).

``Restart`` (``restart``: a new set of processes per generation; MXNet and scripts written for
torchrun, ``ScriptRestart``) and ``InPlace`` (``inplace``: the survivors' processes stay; torch with
the helper API) implement it; the loop (``loop.Launcher``) only calls it and never asks which engine
or script API the job has.
"""

from __future__ import annotations

from typing import Optional, Protocol

from .generation import Generation
from .inplace import InPlace, resize_mode
from .resize import ResizeRecord
from .restart import LAYOUTS, Restart, ScriptRestart
from .torchenv import node_gpus


class LaunchStrategy(Protocol):
    """How a generation's processes start, change, take effect and stop (see ``restart``'s doc)."""

    mode: str                   # "restart" | "in-place"
    plain: bool                 # a torchrun script: no helper API (no steps, spares or boundary state)
    warm_spares: bool           # processes pre-started for the next generation
    servers: bool               # MXNet: the scheduler and servers are pre-started too
    layout: object              # the engine's generation (``restart.LAYOUTS``): port, group, notes

    def env(self) -> dict: ...

    def start(self, membership: list) -> Generation: ...

    def change(self, g: Generation, reason: str, at: str) -> None: ...

    def in_effect(self, g: Generation, now: float) -> bool: ...

    def stop(self, g: Generation, outcome: str, info: dict) -> None: ...

    def release(self, g: Optional[Generation] = None, checkpoint: bool = True) -> None: ...

    def recovers_in_place(self, g: Generation, failed: dict) -> bool: ...

    def after_failure(self, g: Generation, record: ResizeRecord) -> None: ...


def choose(launcher) -> LaunchStrategy:
    """The strategy for ``launcher.config``: engine + script API + ``--resize-mode`` (``resize_mode``;
    ``auto`` restarts on GPU nodes, whose count is asked once here)."""
    config = launcher.config
    layout = LAYOUTS[config.engine]()
    gpus = node_gpus() if config.resize_mode == "auto" and config.engine == "torch" else 0   # the nodes are alike
    if resize_mode(config.resize_mode, config.engine, config.script_api, config.procs, gpus) == "in-place":
        return InPlace(launcher, layout)
    return (ScriptRestart if config.script_api == "torchrun" else Restart)(launcher, layout)
