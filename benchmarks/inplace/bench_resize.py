#!/usr/bin/env python3
"""In-place vs restart membership changes of the torch engine, at several state sizes, in one run.

For each state size (the digits MLP 64 -> H -> 10 with SGD momentum: parameters + momentum = 8 * (75 H + 10)
bytes; ``--hidden 1600`` ~1 MB, ``300000`` ~180 MB, ``1300000`` ~780 MB) and each resize mode
(``dt-launcher --engine torch --resize-mode in-place|restart --transport local``, every "host" a 127.0.x
address of this machine), one job makes three changes as add_workers/remove_workers make them:

* add: 2 -> 3 hosts (a warm request first, as add_workers writes it: the joiner's process is warm);
* remove: 3 -> 2 (a base host leaves by a host_worker edit);
* kill: 2 -> 1 (SIGKILL of the host's training processes).

Per change, from the launcher's ``resize_end`` record: the change -> the first step at the new size
(``total_s``), the survivors' pause = ``total_s - boundary_s - one step`` (the same formula for both modes:
the old group's last step -> the new group's first, less the step that would have run anyway), steps
recomputed, bytes through the shared file system (restart: the stop or recovery checkpoint written and read
back by every process of the next generation; in place: none), and in place the bytes moved peer to peer
and their rate.  Every job ends with SIGTERM (a checkpoint); its exactly-once audit and its DT log are
checked and printed with the table.

In the same run and table (``--systems``): torchft 0.2.0 as its users write it (``torchft_job.py``: a
Lighthouse, one replica group per host, a joiner healing from a live peer; in the benchmark-only venv
``benchmarks/.venv-torchft``, made by ``make_venv_torchft.sh``) and torchrun tuned restarting from its
checkpoint as benchmarks/torch runs it (``torchrun_job.py``).  ``--json`` keeps the rows, ``--plot`` draws
seconds against state size per system (``report.py``, which also merges several runs' JSON and prints their table).
``--scale 2,4,8,16,32`` measures the control plane instead: ours in place with N hosts (127.0.22.x, the
small model), an add N-1 -> N and a remove N -> N-1, the survivors' pause per host count.

    python benchmarks/inplace/bench_resize.py [--sizes 1600,300000] [--repeat 3]
        [--systems in-place,restart,torchft,torchrun-tuned] [--json F] [--plot F]
    python benchmarks/inplace/bench_resize.py --scale 2,4,8,16,32 [--repeat 1]

On a 2-core machine every "host" shares the cores: absolute figures are pessimistic.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import project_python  # noqa: E402  (the script's venv, when typed with another python)
project_python.require("controller", "dynatrain_runtime")
sys.path.insert(0, os.path.join(ROOT, "tests"))
from localjob import events, host_pids, log_lines, write_hosts  # noqa: E402

from dynatrain_runtime.contract.checkpoint import CheckpointStore, audit_check  # noqa: E402
from dynatrain_runtime.contract.shared_volume import JobFiles, read_status, write_warm_request  # noqa: E402

import report  # noqa: E402
from report import SYSTEMS, cell, med, print_table, state_mb  # noqa: E402
import torchft_job  # noqa: E402
import torchrun_job  # noqa: E402

NODE_PYTHON = os.environ.get("DT_NODE_PYTHON") or os.path.join(ROOT, ".localcloud", "node-venv", "bin", "python")
M, A, B = "127.0.21.1", "127.0.21.2", "127.0.21.3"
EXPECTED_LOG = [["ADDED", A], ["ADDED", M], ["ADDED", B], ["REMOVED", A], ["FAILED", B]]


def status(efs):
    """The job's status.json, read by the shared volume's contract ({} before the launcher writes it)."""
    return read_status(JobFiles(efs).status)


def wait(pred, timeout, what, proc):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        if proc.poll() is not None:
            raise RuntimeError("launcher exited (%s) while waiting for %s" % (proc.returncode, what))
        time.sleep(0.1)
    raise RuntimeError("timed out after %.0f s waiting for %s" % (timeout, what))


def step_time(efs, proc, span=3.0):
    """s per step now, from status.json's step count over ``span`` s (at least two steps)."""
    s0, t0 = status(efs).get("step") or 0, time.time()
    wait(lambda: (status(efs).get("step") or 0) >= s0 + 2 and time.time() - t0 >= span, 120 + 60 * span,
         "two steps", proc)
    s1, t1 = status(efs).get("step") or 0, time.time()
    return (t1 - t0) / max(1, s1 - s0)


