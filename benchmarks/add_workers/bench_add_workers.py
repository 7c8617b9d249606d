"""Wall time of bootstrap and `add_workers -e count=N`, plain AMI vs baked node image, on the local cloud.

In one run, side by side:
  plain: bootstrap a cluster (master + 1 worker) from the base AMI (dt_use_baked_image=false),
         then for each N: add N workers (launch + configure + prepare data + join + confirmed ADDED),
         time it, remove them again; teardown.
  bake:  bake_image.yml (the node image of the current recipe; a second run reuses it).
  baked: the same as plain, from the baked image.
  pool:  the same as baked, with a warm pool of max(counts) workers (dt_warm_pool_size): reconcile fills
         it (timed apart), each add takes from it, reconcile refills it after each removal.
Prints one table: bootstrap and add_workers per count, plain vs baked, and count=N vs count=1.
Targets (issues 10, 28): baked add_workers count=1 <= 20 s, count=4 <= 1.3 x count=1; bootstrap
(master + 1 worker) on the baked image <= 40 s; from the warm pool count=1 <= 10 s.

    .venv/bin/python benchmarks/add_workers/bench_add_workers.py [--counts 1,4,8] [--modes plain,baked,pool] [--keep]

DT_LOCALCLOUD_PORT / DT_LOCALCLOUD_HOME pick the cloud; a port other than the default gets
its own copy of inventories/local pointing at it (ANSIBLE_INVENTORY), so a second cloud on
this machine is never driven by mistake. Per-task timings of each playbook: the logs under
.localcloud/demo/ (the dynatrain.elastic.progress callback with DT_PROGRESS_LOG).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, ROOT)
import demo  # noqa: E402  (one home for driving the playbooks on the local cloud)
from localcloud import config  # noqa: E402

DEFAULT_PORT = 4599


def private_inventory(env):
    """A copy of inventories/local whose endpoints are this cloud's (when not the default port)."""
    port = config.port()
    if port == DEFAULT_PORT:
        return env
    dest = os.path.join(config.home(), "inventory")
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(os.path.join(ROOT, "inventories", "local"), dest)
    for dirpath, _dirs, files in os.walk(dest):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path) as fh:
                text = fh.read()
            with open(path, "w") as fh:
                fh.write(text.replace("127.0.0.1:%d" % DEFAULT_PORT, "127.0.0.1:%d" % port))
    return dict(env, ANSIBLE_INVENTORY=dest)


def timed(label, func, *args, **kwargs):
    t0 = time.monotonic()
    func(*args, **kwargs)
    secs = time.monotonic() - t0
    print("%s: %.1f s" % (label, secs), flush=True)
    return secs


def run_mode(d, mode, counts, max_workers, out):
    """bootstrap (master + 1 worker), then add/remove each count; fills ``out`` {what: seconds} as it
    goes, so that a failure later keeps what was measured.
    pool: the baked image with a warm pool of max(counts) workers (filled by a reconcile once the job
    trains, timed apart), each add takes from it, and reconcile refills it after each removal (timed
    apart)."""
    baked = {"dt_use_baked_image": mode != "plain"}
    pool = {"dt_warm_pool_size": max(counts)} if mode == "pool" else {}
    out["bootstrap"] = timed("%s bootstrap (master + 1 worker)" % mode, d.playbook, "bootstrap",
                             dict(baked, worker_count=1, max_workers=max_workers))
    d.wait_for("training to start", lambda: d.status().get("step", 0) > 0, 300)
    if pool:
        out["fill"] = timed("%s fill the warm pool (%d workers)" % (mode, max(counts)), d.playbook, "reconcile",
                            dict(baked, **pool, max_workers=max_workers))
    for n in counts:
        out[n] = timed("%s add_workers count=%d" % (mode, n), d.playbook, "add_workers",
                       dict(baked, count=n, max_workers=max_workers))
        d.playbook("remove_workers", {"count": n, "max_workers": max_workers})
        if pool:
            out.setdefault("refill", {})[n] = timed("%s refill the warm pool after count=%d" % (mode, n), d.playbook,
                                                    "reconcile", dict(baked, **pool, max_workers=max_workers))


