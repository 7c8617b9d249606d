# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""The controller side's one reader of the job's ``events.jsonl``, and the timeline it tells.

The launcher and rank 0 of the training script append one JSON object per line to
``<EFS_MOUNT>/events.jsonl`` (``shared_volume``: its reader and writers, node side too).
Every record has ``event``, ``time`` (epoch seconds) and ``source`` (``launcher`` or
``train``). The kinds the timeline uses:

- ``generation_start`` (``generation``, ``world``, ``membership``): a new group of workers runs.
- ``epoch`` (``epoch``, ``step``, ``world``, ``samples_per_s``, ``val_acc``): rank 0 ends an epoch.
- ``resize_start`` / ``resize_end`` (``from``, ``to``, ``from_world``, ``to_world``, ``added``,
  ``removed``, ``reason`` absent for an asked-for change, ``drain`` or ``failure``).
- ``worker_failed`` (``ip``, ``reason``): a worker was lost without being asked.
- ``drain_requested`` (``ip``, ``reason``, e.g. ``spot``): a node asked to leave.
- ``train_end`` (``val_acc``), ``train_done``, ``launcher_exit``.

Used by ``dynatrain.elastic.job_info`` (which returns the records) and by
``timeline_plot`` (which draws them). Standard library only.
"""

from __future__ import annotations

from ansible_collections.dynatrain.elastic.plugins.module_utils.shared_volume import is_number


class JobEventsError(ValueError):
    """There is nothing to show: the message says which file and why."""


def _world_of(record: dict, members_key: str, world_key: str):
    if is_number(record.get(world_key)):
        return int(record[world_key])
    members = record.get(members_key)
    return len(members) if isinstance(members, list) else None


def timeline(events: list[dict]) -> dict:
    """What a timeline of the run shows, with times in seconds since the first record.

    Returns ``t0`` (epoch seconds of the first record), ``end`` (seconds, the last record),
    ``world`` (``[(t, world size)]`` steps, 0 while no group runs), ``epochs``
    (``[{t, epoch, step, world, samples_per_s, val_acc}]``), ``resizes`` (``[{start, end,
    from_world, to_world, reason, added, removed}]``, ``end`` None when it never finished),
    ``failures`` (``[{t, ip, reason}]``), ``drains`` (``[{t, ip, reason}]``, spot drains and
    other drain requests) and ``final_val_acc``.
    Raises JobEventsError when ``events`` holds no record.
    """
    records = sorted((e for e in events if isinstance(e, dict) and is_number(e.get("time"))),
                     key=lambda e: e["time"])
    if not records:
        raise JobEventsError("there are no events: the job has not started (events.jsonl is missing or empty)")
    t0 = records[0]["time"]
    out = {"t0": t0, "end": round(records[-1]["time"] - t0, 3), "world": [], "epochs": [], "resizes": [],
           "failures": [], "drains": [], "final_val_acc": None}
    open_resizes = []
    for rec in records:
        t = round(rec["time"] - t0, 3)
        kind = rec.get("event")
        if kind == "generation_start":
            world = _world_of(rec, "membership", "world")
            if world is not None:
                out["world"].append((t, world))
        elif kind == "resize_start":
            # No group trains from here until the next generation starts.
            out["world"].append((t, 0))
            resize = {"start": t, "end": None, "from_world": _world_of(rec, "from", "from_world"),
                      "to_world": _world_of(rec, "to", "to_world"), "reason": rec.get("reason") or "membership",
                      "added": list(rec.get("added") or []), "removed": list(rec.get("removed") or [])}
            out["resizes"].append(resize)
            open_resizes.append(resize)
        elif kind == "resize_end":
            # The oldest unfinished resize is this one (they do not overlap in the launcher).
            if open_resizes:
                open_resizes.pop(0)["end"] = t
        elif kind == "epoch" and rec.get("source", "train") == "train":
            out["epochs"].append({"t": t, "epoch": rec.get("epoch"), "step": rec.get("step"), "world": rec.get("world"),
                                  "samples_per_s": rec.get("samples_per_s") if is_number(rec.get("samples_per_s")) else None,
                                  "val_acc": rec.get("val_acc") if is_number(rec.get("val_acc")) else None})
            if is_number(rec.get("val_acc")):
                out["final_val_acc"] = rec["val_acc"]
        elif kind == "train_end" and is_number(rec.get("val_acc")):
            out["final_val_acc"] = rec["val_acc"]
        elif kind == "worker_failed":
            out["failures"].append({"t": t, "ip": rec.get("ip"), "reason": rec.get("reason")})
        elif kind == "drain_requested":
            out["drains"].append({"t": t, "ip": rec.get("ip"), "reason": rec.get("reason") or "drain"})
        elif kind in ("train_done", "launcher_exit"):
            out["world"].append((t, 0))
    return out
