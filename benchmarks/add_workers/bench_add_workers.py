"""Wall time of `add_workers -e count=N` for N = 1, 2, 4 on the local cloud.

Bootstraps a cluster (master only) whose job trains slowly enough to stay
running, then for each N: add N workers (launch + configure + prepare data +
join + confirmed ADDED), time it, and remove them again. Prints a table with
the time per added worker, so `adding 8 must not take 8x adding 1` can be read
off directly.

    .venv/bin/python benchmarks/add_workers/bench_add_workers.py [--counts 1,2,4] [--keep]
"""
import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import demo  # noqa: E402  (one home for driving the playbooks on the local cloud)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--counts", default="1,2,4")
    p.add_argument("--cluster", default="benchadd")
    p.add_argument("--subnet", default="127.80.1.0/24")
    p.add_argument("--keep", action="store_true", help="leave the cluster up")
    args = p.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",")]

    d = demo.Demo(argparse.Namespace(cluster=args.cluster, subnet=args.subnet, json=True,
                                     train_args=["--epochs", "100000", "--step-sleep", "0.5"]))
    import subprocess
    subprocess.run([sys.executable, "-m", "localcloud", "up"], cwd=ROOT, check=True)
    d.env = demo.localcloud_env()
    rows = []
    try:
        d.playbook("bootstrap", {"worker_count": 0, "max_workers": 16})
        d.wait_for("training to start", lambda: d.status().get("step", 0) > 0, 300)
        for n in counts:
            t0 = time.monotonic()
            d.playbook("add_workers", {"count": n, "max_workers": 16})
            secs = time.monotonic() - t0
            rows.append((n, secs))
            print("add_workers count=%d: %.1f s" % (n, secs), flush=True)
            d.playbook("remove_workers", {"count": n, "max_workers": 16})
    finally:
        if not args.keep:
            d.playbook("teardown", {}, check=False)
    base = rows[0][1] / rows[0][0] if rows else 0
    print()
    print("| count | add_workers wall (s) | per worker (s) | vs count x (time of count=1) |")
    print("|---:|---:|---:|---:|")
    for n, secs in rows:
        print("| %d | %.1f | %.1f | %.2f |" % (n, secs, secs / n, secs / (base * n) if base else 0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
