#!/usr/bin/env python3
"""Resize latency and throughput of the elastic launcher (local transport, all "hosts" on this machine).

Prints a table:
  * time from a host_worker edit to the first step with the new world size
    (median of N resizes alternating up and down), with --resize-at step (ours)
    and --resize-at epoch (DT's behaviour);
  * training throughput of the elastic launcher vs a plain MXNet dist_sync job
    (same hosts, same model, same global batch), as a ratio, over the whole run
    (``benchmarks/throughput/bench_throughput.py`` measures the steady state, for the
    MLP and the conv net, and reuses the runners here).

    python benchmarks/resize/bench_resize.py [--python .localcloud/node-venv/bin/python] [--resizes 6]

The Python must have MXNet and the dynatrain_runtime wheel (``make node-venv`` builds it).

Every "host" is a 127.0.0.x address on this machine; on a 2-core box the cold
start of MXNet processes competes with training, so absolute figures are
pessimistic compared with real multi-host clusters.
"""
import argparse
import json
import os
import select
import shutil
import statistics
import subprocess
import tempfile
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NODE_PYTHON = os.path.join(ROOT, ".localcloud", "node-venv", "bin", "python")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import project_python  # noqa: E402  (the script's venv, when typed with another python)
project_python.require("node", "dynatrain_runtime")
sys.path.insert(0, os.path.join(ROOT, "tests"))
from localjob import events, write_hosts  # noqa: E402  (the benchmarks use them as br.*)
from dynatrain_runtime.contract import shared_volume  # noqa: E402


class RunFailed(SystemExit):
    """One measured run failed (said why); a benchmark of several runs reports it and goes on."""


