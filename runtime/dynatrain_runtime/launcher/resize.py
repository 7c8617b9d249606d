"""The record of one membership change, from its detection to the new group's first step.

Made where the change is seen (a ``host_worker`` edit or a drain: ``ResizeRecord.for_change``; a lost
worker: ``ResizeRecord.for_failure``), completed as the old group ends and the new one starts, and
written twice: ``resize_start`` (as it stands when made) and ``resize_end`` (at the first new step).
A field that is None is not known yet and is left out of the event; one that ``set`` was given None
is known to be unknown (a torchrun script's resume step, the boundary of an in-place recovery) and
is written as null -- the events are what they were when this record was a dict.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set

EVENT_NAMES = {"from_hosts": "from"}       # field -> key in events.jsonl ("from" is a Python keyword)


@dataclass(eq=False)
class ResizeRecord:         # pylint: disable=too-many-instance-attributes  # one field per event key
    detected_at: float                      # monotonic (``wall_clock_resize`` for the events)
    from_hosts: List[str]
    to: List[str]
    from_world: int
    added: List[str]
    removed: List[str]
    from_generation: int
    to_world: Optional[int] = None
    reason: Optional[str] = None            # "drain" | "failure"; a host_worker edit: none
    resize_at: Optional[str] = None         # a host_worker edit's boundary (--resize-at)
    warm_wait_s: Optional[float] = None     # detection -> the joiners warm (training went on)
    drained: Optional[Dict[str, Optional[str]]] = None
    # a lost worker: where the job resumes from
    recovered_from: Optional[str] = None    # "survivor" | "checkpoint" | "script" | "in-place"
    resume_step: Optional[int] = None
    stop_step: Optional[int] = None         # the old group's last completed step
    recomputed_steps: Optional[int] = None
    recovery_s: Optional[float] = None
    # the timings, s
    boundary_s: Optional[float] = None      # detection -> the old group's last step (a kill: < 0)
    stop_s: Optional[float] = None
    first_step_s: Optional[float] = None
    total_s: Optional[float] = None
    first_step: Optional[int] = None
    world: Optional[int] = None
    generation: Optional[int] = None
    phases: Optional[dict] = None
    # an in-place change (``InPlaceGeneration.summary``)
    mode: Optional[str] = None
    bytes_moved: Optional[int] = None
    transfer_s: Optional[float] = None
    transfer_overlapped: Optional[bool] = None     # the transfer ran behind the first step (``Healing``)
    transfer_waited_s: Optional[float] = None      # ... and the first optimizer step waited at most this long
    transfer_mb_s: Optional[float] = None
    chunks: Optional[int] = None
    refetched: Optional[int] = None
    pause_s: Optional[float] = None
    checkpoint_written: Optional[bool] = None
    pids: Optional[Dict[str, int]] = None
    unknown: Set[str] = field(default_factory=set, repr=False)     # fields said to be None: written as null

    @classmethod
    def for_change(cls, g, hosts, procs, since, now, resize_at, draining):
        """A ``host_worker`` edit (or a drain) seen at ``now``, its joiners first waited for since ``since``."""
        added = [h for h in hosts if h not in g.membership]
        removed = [h for h in g.membership if h not in hosts]
        record = cls(detected_at=since, warm_wait_s=round(now - since, 3), from_hosts=g.membership, to=hosts,
                     from_world=g.world, to_world=len(hosts) * procs, added=added, removed=removed,
                     resize_at=resize_at, from_generation=g.id)
        drained = [h for h in removed if h in draining]
        if drained:
            record.reason = "drain"
            record.drained = {h: draining[h].get("reason") for h in drained}
        return record

    @classmethod
    def for_failure(cls, g, drop, stop_step, resume_step, from_survivor):
        """A lost worker: ``drop`` leave, the job resumes at ``resume_step`` (a survivor's state or a checkpoint)."""
        return cls(detected_at=g.failed_at or time.monotonic(), from_hosts=g.membership,
                   to=[h for h in g.membership if h not in drop], from_world=g.world, added=[], removed=drop,
                   reason="failure", from_generation=g.id,
                   recovered_from="survivor" if from_survivor else "checkpoint", resume_step=resume_step,
                   stop_step=stop_step, recomputed_steps=max(0, stop_step - resume_step))

    def set(self, **values):
        """Set fields; one given None is written as null (known to be unknown), not left out."""
        for name, value in values.items():
            if name not in FIELD_NAMES:
                raise AttributeError(f"no resize field {name!r}")
            setattr(self, name, value)
            if value is None:
                self.unknown.add(name)
            else:
                self.unknown.discard(name)

    def fields(self):
        """The record as events.jsonl has it (``detected_at`` still monotonic)."""
        out = {}
        for name in FIELD_NAMES:
            value = getattr(self, name)
            if value is not None or name in self.unknown:
                out[EVENT_NAMES.get(name, name)] = value
        return out

    def event_fields(self):
        """The fields of ``resize_start`` / ``resize_end``."""
        return wall_clock_resize(self.fields())


FIELD_NAMES = tuple(f.name for f in dataclasses.fields(ResizeRecord) if f.name != "unknown")


def wall_clock_resize(resize):
    """A resize's fields for events.jsonl: ``detected_at`` as wall-clock time, as every event's ``time``
    (the launcher keeps it on the monotonic clock, which its intervals are measured on)."""
    out = dict(resize)
    if out.get("detected_at") is not None:
        out["detected_at"] = round(time.time() - (time.monotonic() - out["detected_at"]), 3)
    return out
