#!/usr/bin/env python3
"""Wall time of bootstrap and `add_workers -e count=N`, plain AMI vs baked node image, on the local cloud.

In one run, side by side:
  plain: bootstrap a cluster (master + 1 worker) from the base AMI (dt_node_image=plain),
         then for each N: add N workers (launch + configure + prepare data + join + confirmed ADDED),
         time it, remove them again; teardown.
  bake:  bake_image.yml (the node image of the current recipe; a second run reuses it).
  baked: the same as plain, from the baked image.
  pool:  the same as baked, with a warm pool of max(counts) workers (dt_warm_pool_size): reconcile fills
         it (timed apart), each add takes from it, reconcile refills it after each removal.
Prints one table: bootstrap and add_workers per count, plain vs baked, and count=N vs count=1.

--flow card (issue 43): the card's flow as a user types it, no bake step typed, in one sitting:
  before:     bootstrap.yml -e worker_count=1 -e dt_node_image=plain, add_workers.yml -e count=1 twice
              (the plain path: what the card's flow took before the node image became the default);
  after:      the same with the defaults (dt_node_image=auto: the first bootstrap of a recipe bakes beside the
              job, the adds boot the image);
  after+pool: -e dt_warm_pool_size=1 too: an add from the pool, an add with the pool empty while a reconcile
              refills it beside (baked), an add from the refilled pool.
Each playbook runs with ansible.posix.profile_tasks; the slowest tasks of each add are printed.
Targets: pool <= 10 s, baked <= 20 s, bootstrap with a pool of 1 <= 60 s once an image exists.
Targets (issues 10, 28): baked add_workers count=1 <= 20 s, count=4 <= 1.3 x count=1; bootstrap
(master + 1 worker) on the baked image <= 40 s; from the warm pool count=1 <= 10 s.

    .venv/bin/python benchmarks/add_workers/bench_add_workers.py [--counts 1,4,8] [--modes plain,baked,pool] [--keep]
    .venv/bin/python benchmarks/add_workers/bench_add_workers.py --flow card [--modes before,after,after+pool]

DT_LOCALCLOUD_PORT / DT_LOCALCLOUD_HOME pick the cloud; a port other than the default gets
its own copy of inventories/local pointing at it (ANSIBLE_INVENTORY), so a second cloud on
this machine is never driven by mistake. Per-task timings of each playbook: the logs under
.localcloud/demo/ (the dynatrain.elastic.progress callback with DT_PROGRESS_LOG).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import threading
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
    baked = {"dt_node_image": "plain"} if mode == "plain" else {}
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


CARD_COLUMNS = {
    "before": {"dt_node_image": "plain"},
    "after": {},
    "after+pool": {"dt_warm_pool_size": 1},
}
_PROFILE_LINE = re.compile(r"^(?P<task>.+?) -+ (?P<secs>\d+\.\d+)s$")


def slowest_tasks(log, top=4):
    """The ``top`` slowest tasks of a playbook log written with ansible.posix.profile_tasks."""
    rows = []
    try:
        with open(log) as fh:
            for line in fh:
                m = _PROFILE_LINE.match(line.strip())
                if m:
                    rows.append((float(m.group("secs")), m.group("task").strip()))
    except OSError:
        return []
    return sorted(rows, reverse=True)[:top]


def each_cluster(args, names, run, env=None):
    """Start the local cloud, then for each name one cluster (``<--cluster>-<name>``, training a long job)
    that ``run(d, name, out, results)`` drives, filling ``out``; torn down after it (the last kept with
    --keep). A failure is said and the next name still runs. Returns ({name: out}, [failures])."""
    subprocess.run([sys.executable, "-m", "localcloud", "up"], cwd=ROOT, check=True)
    results, failed = {}, []
    for i, name in enumerate(names):
        d = demo.Demo(argparse.Namespace(cluster="%s-%s" % (args.cluster, name.replace("+", "-")),
                                         subnet=args.subnet, json=True,
                                         train_args=["--epochs", "100000", "--step-sleep", "0.5"]))
        d.env = dict(private_inventory(demo.localcloud_env()), **(env or {}))
        results[name] = {}
        try:
            run(d, name, results[name], results)
        # the other names and the table still come
        except Exception as e:  # pylint: disable=broad-except
            failed.append("%s: %s" % (name, e))
            print("%s failed: %s" % (name, e), flush=True)
        finally:
            if not (args.keep and i == len(names) - 1):
                d.playbook("teardown", {}, check=False)
    return results, failed


def run_card(d, column, out, _results=None):
    """The card's flow for one column (CARD_COLUMNS), filling ``out`` as it goes."""
    settings = dict(CARD_COLUMNS[column])
    log = os.path.join(d.logdir, "%s-%%s.log" % d.args.cluster)

    def step(key, label, name, extra):
        out[key] = timed("%s %s" % (column, label), d.playbook, name, dict(settings, **extra))
        with open(log % name) as fh:
            # the callback folds long messages: look at the words, not the lines
            if "Baked the node image" in " ".join(fh.read().split()):
                out.setdefault("baked_by", []).append(key)
        for secs, task in slowest_tasks(log % name):
            print("    %5.1f s  %s" % (secs, task), flush=True)

    step("bootstrap", "bootstrap.yml -e worker_count=1", "bootstrap", {"worker_count": 1})
    d.wait_for("training to start", lambda: d.status().get("step", 0) > 0, 300)
    step("add1", "add_workers.yml -e count=1 (%s)" % ("from the pool" if "dt_warm_pool_size" in settings else "1st"),
         "add_workers", {"count": 1})
    if "dt_warm_pool_size" not in settings:
        step("add2", "add_workers.yml -e count=1 (2nd)", "add_workers", {"count": 1})
        return
    # the pool is empty: an add while a reconcile refills it, side by side
    refill = {}

    def reconcile():
        refill["secs"] = timed("%s reconcile (refill, beside the add)" % column, d.playbook, "reconcile", settings)

    beside = threading.Thread(target=reconcile)
    beside.start()
    step("add2", "add_workers.yml -e count=1 (pool empty, refilling)", "add_workers", {"count": 1})
    beside.join()
    out["refill"] = refill.get("secs")
    step("add3", "add_workers.yml -e count=1 (from the refilled pool)", "add_workers", {"count": 1})


