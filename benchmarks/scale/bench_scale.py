#!/usr/bin/env python3
"""Throughput at 4 and 8 workers: one parameter server on the master vs one per node, in one run.

    python benchmarks/scale/bench_scale.py [--python .localcloud/node-venv/bin/python] [--workers 4,8]
    python benchmarks/scale/bench_scale.py --workers 1,2,4 --sample-cost-ms 6 --layouts 1 --epochs 6

The second line is the scaling table of simulated compute (``dt-train-digits --sample-cost-ms``: a
sleep per sample a worker processes, as a heavier model's forward/backward costs): with a fixed
global batch, more workers each process fewer samples per step, so samples/s rises with the world
even on 2 cores (a sleep takes no core), less the coordination each step adds.

Each configuration runs the example (``--model mlp`` by default, global batch 64) under the
launcher with ``--transport local`` on 127.x addresses (every "node" is a process group on
this machine, one OMP thread per process), ``--num-servers 1`` and ``--num-servers per-node``
alternating, without pre-warmed spares (they do not change the steady state and would add a
process per role).  samples/s counts the epochs after the first (rank 0's ``epoch`` records).

On one machine with few cores the spread layout cannot show what it gains on real nodes
(each server's network and CPU): all servers share the same cores, so this measures mostly
that the layout works and what the extra processes cost here.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts"))
import project_python  # noqa: E402  (the script's venv, when typed with another python)
project_python.require("node", "dynatrain_runtime")
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "resize"))
import bench_resize  # noqa: E402  (one home for the launcher runner)


def throughput(py, data, workers, servers, epochs, model, port_base, sample_cost_ms=0.0):
    """samples/s of one run with ``workers`` worker hosts and ``--num-servers servers``."""
    efs = tempfile.mkdtemp(prefix="dtbench-scale-")
    hosts = ["127.0.0.%d" % (150 + i) for i in range(workers)]      # the last one is the master
    bench_resize.write_hosts(efs, hosts)
    proc = bench_resize.launcher(efs, py, data, "step",
                                 ["--epochs", str(epochs), "--checkpoint-every", "0", "--model", model,
                                  "--eval-every", "0", "--sample-cost-ms", str(sample_cost_ms)], port_base,
                                 ["--num-servers", str(servers), "--no-warm-spares", "--start-timeout", "300"])
    try:
        proc.wait(900)
        ep = [e for e in bench_resize.events(efs) if e["event"] == "epoch"]
        if len(ep) < 3 or proc.returncode != 0:
            with open(os.path.join(efs, "launcher.out"), "rb") as handle:
                tail = handle.read()[-3000:].decode("utf-8", "replace")
            raise SystemExit("benchmark: %d workers, servers %s: rc %s, %d epochs; launcher log tail:\n%s"
                             % (workers, servers, proc.returncode, len(ep), tail))
        return bench_resize.epoch_rate(ep)
    finally:
        bench_resize.stop(proc)
        shutil.rmtree(efs, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--python", default=os.environ.get("DT_NODE_PYTHON") or bench_resize.NODE_PYTHON)
    ap.add_argument("--workers", default="4,8", help="worker counts, comma-separated")
    ap.add_argument("--model", default="mlp", choices=("mlp", "conv"))
    ap.add_argument("--epochs", type=int, default=30, help="epochs per run (the first is not counted)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per configuration; the median is printed")
    ap.add_argument("--sample-cost-ms", type=float, default=0.0,
                    help="simulated compute per sample a worker processes (dt-train-digits) [%(default)s]")
    ap.add_argument("--layouts", default="1,per-node", help="server layouts to run, comma-separated [%(default)s]")
    ap.add_argument("--json", action="store_true", help="also print the raw figures as JSON")
    args = ap.parse_args()
    layouts = [x for x in args.layouts.split(",") if x]
    data = bench_resize.prepare_digits(args.python)
    res = {}
    port = 20400
    try:
        for n in [int(w) for w in args.workers.split(",")]:
            runs = {k: [] for k in layouts}
            for _round in range(args.repeat):
                for servers in layouts:          # alternating: load from other jobs hits both
                    runs[servers].append(throughput(args.python, data, n, servers, args.epochs, args.model, port,
                                                    args.sample_cost_ms))
                    port += 1
            res[n] = {k: statistics.median(v) for k, v in runs.items()}
            res[n]["runs"] = runs
    finally:
        shutil.rmtree(os.path.dirname(data), ignore_errors=True)
    print("")
    cost = ", simulated compute %g ms per sample" % args.sample_cost_ms if args.sample_cost_ms else ""
    if layouts == ["1", "per-node"]:
        print("parameter servers: one on the master vs one per node (--model %s, global batch 64, local transport, "
              "%d cores, median of %d%s)" % (args.model, os.cpu_count(), args.repeat, cost))
        print("%-8s %22s %22s %8s" % ("workers", "1 server samples/s", "per-node samples/s", "ratio"))
        print("-" * 64)
        for n, r in res.items():
            print("%-8d %22.0f %22.0f %8.2f" % (n, r["1"], r["per-node"], r["per-node"] / r["1"]))
    else:
        first = min(res)
        print("samples/s by world size (--model %s, global batch 64, local transport, %d cores, median of %d%s)"
              % (args.model, os.cpu_count(), args.repeat, cost))
        print("%-8s %-10s %12s %16s" % ("workers", "servers", "samples/s", "vs %d worker(s)" % first))
        print("-" * 50)
        for n, r in res.items():
            for k in layouts:
                print("%-8d %-10s %12.0f %16.2f" % (n, k, r[k], r[k] / res[first][k]))
    if args.json:
        print(json.dumps({str(k): v for k, v in res.items()}))


if __name__ == "__main__":
    main()
