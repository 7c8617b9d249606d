#!/usr/bin/env python3
"""Goodput under churn: useful samples/s of an elastic job with spot drains, kills and re-adds.

One launcher (local transport, 4 workers = 127.0.10.x "hosts" on this machine, the master
last) trains the digits MLP without end.  First the steady throughput is measured at each
world size the churn visits (4, 3, 2: host_worker edits, each measured once the resize is
done and the spares are warm).  Then, for ``--duration`` seconds, a scripted sequence of
churn, one action every ``duration / actions`` seconds:

    spot notice (drain request) -> re-add -> kill (SIGKILL, a lost host) -> re-add
    -> a drain and a kill at once -> re-add both -> ...

Useful samples are those of committed steps the job keeps (a step redone after a rollback
counts once), so a rollback to an old checkpoint costs goodput.  The reference is the
steady samples/s at the same world sizes, weighted by the time the churned job spent at
each.  Prints a markdown table: goodput ratio (target >= 0.90), steps recomputed,
notice -> drained, failure -> resumed and add -> joined times (p50 / max).

    python benchmarks/churn/bench_churn.py [--quick] [--duration 300] [--recovery survivor|checkpoint]
                                           [--engine mxnet|torch]

Run it with a Python that has the dynatrain_runtime wheel (the controller ``.venv`` after
``make runtime``, or the node venv); ``--python`` (default: ``.localcloud/node-venv``)
runs the job.  Every "host" shares this machine's cores, so absolute figures are
pessimistic; the ratio is what the benchmark is for.
"""
import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts"))
import project_python  # noqa: E402  (the script's venv, when typed with another python)
project_python.require("controller", "dynatrain_runtime")
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "resize"))
import bench_resize as br  # noqa: E402  (one home for driving the launcher locally)
from localjob import host_pids  # noqa: E402  (on sys.path through bench_resize)

from dynatrain_runtime.contract.shared_volume import JobFiles, write_drain_request  # noqa: E402

MASTER = "127.0.10.41"
WORKERS = ["127.0.10.42", "127.0.10.43", "127.0.10.44"]
GLOBAL_BATCH = 64


class StatusLog(object):
    """Polls status.json: the job's (time, world, step) over the whole run."""

    def __init__(self, efs, interval=0.2):
        self.path = os.path.join(efs, "status.json")
        self.rows = []
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                with open(self.path) as handle:
                    st = json.load(handle)
                self.rows.append((time.time(), st.get("world_size"), st.get("step") or 0, st.get("state")))
            except (OSError, ValueError):
                pass
            self._stop.wait(self.interval)

    def last(self):
        return self.rows[-1] if self.rows else (time.time(), None, 0, None)

    def stop(self):
        self._stop.set()
        self._thread.join()


class Job(object):
    """The churned job: its files, its hosts and the actions done to it."""

    def __init__(self, efs, status):
        self.efs, self.status, self.files = efs, status, JobFiles(efs)
        self.actions = []                  # (kind, host, time)

    def hosts(self):
        with open(os.path.join(self.efs, "host_worker")) as handle:
            return [l.strip() for l in handle if l.strip() and not l.startswith("#")]

    def set_workers(self, workers):
        br.write_hosts(self.efs, list(workers) + [MASTER])

    def logged(self, event, host, since):
        return [e for e in br.events(self.efs) if e["event"] == "host_worker_log" and e["log_event"] == event
                and e["ip"] == host and e["time"] >= since]

    def drain(self, host):
        self.actions.append(("drain", host, time.time()))
        write_drain_request(self.files, host, "spot", notice={"action": "terminate", "benchmark": True})

    def kill(self, host):
        self.actions.append(("kill", host, time.time()))
        for pid in host_pids(self.efs, host, command_has=b"train_digits"):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def add(self, host):
        """Re-add ``host`` once its departure is logged (the launcher edits host_worker on the way)."""
        left = [a for a in self.actions if a[1] == host and a[0] in ("drain", "kill")]
        if left:
            br.wait(lambda: self.logged("REMOVED", host, left[-1][2]) or self.logged("FAILED", host, left[-1][2]),
                    120, "departure of %s" % host)
        self.actions.append(("add", host, time.time()))
        self.set_workers([h for h in self.hosts() if h != MASTER] + [host])