def spares_warm(efs):
    s = status(efs)
    return s.get("state") == "running" and s.get("spares_wanted", 0) > 0 and \
        s.get("spares_ready", 0) - len(s.get("joiners_warm") or []) >= s["spares_wanted"]


def resize_ends(efs):
    return [e for e in events(efs) if e["event"] == "resize_end"]


def size_plan():
    """The state-size job: hosts A, M; add B (warmed first); remove A; kill B; the DT log it must leave."""
    return [A, M], B, (("add", [A, B, M]), ("remove", [B, M]), ("kill", None)), EXPECTED_LOG


def scale_plan(hosts):
    """The control plane at ``hosts`` hosts (127.0.22.x, the master last): N-1 train, add the Nth (warmed
    first), remove the first worker; the DT log it must leave."""
    names = ["127.0.22.%d" % (i + 2) for i in range(hosts - 1)] + ["127.0.22.1"]
    start, joiner = names[:-2] + names[-1:], names[-2]
    expected = [["ADDED", h] for h in start] + [["ADDED", joiner], ["REMOVED", names[0]]]
    return start, joiner, (("add", names), ("remove", names[1:])), expected


def run_job(args, data, hidden, mode, port_base, workdir, plan=None):
    """One job, its changes (``size_plan`` unless ``plan``); ``{change: figures}`` and the job's checks."""
    start, joiner, changes, expected = plan or size_plan()
    efs = tempfile.mkdtemp(prefix="bench-%s-%d-" % (mode, hidden), dir=workdir)
    write_hosts(efs, start)
    log = open(os.path.join(efs, "launcher.out"), "ab")
    cmd = [args.python, "-m", "dynatrain_runtime.launcher", "--efs-mount", efs, "--python", args.python,
           "--script", "dynatrain_runtime.examples.train_digits", "--transport", "local", "--omp-threads", "1",
           "--port-base", str(port_base), "--poll-interval", "0.2", "--engine", "torch", "--resize-mode", mode,
           "--status-interval", "0.3", "--stall-timeout", "120", "--regroup-timeout", "60", "--",
           "--data", data, "--audit-samples", "--epochs", "1000", "--hidden", str(hidden),
           "--checkpoint-every", "0", "--global-batch", "64", "--lr", "0.05", "--step-sleep", str(args.step_sleep)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=efs)
    out = {}
    try:
        write_warm_request(JobFiles(efs), joiner)
        wait(lambda: (status(efs).get("step") or 0) >= 3, args.timeout, "training at world %d" % len(start), proc)
        wait(lambda: spares_warm(efs), args.timeout, "warm spares", proc)
        for n, (change, hosts) in enumerate(changes):
            dt = step_time(efs, proc)
            t0 = time.time()
            if hosts is not None:
                write_hosts(efs, hosts)
            else:
                for pid in host_pids(efs, joiner, command_has=b"train_digits"):
                    os.kill(pid, signal.SIGKILL)
            end = wait(lambda: len(resize_ends(efs)) > n and resize_ends(efs)[n], args.timeout, change, proc)
            out[change] = dict(end, step_time=dt, seen_s=time.time() - t0)
            wait(lambda: (status(efs).get("step") or 0) >= end["first_step"] + 3, args.timeout,
                 "steps after " + change, proc)
            wait(lambda: spares_warm(efs), args.timeout, "warm spares", proc)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=args.timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    latest = CheckpointStore(os.path.join(efs, "checkpoints")).latest()
    meta = latest[1]
    steps = [r["step"] for r in meta["audit"]["steps"]]
    checks = {"audit_clean": audit_check(meta["audit"], meta["num_samples"]) == [] and steps == list(range(len(steps))),
              "log_exact": [l[1:3] for l in log_lines(efs)] == expected}
    if not args.keep:
        shutil.rmtree(efs, ignore_errors=True)
    return out, checks


