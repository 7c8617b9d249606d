#!/usr/bin/env python3
"""bench_resize's table and plot, from one run's rows or from several runs' ``--json`` files merged (the rows of
the same size, system and change add up: medians over all of them).  The plot: seconds against state size
per system, the survivors' pause of an add and of a remove, and a kill -> the first step at the new size.

    python benchmarks/inplace/report.py run1.json run2.json [--plot benchmarks/inplace/resize.png]
"""
import argparse
import json
import statistics

CHANGES = ("add", "remove", "kill")
SYSTEMS = ("in-place", "restart", "torchft", "torchrun-tuned")

PANELS = (("add", "pause", "add: survivors' pause"), ("remove", "pause", "remove: survivors' pause"),
          ("kill", "total", "kill -> first step at the new size"))
STYLE = {"in-place": ("ours in place", "o-"), "restart": ("ours restart", "s--"), "torchft": ("torchft 0.2.0", "^-"),
         "torchrun-tuned": ("torchrun tuned", "v:")}


def state_mb(hidden):
    return 8 * (75 * hidden + 10) / 1e6


def med(rows, key):
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def cell(value, fmt):
    return "-" if value is None else fmt % value


def print_table(results):
    print("| state | system | change | change -> first step at new size (s) | ours: change -> training again (s) "
          "| survivors' pause (s) | in place: boundary -> first step - 1 step (s) | step (s) | steps redone | shared FS MB | peer MB "
          "| peer s | peer MB/s | n |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def order(kv):
        (hidden, system, change), _rows = kv
        return hidden, CHANGES.index(change), SYSTEMS.index(system) if system in SYSTEMS else 9

    for (hidden, system, change), rows in sorted(results.items(), key=order):
        print("| %.1f MB (H %d) | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d |" % (
            state_mb(hidden), hidden, system, change, cell(med(rows, "total"), "%.2f"), cell(med(rows, "again"), "%.2f"),
            cell(med(rows, "pause"), "%.2f"), cell(med(rows, "own_pause"), "%.2f"), cell(med(rows, "step"), "%.2f"),
            cell(med(rows, "recomputed"), "%d"), cell(med(rows, "fs_mb"), "%.0f"), cell(med(rows, "moved_mb"), "%.1f"),
            cell(med(rows, "transfer"), "%.2f"), cell(med(rows, "rate"), "%.0f"), len(rows)))


def load(paths):
    merged = {}
    for path in paths:
        with open(path) as handle:
            for rec in json.load(handle):
                merged.setdefault((rec["hidden"], rec["system"], rec["change"]), []).extend(rec["rows"])
    return merged


def plot(paths, out, results=None):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    merged = results if results is not None else load(paths)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(15, 4.6))
    for ax, (change, key, title) in zip(axes, PANELS):
        for system, (label, style) in STYLE.items():
            points = sorted((state_mb(h), statistics.median([r[key] for r in rows]))
                            for (h, s, c), rows in merged.items() if s == system and c == change and rows)
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], style, label=label)
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=0.1)          # 0.00 s pauses and 10 s restarts on one axis
        ax.set_ylim(bottom=0)
        ax.set_xlabel("state: parameters + momentum (MB)")
        ax.set_ylabel("seconds")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    fig.suptitle("Membership changes, digits MLP, 127.0.x hosts on a busy 2-core machine (medians)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("json", nargs="+")
    ap.add_argument("--plot", help="draw the plot here (PNG)")
    args = ap.parse_args()
    results = load(args.json)
    print_table(results)
    if args.plot:
        plot(args.json, args.plot, results=results)


if __name__ == "__main__":
    main()
