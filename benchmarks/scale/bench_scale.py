#!/usr/bin/env python3
"""Throughput at 4 and 8 workers: one parameter server on the master vs one per node, in one run.

    python benchmarks/scale/bench_scale.py [--python .localcloud/node-venv/bin/python] [--workers 4,8]

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
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "resize"))
import bench_resize  # noqa: E402  (one home for the launcher runner)


def throughput(py, data, workers, servers, epochs, model, port_base):
    """samples/s of one run with ``workers`` worker hosts and ``--num-servers servers``."""
    efs = tempfile.mkdtemp(prefix="dtbench-scale-")
    hosts = ["127.0.0.%d" % (150 + i) for i in range(workers)]      # the last one is the master
    bench_resize.write_hosts(efs, hosts)
    proc = bench_resize.launcher(efs, py, data, "step",
                                 ["--epochs", str(epochs), "--checkpoint-every", "0", "--model", model,
                                  "--eval-every", "0"], port_base,
                                 ["--num-servers", str(servers), "--no-warm-spares", "--start-timeout", "300"])
    try:
        proc.wait(900)
        ep = [e for e in bench_resize.events(efs) if e["event"] == "epoch"]
        if len(ep) < 3 or proc.returncode != 0:
            with open(os.path.join(efs, "launcher.out"), "rb") as handle:
                tail = handle.read()[-3000:].decode("utf-8", "replace")
            raise SystemExit("benchmark: %d workers, servers %s: rc %s, %d epochs; launcher log tail:\n%s"
                             % (workers, servers, proc.returncode, len(ep), tail))
        return sum(e["samples"] for e in ep[1:]) / (ep[-1]["time"] - ep[0]["time"])
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
    ap.add_argument("--json", action="store_true", help="also print the raw figures as JSON")
    args = ap.parse_args()
    data = bench_resize.prepare_digits(args.python)
    res = {}
    port = 20400
    try:
        for n in [int(w) for w in args.workers.split(",")]:
            runs = {"1": [], "per-node": []}
            for _round in range(args.repeat):
                for servers in ("1", "per-node"):          # alternating: load from other jobs hits both
                    runs[servers].append(throughput(args.python, data, n, servers, args.epochs, args.model, port))
                    port += 1
            res[n] = {k: statistics.median(v) for k, v in runs.items()}
            res[n]["runs"] = runs
    finally:
        shutil.rmtree(os.path.dirname(data), ignore_errors=True)
    print("")
    print("parameter servers: one on the master vs one per node (--model %s, global batch 64, local transport, "
          "%d cores, median of %d)" % (args.model, os.cpu_count(), args.repeat))
    print("%-8s %22s %22s %8s" % ("workers", "1 server samples/s", "per-node samples/s", "ratio"))
    print("-" * 64)
    for n, r in res.items():
        print("%-8d %22.0f %22.0f %8.2f" % (n, r["1"], r["per-node"], r["per-node"] / r["1"]))
    if args.json:
        print(json.dumps({str(k): v for k, v in res.items()}))


if __name__ == "__main__":
    main()