def training_again(end):
    """Detection -> the new group trains: ``total_s`` less the first step's own time (the reporting worker's
    phases: its last phase before ``first_step``, the regroup's end, to ``first_step``).  None without phases."""
    phases = {k: v for k, v in (end.get("phases") or {}).items() if isinstance(v, (int, float))}
    if "first_step" not in phases:
        return None
    before = [v for k, v in phases.items() if k != "first_step" and v <= phases["first_step"]]
    return round(end["total_s"] - (phases["first_step"] - max(before, default=0.0)), 3)


def figures(end, mb, mode):
    """One change's row: (total, pause, recomputed, fs MB, moved MB, MB/s)."""
    # the old group's last step -> the new group's first, less the step itself (boundary_s: detection -> that
    # last step, negative for a kill); without it (an older launcher), from the detection: an upper bound
    pause = end["total_s"] - end.get("boundary_s", 0.0) - end["step_time"]
    world = end.get("world", 1)
    if mode == "restart":
        fs = mb * (1 + world)          # the stop/recovery checkpoint written once, read by every new process
    else:
        fs = 0.0
    moved = end.get("bytes_moved", 0) / 1e6
    return {"total": end["total_s"], "again": training_again(end), "pause": max(0.0, pause), "recomputed": end.get("recomputed_steps") or 0,
            "fs_mb": fs, "moved_mb": moved, "rate": end.get("transfer_mb_s"), "step": end["step_time"],
            "own_pause": end.get("pause_s"), "transfer": end.get("transfer_s")}


def measure(args, system, hidden, k, port, workdir, data):
    """One job of one system: ``({change: row}, checks or None, error or None)``."""
    mb = state_mb(hidden)
    if system in ("in-place", "restart"):
        try:
            out, check = run_job(args, data, hidden, system, port, workdir)
        except Exception as exc:  # noqa: BLE001 - the table says which run failed
            return {}, None, str(exc)
        return {c: figures(end, mb, system) for c, end in out.items()}, check, None
    if system == "torchft":
        why = torchft_job.available()
        if why:
            return {}, None, why
        out, check, error, _dir = torchft_job.run_job(data, hidden, args.step_sleep, port, workdir, args.timeout)
        return out, check, error
    if system == "torchrun-tuned":
        opts = torchrun_job.options(args.python, args.step_sleep, args.timeout, args.keep)
        out, error = torchrun_job.run_job(opts, data, hidden, mb, port, workdir)
        return out, None, error
    raise ValueError(system)


def scale(args, data, workdir):
    """Ours in place at each host count: the survivors' pause of an add and a remove (medians)."""
    rows, checks = {}, []
    for k, hosts in enumerate(int(h) for h in args.scale.split(",")):
        for rep in range(args.repeat):
            t0 = time.time()
            try:
                out, check = run_job(args, data, args.scale_hidden, "in-place", 25000 + 100 * (k * args.repeat + rep),
                                     workdir, plan=scale_plan(hosts))
            except Exception as exc:  # noqa: BLE001 - the table says which run failed
                print("run failed: %d hosts #%d: %s" % (hosts, rep, exc), flush=True)
                continue
            checks.append((hosts, rep, check))
            for change, end in out.items():
                rows.setdefault((hosts, change), []).append(figures(end, state_mb(args.scale_hidden), "in-place"))
            print("done: %d hosts #%d in %.0f s %s" % (hosts, rep, time.time() - t0, check), flush=True)
    print()
    print("| hosts | change | change -> first step at new size (s) | survivors' pause (s) | step (s) | n |")
    print("|---:|---|---:|---:|---:|---:|")
    for (hosts, change), got in sorted(rows.items()):
        print("| %d | %s %d -> %d | %s | %s | %s | %d |" % (
            hosts, change, hosts - 1 if change == "add" else hosts, hosts if change == "add" else hosts - 1,
            cell(med(got, "total"), "%.2f"), cell(med(got, "pause"), "%.2f"), cell(med(got, "step"), "%.2f"),
            len(got)))
    return checks