def card_table(results):
    columns = list(results)
    rows = [("bootstrap", "bootstrap.yml -e worker_count=1 (target with a pool of 1, an image existing: <= 60 s)"),
            ("add1", "1st add_workers.yml -e count=1 (after+pool: from the pool, <= 10 s; else baked <= 20 s)"),
            ("add2", "2nd add_workers.yml -e count=1 (after+pool: pool empty, a refill beside; baked <= 20 s)"),
            ("refill", "reconcile refilling the pool (beside the 2nd add)"),
            ("add3", "3rd add_workers.yml -e count=1 (from the refilled pool, <= 10 s)")]
    lines = ["| seconds | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for key, label in rows:
        if any(key in results[c] for c in columns):
            cells = [_cell(results[c].get(key), "%.1f") + (" (baked the image)" if key in results[c].get("baked_by", [])
                                                           else "") for c in columns]
            lines.append("| %s | " % label + " | ".join(cells) + " |")
    return "\n".join(lines)


def main_card(args):
    """--flow card: the columns of CARD_COLUMNS (or --modes) in one sitting, one table."""
    columns = args.modes.split(",") if args.modes != "plain,baked,pool" else list(CARD_COLUMNS)
    results, failed = each_cluster(args, columns, run_card,
                                   {"ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks",
                                    "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "all"})
    print()
    print(card_table(results))
    for why in failed:
        print("FAILED %s" % why)
    return 1 if failed else 0


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
    p.add_argument("--flow", choices=("counts", "card"), default="counts",
                   help="card: the card's flow as typed, before/after/after+pool (--modes picks columns)")
    args = p.parse_args(argv)
    if args.flow == "card":
        return main_card(args)
    counts = [int(c) for c in args.counts.split(",")]
    modes = args.modes.split(",")

    def one_mode(d, mode, out, results):
        if mode in ("baked", "pool") and not any("bake" in r for r in results.values()):
            out["bake"] = timed("bake_image", d.playbook, "bake_image", {})
        run_mode(d, mode, counts, args.max_workers, out)

    results, failed = each_cluster(args, modes, one_mode)
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
