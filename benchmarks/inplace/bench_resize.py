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

    python benchmarks/inplace/bench_resize.py [--sizes 1600,300000] [--repeat 3] [--modes in-place,restart]

On a 2-core machine every "host" shares the cores: absolute figures are pessimistic.
"""
import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from localjob import events, host_pids, log_lines, write_hosts  # noqa: E402

from dynatrain_runtime.contract.checkpoint import CheckpointStore, audit_check  # noqa: E402
from dynatrain_runtime.contract.shared_volume import JobFiles, read_status, write_warm_request  # noqa: E402

NODE_PYTHON = os.environ.get("DT_NODE_PYTHON") or os.path.join(ROOT, ".localcloud", "node-venv", "bin", "python")
M, A, B = "127.0.21.1", "127.0.21.2", "127.0.21.3"
CHANGES = ("add", "remove", "kill")
EXPECTED_LOG = [["ADDED", A], ["ADDED", M], ["ADDED", B], ["REMOVED", A], ["FAILED", B]]


def state_mb(hidden):
    return 8 * (75 * hidden + 10) / 1e6


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


def run_job(args, data, hidden, mode, port_base, workdir):
    """One job, three changes; ``{change: figures}`` and the job's checks."""
    efs = tempfile.mkdtemp(prefix="bench-%s-%d-" % (mode, hidden), dir=workdir)
    write_hosts(efs, [A, M])
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
        write_warm_request(JobFiles(efs), B)
        wait(lambda: (status(efs).get("step") or 0) >= 3, args.timeout, "training at world 2", proc)
        wait(lambda: spares_warm(efs), args.timeout, "warm spares", proc)
        for n, (change, hosts) in enumerate((("add", [A, B, M]), ("remove", [B, M]), ("kill", None))):
            dt = step_time(efs, proc)
            t0 = time.time()
            if hosts is not None:
                write_hosts(efs, hosts)
            else:
                for pid in host_pids(efs, B, command_has=b"train_digits"):
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
              "log_exact": [l[1:3] for l in log_lines(efs)] == EXPECTED_LOG}
    if not args.keep:
        shutil.rmtree(efs, ignore_errors=True)
    return out, checks


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
    return {"total": end["total_s"], "pause": max(0.0, pause), "recomputed": end.get("recomputed_steps") or 0,
            "fs_mb": fs, "moved_mb": moved, "rate": end.get("transfer_mb_s"), "step": end["step_time"],
            "own_pause": end.get("pause_s"), "transfer": end.get("transfer_s")}


def med(rows, key):
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def cell(value, fmt):
    return "-" if value is None else fmt % value


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--python", default=NODE_PYTHON)
    ap.add_argument("--sizes", default="1600,300000",
                    help="hidden sizes (1600 ~1 MB, 300000 ~180 MB, 1300000 ~780 MB) [%(default)s]")
    ap.add_argument("--modes", default="in-place,restart")
    ap.add_argument("--repeat", type=int, default=1, help="jobs per size and mode; medians printed")
    ap.add_argument("--step-sleep", type=float, default=0.05)
    ap.add_argument("--timeout", type=float, default=300.0, help="bound on every wait, s")
    ap.add_argument("--keep", action="store_true", help="keep the jobs' directories")
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="dt-bench-inplace-")
    data = os.path.join(workdir, "digits.npz")
    subprocess.check_call([args.python, "-m", "dynatrain_runtime.examples.prepare_digits", "--out", data],
                          stdout=subprocess.DEVNULL)
    results, checks, port = {}, [], 24000
    for hidden in [int(h) for h in args.sizes.split(",")]:
        for mode in args.modes.split(","):
            for k in range(args.repeat):
                port += 10
                try:
                    out, check = run_job(args, data, hidden, mode, port, workdir)
                except Exception as exc:  # noqa: BLE001 - the table says which run failed
                    print("run failed: hidden %d %s #%d: %s" % (hidden, mode, k, exc), flush=True)
                    continue
                checks.append((hidden, mode, k, check))
                for change, end in out.items():
                    results.setdefault((hidden, mode, change), []).append(figures(end, state_mb(hidden), mode))
                print("done: hidden %d %s #%d %s" % (hidden, mode, k, check), flush=True)
    print()
    print("| state | mode | change | change -> first step at new size (s) | survivors' pause (s) "
          "| in place: boundary -> first step - 1 step (s) | step (s) | steps redone | shared FS MB | peer MB "
          "| peer s | peer MB/s | n |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def order(kv):
        (hidden, mode, change), _rows = kv
        return hidden, CHANGES.index(change), mode

    for (hidden, mode, change), rows in sorted(results.items(), key=order):
        print("| %.1f MB (H %d) | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d |" % (
            state_mb(hidden), hidden, mode, change, cell(med(rows, "total"), "%.2f"), cell(med(rows, "pause"), "%.2f"),
            cell(med(rows, "own_pause"), "%.2f"), cell(med(rows, "step"), "%.2f"), cell(med(rows, "recomputed"), "%d"),
            cell(med(rows, "fs_mb"), "%.0f"), cell(med(rows, "moved_mb"), "%.1f"), cell(med(rows, "transfer"), "%.2f"),
            cell(med(rows, "rate"), "%.0f"), len(rows)))
    print()
    bad = [c for c in checks if not all(c[3].values())]
    failed = (": failed " + repr(bad)) if bad else ""
    print("audit clean and DT log exact in %d of %d runs%s" % (len(checks) - len(bad), len(checks), failed))
    shutil.rmtree(workdir, ignore_errors=True) if not args.keep else None
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