def stop_run(_signum, _frame):
    """SIGTERM: end the job in flight and print what was measured (the rows are in ``--json`` already)."""
    raise KeyboardInterrupt


def save(path, results):
    if path:
        with open(path + ".tmp", "w") as handle:
            json.dump([{"hidden": h, "mb": state_mb(h), "system": s, "change": c, "rows": r}
                       for (h, s, c), r in sorted(results.items())], handle, indent=1)
        os.replace(path + ".tmp", path)


def sizes(args, data, workdir, checks, results):
    """Every system at every size, one round after another (a run stopped early has each system at each
    size before it has a second round); ``--json`` rewritten after every job."""
    port = args.port_base
    for k in range(args.repeat):
        for hidden in [int(h) for h in args.sizes.split(",")]:
            for system in args.systems.split(","):
                port += 10
                rows, check, error = measure(args, system, hidden, k, port, workdir, data)
                if check is not None and system in ("in-place", "restart"):
                    checks.append((hidden, system, k, check))
                for change, row in rows.items():
                    results.setdefault((hidden, system, change), []).append(row)
                save(args.json, results)
                print("%s: hidden %d %s #%d %s%s" % ("failed" if error else "done", hidden, system, k, check or "",
                                                     (": " + error[:300]) if error else ""), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--python", default=NODE_PYTHON)
    ap.add_argument("--sizes", default="1600,300000",
                    help="hidden sizes (1600 ~1 MB, 300000 ~180 MB, 1300000 ~780 MB) [%(default)s]")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="[%(default)s]")
    ap.add_argument("--repeat", type=int, default=1, help="jobs per size and system; medians printed")
    ap.add_argument("--step-sleep", type=float, default=0.05)
    ap.add_argument("--timeout", type=float, default=300.0, help="bound on every wait, s")
    ap.add_argument("--json", help="write the rows here (report.py merges several)")
    ap.add_argument("--plot", help="draw seconds against state size per system here (PNG)")
    ap.add_argument("--scale", help="host counts: the control plane's scale instead (ours in place, small model)")
    ap.add_argument("--scale-hidden", type=int, default=128, help="the scale runs' hidden size [%(default)s]")
    ap.add_argument("--port-base", type=int, default=24000, help="jobs use ports from here up, 10 each [%(default)s]")
    ap.add_argument("--keep", action="store_true", help="keep the jobs' directories")
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="dt-bench-inplace-")
    data = os.path.join(workdir, "digits.npz")
    subprocess.check_call([args.python, "-m", "dynatrain_runtime.examples.prepare_digits", "--out", data],
                          stdout=subprocess.DEVNULL)
    signal.signal(signal.SIGTERM, stop_run)
    if args.scale:
        checks = scale(args, data, workdir)
    else:
        checks, results = [], {}
        try:
            sizes(args, data, workdir, checks, results)
        except KeyboardInterrupt:
            print("stopped: the table holds the jobs that ended", flush=True)
        finally:
            torchrun_job.bte.cleanup_all()
        print()
        print_table(results)
        if args.plot:
            report.plot([args.json] if args.json else [], args.plot, results=results)
    print()
    bad = [c for c in checks if not all(c[-1].values())]
    failed = (": failed " + repr(bad)) if bad else ""
    print("ours: audit clean and DT log exact in %d of %d runs%s" % (len(checks) - len(bad), len(checks), failed))
    shutil.rmtree(workdir, ignore_errors=True) if not args.keep else None
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