def _cell(value, fmt="%.1f s"):
    return fmt % value if value is not None else "-"


def table(results, counts):
    modes = list(results)
    lines = ["| what | " + " | ".join(modes) + " |", "|---|" + "---:|" * len(modes)]
    if any("bake" in results[m] for m in modes):
        lines.append("| bake_image (once) | " + " | ".join(
            "%.1f s" % results[m]["bake"] if "bake" in results[m] else "-" for m in modes) + " |")
    if any("fill" in results[m] for m in modes):
        lines.append("| fill the warm pool (reconcile, %d workers) | " % max(counts) + " | ".join(
            "%.1f s" % results[m]["fill"] if "fill" in results[m] else "-" for m in modes) + " |")
    lines.append("| bootstrap, master + 1 worker | " + " | ".join(
        _cell(results[m].get("bootstrap")) for m in modes) + " |")
    for n in counts:
        cells = []
        for m in modes:
            base = results[m].get(counts[0])
            secs = results[m].get(n)
            cells.append("%.1f s (%.2f x count=%d)" % (secs, secs / base, counts[0]) if base and secs and n != counts[0]
                         else _cell(secs))
        lines.append("| add_workers count=%d | " % n + " | ".join(cells) + " |")
    for n in counts:
        if any(n in results[m].get("refill", {}) for m in modes):
            lines.append("| refill the warm pool after count=%d (reconcile) | " % n + " | ".join(
                "%.1f s" % results[m]["refill"][n] if n in results[m].get("refill", {}) else "-" for m in modes) + " |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--counts", default="1,4,8")
    p.add_argument("--modes", default="plain,baked,pool")
    p.add_argument("--cluster", default="benchadd")
    p.add_argument("--subnet", default="127.80.1.0/24")
    p.add_argument("--max-workers", type=int, default=12)
    p.add_argument("--keep", action="store_true", help="leave the last cluster up")
    args = p.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",")]
    modes = args.modes.split(",")

    subprocess.run([sys.executable, "-m", "localcloud", "up"], cwd=ROOT, check=True)
    results, failed = {}, []
    for i, mode in enumerate(modes):
        d = demo.Demo(argparse.Namespace(cluster="%s-%s" % (args.cluster, mode), subnet=args.subnet, json=True,
                                         train_args=["--epochs", "100000", "--step-sleep", "0.5"]))
        d.env = private_inventory(demo.localcloud_env())
        results[mode] = {}
        try:
            if mode in ("baked", "pool") and not any("bake" in r for r in results.values()):
                results[mode]["bake"] = timed("bake_image", d.playbook, "bake_image", {})
            run_mode(d, mode, counts, args.max_workers, results[mode])
        # the other modes and the table still come
        except Exception as e:  # pylint: disable=broad-except
            failed.append("%s: %s" % (mode, e))
            print("%s failed: %s" % (mode, e), flush=True)
        finally:
            if not (args.keep and i == len(modes) - 1):
                d.playbook("teardown", {}, check=False)
    print()
    print(table(results, counts))
    base = results.get("baked") or results.get(modes[-1])
    if base and all(base.get(k) for k in (counts[0], 4, "bootstrap")):
        print("\ntargets (baked): count=1 %.1f s (<= 20), count=4 %.2f x count=1 (<= 1.3), bootstrap %.1f s (<= 40)"
              % (base[counts[0]], base[4] / base[counts[0]], base["bootstrap"]))
    if results.get("pool", {}).get(counts[0]):
        print("target (warm pool): count=%d %.1f s (<= 10)" % (counts[0], results["pool"][counts[0]]))
    for why in failed:
        print("FAILED %s" % why)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