def wait(pred, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise SystemExit("benchmark: timed out waiting for %s" % what)


def wait_spares(efs, timeout=40.0):
    """Wait (bounded) until the launcher reports all its pre-warmed spares ready."""
    deadline = time.time() + timeout
    while time.time() < deadline and not spares_ready(efs):
        time.sleep(0.2)
    time.sleep(0.5)


def launcher(efs, py, data, resize_at, script_args, port_base, launcher_args=()):
    cmd = [py, "-m", "dynatrain_runtime.launcher", "--efs-mount", efs, "--python", py,
           "--script", "dynatrain_runtime.examples.train_digits", "--transport", "local", "--omp-threads", "1",
           "--resize-at", resize_at, "--port-base", str(port_base),
           "--status-interval", "0.5"] + list(launcher_args) + \
          ["--", "--data", data] + script_args
    log = open(os.path.join(efs, "launcher.out"), "wb")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def stop(proc):
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def write_warm_request(efs, ip):
    """What add_workers does before its host_worker edit (the host_worker module's ``warm``)."""
    shared_volume.write_warm_request(shared_volume.JobFiles(efs), ip, reason="benchmark")


def joiner_warm(efs, ip):
    return ip in ((shared_volume.read_json(shared_volume.JobFiles(efs).status) or {}).get("joiners_warm") or [])


def resize_latencies(py, data, resize_at, n, port_base, step_sleep, warm_request=False):
    efs = tempfile.mkdtemp(prefix="dtbench-")
    master, w1, w2 = "127.0.0.71", "127.0.0.72", "127.0.0.73"
    small, big = [w1, master], [w1, w2, master]
    write_hosts(efs, small)
    proc = launcher(efs, py, data, resize_at,
                    ["--epochs", "1000", "--step-sleep", str(step_sleep), "--checkpoint-every", "0"], port_base)
    out = []
    try:
        wait(lambda: any(e["event"] == "resize_end" or e["event"] == "epoch" for e in events(efs)), 120,
             "first epoch")
        wait_spares(efs)
        for i in range(n):
            target = big if i % 2 == 0 else small
            before = len([e for e in events(efs) if e["event"] == "resize_end"])
            if warm_request and target is big:
                write_warm_request(efs, w2)
                deadline = time.time() + 60          # (a runtime without warm requests: the edit goes on)
                while time.time() < deadline and not joiner_warm(efs, w2):
                    time.sleep(0.1)
            t0 = time.time()
            write_hosts(efs, target)
            end = wait(lambda: [e for e in events(efs) if e["event"] == "resize_end"][before:], 180,
                       "resize %d" % i)[0]
            out.append({"dir": "up" if target is big else "down", "edit_to_first_step_s": end["time"] - t0,
                        "stop_s": end.get("stop_s"), "restart_s": end.get("first_step_s"),
                        "phases": end.get("phases") or {}})
            wait_spares(efs)                            # pre-warmed processes are replenished after a resize
            warm = [e for e in events(efs) if e["event"] == "spares_warm" and e["generation"] == end["generation"]]
            out[-1]["rewarm_s"] = warm[0]["seconds"] if warm else None
    finally:
        stop(proc)
        if os.environ.get("DT_BENCH_KEEP"):
            print("benchmark: kept %s" % efs)
        else:
            shutil.rmtree(efs, ignore_errors=True)
    return out


def spares_ready(efs):
    """True once the launcher reports all its pre-warmed spares ready (status.json)."""
    st = shared_volume.read_json(shared_volume.JobFiles(efs).status) or {}
    return bool(st.get("spares_wanted")) and st.get("spares_ready", 0) >= st["spares_wanted"]


def epoch_rate(ep):
    """samples/s of the epochs after the first (warm) of rank 0's ``epoch`` records: between their ends."""
    return sum(e["samples"] for e in ep[1:]) / (ep[-1]["time"] - ep[0]["time"])


def elastic_throughput(py, data, port_base, epochs, script_args=(), launcher_args=(), steady=False):
    """Samples/s of a 2-worker run between epoch ends after the first one.

    ``steady``: only epochs that end after the launcher's spare processes are warm (their MXNet
    import competes for the CPU while they start; on one 2-core box that is all the "hosts").
    """
    efs = tempfile.mkdtemp(prefix="dtbench-")
    write_hosts(efs, ["127.0.0.82", "127.0.0.81"])
    proc = launcher(efs, py, data, "step", ["--epochs", str(epochs), "--checkpoint-every", "0"] + list(script_args),
                    port_base, launcher_args)
    try:
        warm_at = 0.0
        while steady and not warm_at and proc.poll() is None:
            if spares_ready(efs):
                warm_at = time.time()
            time.sleep(0.1)
        proc.wait(300)
        ep = [e for e in events(efs) if e["event"] == "epoch"]
        if steady:
            ep = [e for e in ep if e["time"] >= warm_at]
        if len(ep) < 3:
            with open(os.path.join(efs, "launcher.out"), "rb") as handle:
                tail = handle.read()[-3000:].decode("utf-8", "replace")
            raise RunFailed("benchmark: the elastic run logged %d epochs%s (raise --epochs); launcher log tail:\n%s"
                            % (len(ep), " after its spares were warm" if steady else "", tail))
        return epoch_rate(ep)
    finally:
        stop(proc)
        shutil.rmtree(efs, ignore_errors=True)


def first_result(pipes, deadline):
    """The first JSON line any of ``pipes`` prints before ``deadline``, read as it is printed; None if none."""
    open_pipes = list(pipes)
    while open_pipes and time.time() < deadline:
        ready, _w, _x = select.select(open_pipes, [], [], min(1.0, max(0.0, deadline - time.time())))
        for pipe in ready:
            line = pipe.readline()
            if not line:
                open_pipes.remove(pipe)
            elif line.startswith(b"{"):
                return json.loads(line)
    return None


def end_all(procs, grace=10.0):
    """Give ``procs`` ``grace`` s to exit, then kill the stragglers (ps-lite's shutdown can hang for ever)."""
    deadline = time.time() + grace
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def ps_env(port):
    """The environment of a 2-worker ``dist_sync`` job started by hand (scheduler and server on 127.0.0.91,
    one OMP and engine thread per process, as the launcher's ``--omp-threads 1`` gives its processes)."""
    return dict(os.environ, DMLC_PS_ROOT_URI="127.0.0.91", DMLC_PS_ROOT_PORT=str(port), DMLC_NUM_SERVER="1",
                DMLC_NUM_WORKER="2", OMP_NUM_THREADS="1", MXNET_CPU_WORKER_NTHREADS="1", PS_VERBOSE="0")


def start_ps(py, base):
    """The scheduler and the server of a job started by hand (``ps_env``): each a Python that imports MXNet."""
    return [subprocess.Popen([py, "-c", "import mxnet"], env=dict(base, DMLC_ROLE=r, DMLC_NODE_HOST="127.0.0.91"))
            for r in ("scheduler", "server")]


def plain_throughput(py, data, port, epochs, script_args=(), timeout=300):
    """samples/s of the plain dist_sync job: rank 0's result line is read as it is printed, then the
    processes get a few seconds to exit and are ended (a run that sat at exit once lost a whole table)."""
    base = ps_env(port)
    procs = start_ps(py, base)
    workers = [subprocess.Popen([py, os.path.join(HERE, "plain_digits.py"), "--data", data, "--epochs", str(epochs)]
                                + list(script_args),
                                env=dict(base, DMLC_ROLE="worker", DMLC_NODE_HOST=ip), stdout=subprocess.PIPE)
               for ip in ("127.0.0.92", "127.0.0.91")]
    try:
        result = first_result([w.stdout for w in workers], time.time() + timeout)
    finally:
        end_all(workers + procs)
    if result is None:
        raise RunFailed("benchmark: the plain dist_sync run printed no result within %d s" % timeout)
    return result["samples_per_s"]


def helper_throughput(py, data, port, epochs, script_args=(), timeout=300):
    """samples/s of the example under the helper API started as the plain job is, without the launcher: the
    scheduler and server ``import mxnet``, two workers running ``dynatrain_runtime.examples.train_digits`` with
    the ``DMLC_*`` and ``DT_*`` environment the launcher would give them (survivor recovery on), no wrappers,
    no spares, no stdin messages.  Epochs after the first, from rank 0's ``epoch`` records.  It tells the
    helper's own cost (against plain) from the launcher's (against the elastic run)."""
    efs = tempfile.mkdtemp(prefix="dtbench-helper-")
    base = ps_env(port)
    procs = start_ps(py, base)
    files = shared_volume.JobFiles(efs)
    workers = []
    try:
        for ip in ("127.0.0.92", "127.0.0.91"):
            env = dict(base, DMLC_ROLE="worker", DMLC_NODE_HOST=ip, EFS_MOUNT=efs, DT_WORKER_IP=ip, DT_ENGINE="mxnet",
                       DT_EVENTS=files.events, DT_CHECKPOINT_DIR=os.path.join(efs, "checkpoints"), DT_RESIZE_AT="step",
                       DT_MASTER_IP="127.0.0.91", DT_RECOVERY="survivor", PYTHONUNBUFFERED="1")
            workers.append(subprocess.Popen([py, "-m", "dynatrain_runtime.examples.train_digits", "--data", data,
                                             "--epochs", str(epochs), "--checkpoint-every", "0"] + list(script_args),
                                            env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.STDOUT))
        deadline = time.time() + timeout
        for w in workers:
            w.wait(max(1.0, deadline - time.time()))
        ep = [e for e in events(efs) if e["event"] == "epoch"]
        if len(ep) < 3:
            raise RunFailed("benchmark: the helper-alone run logged %d epochs (raise --epochs)" % len(ep))
        return epoch_rate(ep)
    except subprocess.TimeoutExpired as exc:
        raise RunFailed("benchmark: the helper-alone run did not end within %d s" % timeout) from exc
    finally:
        end_all(workers + procs, grace=2.0)
        shutil.rmtree(efs, ignore_errors=True)


def prepare_digits(python):
    """The digits data set in a fresh temporary directory (the example's own preparation); its path."""
    data = os.path.join(tempfile.mkdtemp(prefix="dtbench-data-"), "digits.npz")
    subprocess.check_call([python, "-m", "dynatrain_runtime.examples.prepare_digits", "--out", data],
                          stdout=subprocess.DEVNULL)
    return data


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--python", default=os.environ.get("DT_NODE_PYTHON") or NODE_PYTHON)
    ap.add_argument("--resizes", type=int, default=6, help="resizes per mode (alternating up/down), >= 5")
    ap.add_argument("--step-sleep", type=float, default=0.02)
    ap.add_argument("--epochs", type=int, default=20, help="epochs of the throughput runs")
    ap.add_argument("--json", action="store_true", help="also print the raw figures as JSON")
    ap.add_argument("--warm-request", action="store_true",
                    help="before growing, write the joiner's warm request and wait until its process is "
                         "warm (what add_workers does), so 'up' is a warm join")
    ap.add_argument("--step-only", action="store_true",
                    help="only the --resize-at step latencies (no epoch mode, no throughput runs)")
    args = ap.parse_args()
    data = prepare_digits(args.python)
    step = resize_latencies(args.python, data, "step", args.resizes, 19700, args.step_sleep, args.warm_request)
    epoch, el, plain = [], float("nan"), float("nan")
    if not args.step_only:
        epoch = resize_latencies(args.python, data, "epoch", args.resizes, 19800, args.step_sleep, args.warm_request)
        el = elastic_throughput(args.python, data, 19900, args.epochs)
        plain = plain_throughput(args.python, data, 19990, args.epochs)
    shutil.rmtree(os.path.dirname(data), ignore_errors=True)

    def med(rows, key="edit_to_first_step_s", d=None):
        vals = [r[key] for r in rows if (d is None or r["dir"] == d) and r.get(key) is not None]
        return statistics.median(vals) if vals else float("nan")

    print("")
    print("elastic launcher resize benchmark (local transport, %d cores, %d resizes per mode, 2<->3 workers, %s)"
          % (os.cpu_count(), args.resizes, "warm requests" if args.warm_request else "cold joins"))
    print("%-44s %10s %10s %10s" % ("metric", "all", "up", "down"))
    print("-" * 77)
    for name, rows in (("--resize-at step: edit -> first new step (s)", step),
                       ("--resize-at epoch: edit -> first new step (s)", epoch)):
        print("%-44s %10.2f %10.2f %10.2f" % (name, med(rows), med(rows, d="up"), med(rows, d="down")))
    print("%-44s %10.2f %10.2f %10.2f" % ("  step mode: stop part (s)", med(step, "stop_s"),
                                          med(step, "stop_s", "up"), med(step, "stop_s", "down")))
    print("%-44s %10.2f %10.2f %10.2f" % ("  step mode: restart part (s)", med(step, "restart_s"),
                                          med(step, "restart_s", "up"), med(step, "restart_s", "down")))
    print("%-44s %10.2f %10.2f %10.2f" % ("  first step -> spares re-warmed (s)", med(step, "rewarm_s"),
                                          med(step, "rewarm_s", "up"), med(step, "rewarm_s", "down")))
    for phase in ("kv", "attach", "loaded", "synced", "first_step"):
        rows = [dict(r, **{phase: r["phases"].get(phase)}) for r in step]
        print("%-44s %10.2f %10.2f %10.2f" % ("    restart: assignment -> %s (s)" % phase, med(rows, phase),
                                              med(rows, phase, "up"), med(rows, phase, "down")))
    print("-" * 77)
    print("%-44s %10.0f" % ("throughput elastic launcher (samples/s)", el))
    print("%-44s %10.0f" % ("throughput plain dist_sync (samples/s)", plain))
    print("%-44s %10.2f" % ("ratio elastic / plain", el / plain))
    if args.json:
        print(json.dumps({"step": step, "epoch": epoch, "elastic_sps": el, "plain_sps": plain}))


if __name__ == "__main__":
    main()
