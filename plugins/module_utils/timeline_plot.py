# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""A PNG timeline of a training run from its ``events.jsonl``: the one home of the picture.

Three panels against minutes since the first event: world size (with resizes shaded
and labelled, failures and spot drains marked), samples/s and validation accuracy per
epoch (the same markers as vertical lines). Used by the ``dynatrain.elastic.timeline_plot``
module (``status.yml -e plot=true``) and by the demo; also a command line::

    PYTHONPATH=.collections python -m \\
        ansible_collections.dynatrain.elastic.plugins.module_utils.timeline_plot EVENTS_JSONL OUT_PNG

matplotlib is imported only when a picture is drawn (Agg backend, no display needed), so
the collection's other users of ``job_events`` do not need it.
"""

from __future__ import annotations

import os
import sys

from ansible_collections.dynatrain.elastic.plugins.module_utils.job_events import (
    JobEventsError,
    timeline,
)
from ansible_collections.dynatrain.elastic.plugins.module_utils.shared_volume import read_events

WIDTH_IN, HEIGHT_IN, DPI = 12.0, 8.0, 100
COLORS = {"world": "#1f4e79", "rate": "#2e7d32", "acc": "#6a1b9a", "resize": "#f0a500",
          "failure": "#c62828", "drain": "#00838f"}


class TimelinePlotError(RuntimeError):
    """The picture cannot be made (no events, matplotlib missing, the file cannot be written)."""


def _matplotlib():
    try:
        import matplotlib
    except ImportError as exc:
        raise TimelinePlotError(
            f"matplotlib is needed on the controller for the timeline ({exc}): "
            "pip install -r requirements.txt -c constraints.txt") from None
    matplotlib.use("Agg")  # files only: no display on a controller or in CI
    from matplotlib import pyplot
    return pyplot


def _minutes(seconds):
    return seconds / 60.0


def _world_steps(tl):
    """x, y of the world-size step line, extended to the last event."""
    xs, ys = [], []
    for t, world in tl["world"]:
        xs.append(_minutes(t))
        ys.append(world)
    if xs:
        xs.append(_minutes(tl["end"]))
        ys.append(ys[-1])
    return xs, ys


def render(events: list[dict], out_path: str, title: str | None = None) -> dict:
    """Draw the timeline of ``events`` (records of events.jsonl) into the PNG ``out_path``.

    Returns a summary of what was drawn: ``path``, ``width_px``/``height_px``, ``epochs``,
    ``resizes``, ``failures``, ``spot_drains``, ``drains`` (markers drawn, by kind),
    ``world_max``, ``duration_s``, ``final_val_acc`` and ``axes`` (each panel's pixel box
    in the image, ``[left, top, right, bottom]`` from the top-left corner).
    Raises TimelinePlotError (with the reason) when there is nothing to draw or the file
    cannot be written.
    """
    try:
        tl = timeline(events)
    except JobEventsError as exc:
        raise TimelinePlotError(str(exc)) from None
    plt = _matplotlib()
    fig, (ax_world, ax_rate, ax_acc) = plt.subplots(3, 1, sharex=True, figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI,
                                                    gridspec_kw={"height_ratios": [1.2, 1, 1]})
    try:
        drawn = _draw(tl, ax_world, ax_rate, ax_acc)
        fig.suptitle(title or "Training run timeline", fontsize=13, x=0.01, ha="left")
        # One legend above the panels, where it covers no data.
        handles, labels = ax_world.get_legend_handles_labels()
        fig.legend(handles, labels, loc="upper right", ncol=len(labels), fontsize=9, frameon=False)
        fig.tight_layout(rect=(0, 0, 1, 0.96))
        directory = os.path.dirname(os.path.abspath(out_path))
        try:
            os.makedirs(directory, exist_ok=True)
            fig.savefig(out_path, format="png", dpi=DPI)
        except OSError as exc:
            raise TimelinePlotError(f"cannot write the timeline to {out_path}: {exc}") from None
        width, height = fig.canvas.get_width_height()
        boxes = []
        for ax in (ax_world, ax_rate, ax_acc):
            x0, y0, x1, y1 = ax.get_window_extent().extents
            boxes.append([round(x0), round(height - y1), round(x1), round(height - y0)])
    finally:
        plt.close(fig)
    return dict(drawn, path=os.path.abspath(out_path), width_px=width, height_px=height, axes=boxes,
                world_max=max((w for _t, w in tl["world"]), default=0), duration_s=tl["end"],
                final_val_acc=tl["final_val_acc"])


def _draw(tl, ax_world, ax_rate, ax_acc) -> dict:
    """Draw the panels; returns how many markers of each kind were drawn."""
    xs, ys = _world_steps(tl)
    ax_world.step(xs, ys, where="post", color=COLORS["world"], linewidth=2, label="world size")
    top = max(ys, default=1) or 1
    ax_world.set_ylim(0, top + 1.2)
    ax_world.set_ylabel("workers")
    ax_world.yaxis.get_major_locator().set_params(integer=True)

    resizes = 0
    for resize in tl["resizes"]:
        start = _minutes(resize["start"])
        end = _minutes(resize["end"] if resize["end"] is not None else tl["end"])
        for ax in (ax_world, ax_rate, ax_acc):
            ax.axvspan(start, max(end, start + 0.002), color=COLORS["resize"], alpha=0.25, linewidth=0)
        label = f"{resize['from_world'] if resize['from_world'] is not None else '?'}" \
                f"\u2192{resize['to_world'] if resize['to_world'] is not None else '?'}"
        ax_world.annotate(label, (start, top + 0.6), fontsize=8, ha="left", color="#7a5200")
        resizes += 1

    failures = tl["failures"]
    spot = [d for d in tl["drains"] if d["reason"] == "spot"]
    other_drains = [d for d in tl["drains"] if d["reason"] != "spot"]
    marks = (("failure", failures, "X", "worker lost"), ("drain", spot, "v", "spot drain"),
             ("drain", other_drains, "v", "drain requested"))
    counts = {}
    for key, items, marker, label in marks:
        if not items:
            counts[label] = 0
            continue
        times = [_minutes(item["t"]) for item in items]
        points = ax_world.scatter(times, [top + 0.25] * len(times), marker=marker, s=90, color=COLORS[key],
                                  zorder=5, label=label, edgecolors="white" if marker == "X" else None)
        counts[label] = len(points.get_offsets())
        for ax in (ax_rate, ax_acc):
            for t in times:
                ax.axvline(t, color=COLORS[key], linestyle="--", linewidth=1, alpha=0.8)
    ax_world.fill_between([], [], color=COLORS["resize"], alpha=0.25, label="resize (paused)")

    epochs = tl["epochs"]
    rate = [(e["t"], e["samples_per_s"]) for e in epochs if e["samples_per_s"] is not None]
    acc = [(e["t"], e["val_acc"]) for e in epochs if e["val_acc"] is not None]
    ax_rate.plot([_minutes(t) for t, _v in rate], [v for _t, v in rate], marker="o", color=COLORS["rate"])
    ax_rate.set_ylabel("samples/s")
    ax_rate.set_ylim(bottom=0)
    ax_acc.plot([_minutes(t) for t, _v in acc], [v for _t, v in acc], marker="o", color=COLORS["acc"])
    ax_acc.set_ylabel("validation accuracy")
    ax_acc.set_xlabel("minutes since the first event")
    if not epochs:
        for ax in (ax_rate, ax_acc):
            ax.text(0.5, 0.5, "no epoch finished yet", transform=ax.transAxes, ha="center", va="center", color="gray")
    for ax in (ax_world, ax_rate, ax_acc):
        ax.grid(True, alpha=0.3)
        ax.set_xlim(0, max(_minutes(tl["end"]), 0.01))
    return {"epochs": len(epochs), "resizes": resizes, "failures": counts["worker lost"],
            "spot_drains": counts["spot drain"], "drains": counts["drain requested"]}


def render_file(events_file: str, out_path: str, title: str | None = None) -> dict:
    """``render`` from an events.jsonl file; a missing or empty file is a TimelinePlotError."""
    events, bad = read_events(events_file)
    if not events:
        why = "does not exist" if not os.path.exists(events_file) else "holds no event"
        raise TimelinePlotError(f"{events_file} {why}: no timeline to draw (has the job started?)")
    summary = render(events, out_path, title=title)
    summary["bad_lines"] = bad
    return summary


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m ansible_collections.dynatrain.elastic.plugins.module_utils.timeline_plot",
        description="Draw a PNG timeline (world size, samples/s, validation accuracy; resizes, failures "
                    "and spot drains marked) from a job's events.jsonl.")
    parser.add_argument("events", help="the job's events.jsonl")
    parser.add_argument("out", help="the PNG to write")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    try:
        summary = render_file(args.events, args.out, title=args.title)
    except TimelinePlotError as exc:
        sys.stderr.write(f"timeline: {exc}\n")
        return 1
    sys.stdout.write(f"timeline: {summary['path']} ({summary['epochs']} epochs, {summary['resizes']} resizes, "
                     f"{summary['failures']} failures, {summary['spot_drains']} spot drains)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