def samples_at(step, epoch_samples, steps_per_epoch):
    """Samples consumed by ``step`` committed steps (fixed-global batch, last step of an epoch shorter)."""
    return (step // steps_per_epoch) * epoch_samples + (step % steps_per_epoch) * GLOBAL_BATCH


def settle(job, world, timeout=120):
    br.wait(lambda: job.status.last()[1] == world and job.status.last()[3] == "running", timeout,
            "world %d running" % world)
    br.wait_spares(job.efs)


def steady_rate(job, seconds, layout):
    t0, _w, s0, _st = job.status.last()
    time.sleep(seconds)
    t1, _w, s1, _st = job.status.last()
    return (samples_at(s1, *layout) - samples_at(s0, *layout)) / (t1 - t0)


def churn_plan(n):
    """The scripted sequence, cycled: (action, host index) lists, one list per tick."""
    a, b, c = WORKERS
    cycle = [[("drain", a)], [("add", a)], [("kill", b)], [("add", b)],
             [("drain", c), ("kill", a)], [("add", c), ("add", a)]]
    return [cycle[i % len(cycle)] for i in range(n)]


def pct(vals, q):
    if not vals:
        return float("nan")
    vals = sorted(vals)
    return vals[min(len(vals) - 1, int(math.ceil(q * len(vals))) - 1)]


def run(args, data):
    efs = tempfile.mkdtemp(prefix="dtchurn-")
    br.write_hosts(efs, WORKERS + [MASTER])
    engine = ["--engine", args.engine] if args.engine != "mxnet" else []     # mxnet: the launcher's default
    proc = br.launcher(efs, args.python, data, "step",
                       ["--epochs", "100000", "--step-sleep", str(args.step_sleep),
                        "--checkpoint-every", str(args.checkpoint_every)] + engine, args.port_base,
                       launcher_args=["--recovery", args.recovery, "--spare-depth", str(args.spare_depth)] + engine)
    status = StatusLog(efs)
    job = Job(efs, status)
    try:
        first = br.wait(lambda: [e for e in br.events(efs) if e["event"] == "epoch"], 180, "first epoch")[0]
        layout = (first["samples"], first["step"])          # samples and steps of one epoch
        steady = {}
        for world in (4, 3, 2):
            job.set_workers(WORKERS[:world - 1])
            settle(job, world)
            steady[world] = steady_rate(job, args.steady_s, layout)
            print("steady world %d: %.0f samples/s" % (world, steady[world]), flush=True)
        job.set_workers(WORKERS)
        settle(job, 4)
        ticks = churn_plan(args.actions)
        period = args.duration / float(len(ticks))
        t0 = time.time()
        start = status.last()
        for i, tick in enumerate(ticks):
            br.wait(lambda: time.time() >= t0 + i * period, period + 5, "tick %d" % i)
            for kind, host in tick:
                print("%6.1f s: %s %s" % (time.time() - t0, kind, host), flush=True)
                getattr(job, kind)(host)
        time.sleep(max(0.0, t0 + args.duration - time.time()))
        end = status.last()
    finally:
        br.stop(proc)
        status.stop()
    evs = br.events(efs)
    if args.keep:
        print("job directory kept: %s" % efs)
    else:
        shutil.rmtree(efs, ignore_errors=True)
    return summarize(args, job, status.rows, evs, steady, layout, start, end)


def summarize(args, job, rows, evs, steady, layout, start, end):
    t0, t1 = start[0], end[0]
    useful = (samples_at(end[2], *layout) - samples_at(start[2], *layout)) / (t1 - t0)
    window = [r for r in rows if t0 <= r[0] <= t1]
    ref_num, world_num = 0.0, 0.0
    for (ta, world, _s, _st), (tb, _w, _s2, _st2) in zip(window, window[1:]):
        known = min(steady, key=lambda w: abs(w - (world or 0)))
        ref_num += (tb - ta) * steady[known]
        world_num += (tb - ta) * (world or 0)
    span = window[-1][0] - window[0][0]
    reference = ref_num / span
    ends = [e for e in evs if e["event"] == "resize_end" and t0 <= e["time"] <= t1 + 60]
    drained, resumed, joined = [], [], []
    for kind, host, when in job.actions:
        if kind == "drain":
            hit = [e["time"] for e in evs if e["event"] == "host_worker_log" and e["log_event"] == "REMOVED"
                   and e["ip"] == host and e["time"] >= when]
            drained += [hit[0] - when] if hit else []
        elif kind == "kill":
            hit = [e["time"] for e in ends if e.get("reason") == "failure" and e["time"] >= when]
            resumed += [hit[0] - when] if hit else []
        else:
            hit = [e["time"] for e in evs if e["event"] == "host_worker_log" and e["log_event"] == "ADDED"
                   and e["ip"] == host and e["time"] >= when]
            joined += [hit[0] - when] if hit else []
    failures = [e for e in ends if e.get("reason") == "failure"]
    counts = {k: sum(1 for a in job.actions if a[0] == k) for k in ("drain", "kill", "add")}
    return {"duration_s": round(t1 - t0, 1), "actions": counts, "mean_world": world_num / span,
            "useful_sps": useful, "reference_sps": reference, "ratio": useful / reference,
            "steady_sps": steady, "recomputed_steps": sum(e.get("recomputed_steps", 0) for e in ends),
            "recovered_from": [e.get("recovered_from") for e in failures],
            "drained_s": drained, "resumed_s": resumed, "joined_s": joined, "recovery": args.recovery,
            "engine": args.engine,
            "spare_depth": args.spare_depth}


def print_table(res):
    def pm(vals):
        return "%.2f / %.2f (n=%d)" % (pct(vals, 0.5), max(vals) if vals else float("nan"), len(vals))

    a = res["actions"]
    print("")
    print("goodput under churn (%s engine, local transport, %d cores, 4 workers, --recovery %s, --spare-depth %d, "
          "%.0f s, %d drains, %d kills, %d re-adds)"
          % (res.get("engine", "mxnet"), os.cpu_count(), res["recovery"], res["spare_depth"], res["duration_s"],
             a["drain"], a["kill"], a["add"]))
    print("")
    print("| metric | value |")
    print("|---|---:|")
    print("| useful samples/s under churn | %.0f |" % res["useful_sps"])
    print("| steady samples/s at the same world sizes (mean world %.2f) | %.0f |"
          % (res["mean_world"], res["reference_sps"]))
    print("| **goodput ratio** (target >= 0.90) | **%.3f** |" % res["ratio"])
    print("| steady samples/s by world size | %s |"
          % ", ".join("%d: %.0f" % (w, s) for w, s in sorted(res["steady_sps"].items())))
    events = sum(a.values())
    print("| training time lost per churn event, s ((1 - ratio) x duration / events) | %.2f |"
          % ((1 - res["ratio"]) * res["duration_s"] / max(1, events)))
    print("| steps recomputed (total) | %d |" % res["recomputed_steps"])
    print("| failures recovered from | %s |" % (", ".join(res["recovered_from"]) or "-"))
    print("| spot notice -> drained, s (p50 / max) | %s |" % pm(res["drained_s"]))
    print("| failure -> resumed, s (p50 / max) | %s |" % pm(res["resumed_s"]))
    print("| add -> joined, s (p50 / max) | %s |" % pm(res["joined_s"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--python", default=os.environ.get("DT_NODE_PYTHON") or br.NODE_PYTHON)
    ap.add_argument("--duration", type=float, default=300.0, help="churn phase, s [%(default)s]")
    ap.add_argument("--quick", action="store_true", help="about a minute of churn, shorter steady phases")
    ap.add_argument("--actions", type=int, default=None, help="churn ticks [one per 15 s, at least 4]")
    ap.add_argument("--steady-s", type=float, default=None, help="steady measurement per world size [20; quick 10]")
    ap.add_argument("--step-sleep", type=float, default=0.05)
    ap.add_argument("--checkpoint-every", type=int, default=20)
    ap.add_argument("--engine", choices=("mxnet", "torch"), default="mxnet",
                    help="the launcher's and the example's --engine (torch: the --python needs torch==2.13.0) "
                         "[%(default)s]")
    ap.add_argument("--recovery", choices=("survivor", "checkpoint"), default="survivor")
    ap.add_argument("--spare-depth", type=int, default=2, help="the launcher's --spare-depth [%(default)s]")
    ap.add_argument("--port-base", type=int, default=20100)
    ap.add_argument("--keep", action="store_true", help="keep the job directory (events, launcher.out)")
    ap.add_argument("--json", action="store_true", help="also print the raw figures as JSON")
    args = ap.parse_args()
    if args.quick:
        args.duration = min(args.duration, 60.0)
    args.actions = args.actions or max(4, int(args.duration // 15))
    args.steady_s = args.steady_s or (10.0 if args.quick else 20.0)
    tmp = tempfile.mkdtemp(prefix="dtchurn-data-")
    data = os.path.join(tmp, "digits.npz")
    subprocess.check_call([args.python, "-m", "dynatrain_runtime.examples.prepare_digits", "--out", data],
                          stdout=subprocess.DEVNULL)
    try:
        res = run(args, data)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print_table(res)
    if args.json:
        print(json.dumps(res))
    return 0 if res["ratio"] >= 0.90 else 1


if __name__ == "__main__":
    sys.exit(main())
