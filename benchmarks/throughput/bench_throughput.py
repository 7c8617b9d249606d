#!/usr/bin/env python3
"""Steady-state throughput of the elastic launcher vs plain MXNet dist_sync, side by side in one run.

For each model of the example (``--model mlp``: a step of a few hundred microseconds, where any
per-step overhead shows; ``--model conv``: a small conv net, a step closer to a real model's) it
runs the same 2-worker job twice on this machine (127.x addresses, one OMP thread per process):
under the elastic launcher (``dt-train-digits``, survivor recovery on, no periodic checkpoint)
and as a plain ``dist_sync`` job (``benchmarks/resize/plain_digits.py``, the same net, batch and
data), and prints samples/s and the ratio.  Runs alternate (elastic, plain, elastic, plain, ...)
``--repeat`` times and the median is printed, so load from other processes hits both alike.

    python benchmarks/throughput/bench_throughput.py [--python .localcloud/node-venv/bin/python] [--resizes 6]

With ``--helper-alone`` a third kind alternates with them: the same example under the helper API started as the
plain job is, without the launcher (no wrappers, no spares), printed under the elastic figure: where a gap is,
in the helper's process or in the launcher's.

With ``--resizes N`` (default 6, 0 = none) the same run also measures the resize latency of
``benchmarks/resize`` (``--resize-at step``, 2 <-> 3 workers, p50 of N alternating up/down).

Steady state: plain counts epochs 2..N (the first is warm-up) on rank 0's clock; elastic the
epochs that end after the launcher's pre-warmed spare processes are ready (starting them
imports MXNet, which on one 2-core box competes with the training "hosts"; once warm they
idle), from the rank-0 ``epoch`` records' times.  The example validates only after its last
epoch here (``--eval-every 0``): the plain loop validates never, and that is the model's
work, not the launcher's.
"""
import argparse
import json
import os
import shutil
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts"))
import project_python  # noqa: E402  (the script's venv, when typed with another python)
project_python.require("node", "dynatrain_runtime")
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "resize"))
import bench_resize  # noqa: E402  (one home for the launcher/plain runners)


def measure(py, data, model, epochs, repeat, port, launcher_args=(), helper_alone=False):
    """Alternating elastic and plain runs; a failed run is reported and left out, not the whole table.
    ``launcher_args``: more options of the elastic runs' launcher (``--no-warm-spares``: every epoch after the
    first counts, there are no spares to wait for); ``helper_alone``: a third kind, the example under the helper
    API without the launcher (``bench_resize.helper_throughput``)."""
    steady = "--no-warm-spares" not in launcher_args
    kinds = ("elastic", "helper", "plain") if helper_alone else ("elastic", "plain")
    runs = {kind: [] for kind in kinds}
    failed = []
    for i in range(repeat):
        for kind in kinds:
            try:
                if kind == "elastic":
                    value = bench_resize.elastic_throughput(py, data, port + 2 * i, epochs,
                                                            ["--model", model, "--eval-every", "0"], launcher_args,
                                                            steady=steady)
                elif kind == "helper":
                    value = bench_resize.helper_throughput(py, data, port + 2 * i + 1 + 800, epochs,
                                                           ["--model", model, "--eval-every", "0"])
                else:
                    value = bench_resize.plain_throughput(py, data, port + 2 * i + 1 + 400, epochs, ["--model", model])
            except bench_resize.RunFailed as exc:
                failed.append("%s %s run %d: %s" % (model, kind, i + 1, str(exc).splitlines()[0]))
                print(failed[-1], flush=True)
                continue
            runs[kind].append(value)
    median = {k: (statistics.median(v) if v else float("nan")) for k, v in runs.items()}
    return dict(median, **{kind + "_runs": runs[kind] for kind in kinds}, failed=failed)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--python", default=os.environ.get("DT_NODE_PYTHON") or bench_resize.NODE_PYTHON)
    ap.add_argument("--models", default="mlp,conv")
    ap.add_argument("--epochs", default="300,100",
                    help="epochs per run for each model, in --models order (the first is not counted)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per model and kind; the median is printed")
    ap.add_argument("--resizes", type=int, default=6, help="resizes to time (alternating up/down), 0 = none")
    ap.add_argument("--json", action="store_true", help="also print the raw figures as JSON")
    ap.add_argument("--launcher-arg", action="append", default=[], metavar="OPTION",
                    help="one more option of the elastic runs' launcher, e.g. --launcher-arg=--no-warm-spares")
    ap.add_argument("--helper-alone", action="store_true",
                    help="also run the example under the helper API without the launcher (its own row): "
                         "the helper's cost against plain, the launcher's against elastic")
    args = ap.parse_args()
    data = bench_resize.prepare_digits(args.python)
    models = args.models.split(",")
    epochs = [int(e) for e in args.epochs.split(",")]
    if len(epochs) != len(models) or min(epochs) < 2:
        ap.error("--epochs needs one count >= 2 per model of --models")
    res = {}
    try:
        for n, model in enumerate(models):
            res[model] = measure(args.python, data, model, epochs[n], args.repeat, 20100 + 20 * n, args.launcher_arg,
                                 args.helper_alone)
            res[model]["epochs"] = epochs[n]
        try:
            resizes = bench_resize.resize_latencies(args.python, data, "step", args.resizes, 20300, 0.02) \
                if args.resizes else []
        except bench_resize.RunFailed as exc:     # the throughput table still prints
            print("resize latencies left out: %s" % str(exc).splitlines()[0], flush=True)
            resizes = []
    finally:
        shutil.rmtree(os.path.dirname(data), ignore_errors=True)
    print("")
    print("elastic launcher vs plain dist_sync (2 workers, local transport, %d cores, median of %d runs%s)"
          % (os.cpu_count(), args.repeat, "; the launcher with " + " ".join(args.launcher_arg) if args.launcher_arg else ""))
    print("%-8s %7s %18s %18s %8s" % ("model", "epochs", "elastic samples/s", "plain samples/s", "ratio"))
    print("-" * 64)
    for model, r in res.items():
        ratio = r["elastic"] / r["plain"] if r["plain"] == r["plain"] and r["plain"] else float("nan")
        print("%-8s %7d %18.0f %18.0f %8.2f" % (model, r["epochs"], r["elastic"], r["plain"], ratio))
        if "helper" in r:
            print("%-8s %7s %18.0f %18s %8.2f  (the helper without the launcher)"
                  % ("", "", r["helper"], "", r["helper"] / r["plain"] if r["plain"] == r["plain"] and r["plain"]
                     else float("nan")))
        for line in r["failed"]:
            print("    (left out) " + line)
    if resizes:
        def p50(d=None):
            vals = [r["edit_to_first_step_s"] for r in resizes if d is None or r["dir"] == d]
            return statistics.median(vals) if vals else float("nan")

        print("-" * 64)
        print("resize (--resize-at step, 2<->3 workers, %d resizes): host_worker edit -> first new step, p50 s"
              % len(resizes))
        print("%-8s %7.2f   up %7.2f   down %7.2f" % ("all", p50(), p50("up"), p50("down")))
    if args.json:
        print(json.dumps(dict(res, resizes=resizes)))


if __name__ == "__main__":
    main()
