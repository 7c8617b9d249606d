#!/usr/bin/env python3
"""The PyTorch engine side by side with torchrun's elastic agents and with plain DDP, in one run.

Prints, from one command (every "host" a 127.0.1.x address of this machine):

  (a) membership changes, 2 <-> 3 hosts, the digits MLP with a 50 ms sleep per step (medians of
      ``--repeat``): add a host, remove a host (graceful), kill a host (SIGKILL of everything the
      host runs): seconds from the change to the first step at the new size, seconds training was
      paused, steps recomputed.  OURS: ``python -m dynatrain_runtime.launcher --engine torch
      --transport local`` training the example (``dynatrain_runtime.examples.train_digits``,
      helper API), changes made as add_workers/remove_workers make them (host_worker edits),
      timings from the launcher's ``resize_end`` records in ``events.jsonl``.  TORCHRUN: one
      ``torchrun --nnodes=1:3 --rdzv-backend=c10d`` agent per host running ``torchrun_digits.py``
      (the same model as a plain DDP script written for torchrun: checkpoint every 20 steps, resume
      from the newest), with torchrun's defaults and tuned to its minimum timeouts; timings from the
      script's own step timeline.
  (b) steady throughput, elastic (the example under the launcher, 2 hosts) vs plain DDP
      (``torchrun_digits.py``, 2 processes, the same net, data, global batch and hosts), per model
      (the MLP and the example's small conv net): samples/s and the ratio (target >= 0.97, conv).
  (c) goodput under churn with the torch engine: ``benchmarks/churn/bench_churn.py --engine torch``
      run as a bounded subprocess, its figures in the summary.

    python benchmarks/torch/bench_torch_elastic.py [--python .localcloud/node-venv/bin/python] [--repeat 3]
    python benchmarks/torch/bench_torch_elastic.py --quick        # a short check of everything

Every run is bounded (``--event-timeout``, ``--start-timeout``, ``--churn-timeout``): one that fails
or hangs is ended, reported in its cell, and the other figures are still printed.  Every process
started here carries ``DTBENCH_TAG`` in its environment and is killed at the end of its run and at
exit, whatever happened.  On a 2-core machine every "host" shares the cores: absolute figures are
pessimistic; run it on a quiet machine for numbers to quote.
"""
import argparse
import atexit
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(os.path.dirname(BENCH), "scripts"))
import project_python  # noqa: E402  (the script's venv, when typed with another python)
project_python.require("node", "dynatrain_runtime")
sys.path.insert(0, os.path.join(BENCH, "resize"))
import bench_resize as br  # noqa: E402  (one home for driving the launcher locally)
from localjob import host_pids  # noqa: E402  (on sys.path through bench_resize)

TORCHRUN_SCRIPT = os.path.join(HERE, "torchrun_digits.py")
OURS_SCRIPT = "dynatrain_runtime.examples.train_digits"
ENGINE_ARGS = ["--engine", "torch"]           # the launcher's option (and the example's)
TAG = "dtbench-torch-%d-%s" % (os.getpid(), uuid.uuid4().hex[:8])
SYSTEMS = ("ours", "ours-torchrun-script", "torchrun-defaults", "torchrun-tuned")
CHANGES = ("add", "add_warm", "remove", "kill")
TUNED = ["--monitor-interval=0.05", "--rdzv-conf=last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"]
BASE_ENV = {"GLOO_SOCKET_IFNAME": "lo", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


class BenchError(Exception):
    """A run that failed or hung; its cell says why, the rest of the table goes on."""


# ---------------------------------------------------------------------------------------------- processes
def tagged_pids(key, value):
    """Processes whose environment has ``key=value`` (ours: they inherit it from the Popen here)."""
    needle = ("%s=%s" % (key, value)).encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as handle:
                env = handle.read().split(b"\0")
        except OSError:
            continue
        if needle in env:
            out.append(int(name))
    return out


def kill_pids(pids, sig=signal.SIGKILL):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def kill_tagged(key, value, timeout=10.0):
    """SIGKILL every process tagged ``key=value`` until none is left (bounded); the count killed."""
    deadline, n = time.time() + timeout, 0
    while time.time() < deadline:
        pids = tagged_pids(key, value)
        if not pids:
            break
        n += len(pids)
        kill_pids(pids)
        time.sleep(0.1)
    return n


def spawn(cmd, log_path, extra_env, job):
    """Start ``cmd`` in its own session, tagged for the clean-up, output to ``log_path``."""
    env = dict(os.environ, **BASE_ENV)
    env.update(extra_env)
    env.update(DTBENCH_TAG=TAG, DTBENCH_JOB=job)
    log = open(log_path, "ab")
    try:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    finally:
        log.close()


def end_job(job, procs, grace=15.0):
    """SIGTERM the job's own processes (graceful), then SIGKILL all it started; reap the Popens."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except OSError:
                pass
    deadline = time.time() + grace
    while time.time() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.1)
    kill_tagged("DTBENCH_JOB", job)
    for p in procs:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            pass


def cleanup_all(*_args):
    kill_tagged("DTBENCH_TAG", TAG)


def on_signal(signum, _frame):
    cleanup_all()
    os._exit(128 + signum)


def tail(path, n=1500):
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - n))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def wait(pred, timeout, what, proc=None, log=None):
    """Poll ``pred`` until it is true (its value is returned) or ``timeout`` s: BenchError."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            raise BenchError("%s: process exited with status %s%s"
                             % (what, proc.returncode, last_line(log)))
        time.sleep(0.05)
    raise BenchError("timed out after %.0f s waiting for %s%s" % (timeout, what, last_line(log)))


def last_line(log):
    if not log:
        return ""
    lines = [l for l in tail(log).splitlines() if l.strip()]
    return " (log: %s)" % lines[-1][-200:] if lines else ""


class Ports(object):
    """Distinct port ranges per job, below Linux's ephemeral range (32768+)."""

    def __init__(self, base):
        self.next = base

    def take(self, span):
        port, self.next = self.next, self.next + span
        if self.next > 32700:
            self.next = 21000
        return port


def listening(port, host="127.0.0.1"):
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------- ours
class OursJob(object):
    """The launcher (torch engine) training the example on 127.0.1.11 (master) + .12 (+ .13)."""
    MASTER, W1, W2 = "127.0.1.11", "127.0.1.12", "127.0.1.13"

    def __init__(self, args, data, port_base, world, workdir):
        self.args, self.efs, self.job = args, tempfile.mkdtemp(prefix="ours-", dir=workdir), uuid.uuid4().hex[:10]
        self.small, self.big = [self.W1, self.MASTER], [self.W1, self.W2, self.MASTER]
        br.write_hosts(self.efs, self.big if world == 3 else self.small)
        self.log = os.path.join(self.efs, "launcher.out")
        py = args.python
        cmd = [py, "-m", "dynatrain_runtime.launcher"] + ENGINE_ARGS + [
            "--efs-mount", self.efs, "--python", py, "--script", OURS_SCRIPT, "--transport", "local",
            "--omp-threads", "1", "--resize-at", "step", "--port-base", str(port_base), "--status-interval", "0.5",
            "--", "--data", data, "--epochs", "100000", "--step-sleep", str(args.step_sleep),
            "--checkpoint-every", str(args.checkpoint_every), "--eval-every", "0"] + ENGINE_ARGS
        self.proc = spawn(cmd, self.log, {}, self.job)
        self.world = world
        wait(lambda: self.status().get("state") == "running" and self.status().get("world_size") == world,
             args.start_timeout, "ours: first step at world %d" % world, self.proc, self.log)
        br.wait_spares(self.efs, timeout=args.start_timeout)

    def status(self):
        try:
            with open(os.path.join(self.efs, "status.json")) as handle:
                return json.load(handle)
        except (OSError, ValueError):
            return {}

    def ends(self):
        return [e for e in br.events(self.efs) if e["event"] == "resize_end"]

    def change(self, kind):
        a = self.args
        before = len(self.ends())
        if kind in ("add", "add_warm"):
            target = self.big
            if kind == "add_warm":                     # what add_workers does before its host_worker edit
                br.write_warm_request(self.efs, self.W2)
                wait(lambda: br.joiner_warm(self.efs, self.W2), a.start_timeout, "ours: joiner warm",
                     self.proc, self.log)
            t0 = time.time()
            br.write_hosts(self.efs, target)
        elif kind == "remove":
            t0 = time.time()
            br.write_hosts(self.efs, self.small)
        elif kind == "kill":
            pids = host_pids(self.efs, self.W2)
            if not pids:
                raise BenchError("ours: no process of %s to kill" % self.W2)
            t0 = time.time()
            kill_pids(pids)
        else:
            raise ValueError(kind)
        end = wait(lambda: self.ends()[before:], a.event_timeout, "ours: %s -> first step at the new size" % kind,
                   self.proc, self.log)[0]
        self.world = end.get("world")
        want = 3 if kind.startswith("add") else 2
        if self.world != want:
            raise BenchError("ours: %s ended at world %s, not %d" % (kind, self.world, want))
        if kind == "kill" and end.get("reason") != "failure":
            raise BenchError("ours: kill ended a resize of reason %r" % end.get("reason"))
        first = end["time"] - t0
        # paused: from the stop request at the step boundary (the old group's last step) to the new
        # group's first step; a kill stops training at once (the survivors wait in a collective)
        paused = first if kind == "kill" else (end.get("stop_s") or 0.0) + (end.get("first_step_s") or 0.0)
        res = {"first_s": first, "paused_s": paused, "recomputed": end.get("recomputed_steps", 0),
               "recovered_from": end.get("recovered_from"), "stop_s": end.get("stop_s"),
               "restart_s": end.get("first_step_s"), "warm_wait_s": end.get("warm_wait_s")}
        br.wait_spares(self.efs, timeout=a.start_timeout)      # the next change finds its spares warm
        return res

    def close(self):
        end_job(self.job, [self.proc], grace=30.0)
        if self.args.keep:
            print("kept %s" % self.efs, flush=True)
        else:
            shutil.rmtree(self.efs, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- torchrun
def timeline_change(job, kind, old, new, t0, log):
    """Wait for the first step at world ``new`` in ``job.timeline`` after ``t0``: the change's figures."""
    a = job.args
    first = wait(lambda: job.timeline.first_at(new, t0), a.event_timeout,
                 "%s -> first step at world %d" % (kind, new), job.proc_to_watch(), log)
    job.world = new
    before = [r for r in job.timeline.steps if r["t"] < first["t"]]
    last = before[-1] if before else first
    return {"first_s": first["t"] - t0, "paused_s": first["t"] - last["t"],
            "recomputed": max(0, max(r["step"] for r in before) - (first["step"] - 1)) if before else 0,
            "old_world": old}


class Timeline(object):
    """The torchrun script's rank-0 records (``--timeline``), read incrementally."""

    def __init__(self, path):
        self.path, self.pos, self.steps, self.starts = path, 0, [], []

    def read(self):
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.pos)
                data = handle.read()
        except OSError:
            return self
        end = data.rfind(b"\n") + 1
        self.pos += end
        for line in data[:end].decode("utf-8", "replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            (self.starts if rec.get("event") == "start" else self.steps).append(rec)
        return self

    def first_at(self, world, after):
        self.read()
        for rec in self.steps:
            if rec["t"] > after and rec["world"] == world:
                return rec
        return None


class TorchrunJob(object):
    """torchrun agents 127.0.1.21, .22 (, .23) on a c10d rendezvous; agent 1 hosts the store."""
    ADDRS = {1: "127.0.1.21", 2: "127.0.1.22", 3: "127.0.1.23"}

    def __init__(self, args, data, port, world, workdir, tuned):
        self.args, self.port, self.tuned = args, port, tuned
        self.dir = tempfile.mkdtemp(prefix="torchrun-%s-" % ("tuned" if tuned else "defaults"), dir=workdir)
        self.job = uuid.uuid4().hex[:10]
        self.timeline = Timeline(os.path.join(self.dir, "timeline.jsonl"))
        self.data, self.agents, self.procs, self.world = data, {}, [], None
        self.start_agent(1)
        wait(lambda: listening(port), args.start_timeout, "torchrun: agent 1's rendezvous store",
             self.agents[1], self.logpath(1))
        for n in range(2, world + 1):
            self.start_agent(n)
        t0 = time.time()
        wait(lambda: self.timeline.first_at(world, t0 - 60), args.start_timeout,
             "torchrun: first step at world %d" % world, self.agents[1], self.logpath(1))
        self.world = world

    def logpath(self, n):
        return os.path.join(self.dir, "agent-%d.log" % n)

    def command(self, n):
        a = self.args
        cmd = [a.python, "-m", "torch.distributed.run", "--nnodes=1:3", "--nproc-per-node=1", "--rdzv-backend=c10d",
               "--rdzv-endpoint=127.0.0.1:%d" % self.port, "--rdzv-id=%s" % self.job, "--max-restarts=20",
               "--local-addr=%s" % self.ADDRS[n]] + (TUNED if self.tuned else [])
        return cmd + [TORCHRUN_SCRIPT, "--data", self.data, "--epochs", "100000", "--step-sleep", str(a.step_sleep),
                      "--checkpoint-every", str(a.checkpoint_every), "--checkpoint-dir",
                      os.path.join(self.dir, "checkpoints"), "--timeline", self.timeline.path]

    def proc_to_watch(self):
        return self.agents[1]

    def start_agent(self, n):
        t0 = time.time()
        p = spawn(self.command(n), self.logpath(n), {"DTBENCH_AGENT": "%s-%d" % (self.job, n)}, self.job)
        self.agents[n] = p
        self.procs.append(p)
        return t0

    def change(self, kind):
        a = self.args
        if kind == "add":
            old, new = 2, 3
            t0 = self.start_agent(3)
        elif kind in ("remove", "kill"):
            old, new = 3, 2
            t0 = time.time()
            if kind == "remove":                           # graceful: the agent stops its worker and exits
                os.kill(self.agents[3].pid, signal.SIGTERM)
            else:                                          # the host is lost: its agent and its worker
                kill_pids(tagged_pids("DTBENCH_AGENT", "%s-3" % self.job))
        else:
            raise BenchError("torchrun has no %s" % kind)
        res = timeline_change(self, "torchrun: " + kind, old, new, t0, self.logpath(1))
        if kind in ("remove", "kill"):                     # the agent must be gone before the next change
            try:
                self.agents[3].wait(a.event_timeout)
            except subprocess.TimeoutExpired:
                kill_pids(tagged_pids("DTBENCH_AGENT", "%s-3" % self.job))
                self.agents[3].wait(5)
        return res

    def close(self):
        end_job(self.job, self.procs, grace=10.0)
        if self.args.keep:
            print("kept %s" % self.dir, flush=True)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


class OursScriptJob(OursJob):
    """Our launcher running torchrun's script unchanged (``--script-api torchrun``): the same hosts and
    teardown as ``OursJob``, measured as torchrun is (its rank-0 timeline), a change made as ours are."""

    def __init__(self, args, data, port_base, world, workdir):
        self.args, self.efs, self.job = args, tempfile.mkdtemp(prefix="ours-script-", dir=workdir), uuid.uuid4().hex[:10]
        self.small, self.big = [self.W1, self.MASTER], [self.W1, self.W2, self.MASTER]
        br.write_hosts(self.efs, self.big if world == 3 else self.small)
        self.log = os.path.join(self.efs, "launcher.out")
        self.timeline = Timeline(os.path.join(self.efs, "timeline.jsonl"))
        py = args.python
        cmd = [py, "-m", "dynatrain_runtime.launcher"] + ENGINE_ARGS + [
            "--script-api", "torchrun", "--efs-mount", self.efs, "--python", py, "--script", TORCHRUN_SCRIPT,
            "--transport", "local", "--omp-threads", "1", "--port-base", str(port_base), "--status-interval", "0.5",
            "--", "--data", data, "--epochs", "100000", "--step-sleep", str(args.step_sleep),
            "--checkpoint-every", str(args.checkpoint_every), "--checkpoint-dir", os.path.join(self.efs, "script-ckpt"),
            "--timeline", self.timeline.path]
        self.proc = spawn(cmd, self.log, {}, self.job)
        t0 = time.time()
        wait(lambda: self.timeline.first_at(world, t0 - 60), args.start_timeout,
             "ours-torchrun-script: first step at world %d" % world, self.proc, self.log)
        self.world = world

    def proc_to_watch(self):
        return self.proc

    def change(self, kind):
        if kind == "add":
            old, new = 2, 3
            t0 = time.time()
            br.write_hosts(self.efs, self.big)
        elif kind == "remove":
            old, new = 3, 2
            t0 = time.time()
            br.write_hosts(self.efs, self.small)
        elif kind == "kill":
            old, new = 3, 2
            pids = host_pids(self.efs, self.W2)
            if not pids:
                raise BenchError("ours-torchrun-script: no process of %s to kill" % self.W2)
            t0 = time.time()
            kill_pids(pids)
        else:
            raise BenchError("ours-torchrun-script has no %s" % kind)
        return timeline_change(self, "ours-torchrun-script: " + kind, old, new, t0, self.log)


# ---------------------------------------------------------------------------------------------- (a)
def plan(system):
    """(change, world before) in order: 2 -> 3 -> 2 -> 3 -> 2; the second add is timed for ours only
    (with the warm request add_workers writes; a torchrun script has no warm process)."""
    second = "add_warm" if system == "ours" else "readd"
    return [("add", 2), ("remove", 3), (second, 2), ("kill", 3)]


def run_changes(args, system, data, ports, workdir, rng):
    """One job of ``system`` through the plan; a change that fails ends the job, the next starts a fresh one."""
    results, job = {}, None
    for kind, pre in plan(system):
        try:
            if job is None:
                if system == "ours":
                    job = OursJob(args, data, ports.take(500), pre, workdir)
                elif system == "ours-torchrun-script":
                    job = OursScriptJob(args, data, ports.take(500), pre, workdir)
                else:
                    job = TorchrunJob(args, data, ports.take(1), pre, workdir, tuned=system == "torchrun-tuned")
            if job.world != pre:
                raise BenchError("%s: at world %s, not %d" % (system, job.world, pre))
            time.sleep(args.settle + rng.uniform(0, args.checkpoint_every * (args.step_sleep + 0.005)))
            res = job.change("add" if kind == "readd" else kind)
            if kind != "readd":
                results[kind] = res
            print("  %-18s %-9s first step %6.2f s  paused %6.2f s  recomputed %3d" % (
                system, kind, res["first_s"], res["paused_s"], res["recomputed"]), flush=True)
        except BenchError as exc:
            if kind != "readd":
                results[kind] = {"error": str(exc)}
            print("  %-18s %-9s FAILED: %s" % (system, kind, exc), flush=True)
            if job is not None:
                job.close()
                job = None
        except Exception as exc:                       # a bug or an OS error: report it, keep the table
            results[kind] = {"error": "%s: %s" % (type(exc).__name__, exc)}
            print("  %-18s %-9s ERROR: %s: %s" % (system, kind, type(exc).__name__, exc), flush=True)
            if job is not None:
                job.close()
                job = None
    if job is not None:
        job.close()
    return results


# ---------------------------------------------------------------------------------------------- (b)
def ours_throughput(args, data, model, epochs, port_base, workdir):
    """Samples/s of the example under the launcher, 2 hosts, epochs ending after the spares are warm."""
    efs = tempfile.mkdtemp(prefix="ours-tp-", dir=workdir)
    job = uuid.uuid4().hex[:10]
    br.write_hosts(efs, ["127.0.1.32", "127.0.1.31"])
    log = os.path.join(efs, "launcher.out")
    py = args.python
    cmd = [py, "-m", "dynatrain_runtime.launcher"] + ENGINE_ARGS + [
        "--efs-mount", efs, "--python", py, "--script", OURS_SCRIPT, "--transport", "local", "--omp-threads", "1",
        "--resize-at", "step", "--port-base", str(port_base), "--status-interval", "0.5",
        "--", "--data", data, "--epochs", str(epochs), "--checkpoint-every", "0", "--model", model,
        "--eval-every", "0"] + ENGINE_ARGS
    proc = spawn(cmd, log, {}, job)
    try:
        try:
            warm_at = wait(lambda: br.spares_ready(efs) and time.time(), args.start_timeout, "ours: spares warm",
                           proc, log)
        except BenchError as exc:
            if proc.poll() == 0:
                raise BenchError("ours: %d epochs of %s ended before the spare processes were warm (raise --epochs)"
                                 % (epochs, model))
            raise exc
        try:
            proc.wait(args.run_timeout)
        except subprocess.TimeoutExpired:
            raise BenchError("ours: %d epochs of %s did not end within %.0f s" % (epochs, model, args.run_timeout))
        ep = [e for e in br.events(efs) if e["event"] == "epoch" and e["time"] >= warm_at]
        if len(ep) < 3:
            raise BenchError("ours: %d epochs after the spares were warm (raise --epochs)%s"
                             % (len(ep), last_line(log)))
        return br.epoch_rate(ep)
    finally:
        end_job(job, [proc])
        shutil.rmtree(efs, ignore_errors=True)


def plain_throughput(args, data, model, epochs, port, workdir):
    """Samples/s of torchrun_digits.py as 2 plain DDP processes (env://), epochs 2.. on rank 0's clock."""
    job = uuid.uuid4().hex[:10]
    d = tempfile.mkdtemp(prefix="plain-", dir=workdir)
    procs = []
    for rank, ip in enumerate(("127.0.1.41", "127.0.1.42")):
        env = {"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.1.41", "MASTER_PORT": str(port), "DTBENCH_HOST": ip}
        procs.append(spawn([args.python, TORCHRUN_SCRIPT, "--data", data, "--epochs", str(epochs), "--model", model,
                            "--checkpoint-every", "0"], os.path.join(d, "rank%d.log" % rank), env, job))
    try:
        deadline = time.time() + args.run_timeout
        for p in procs:
            try:
                p.wait(max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                raise BenchError("plain DDP: %d epochs of %s did not end within %.0f s"
                                 % (epochs, model, args.run_timeout))
        out = [json.loads(l) for l in tail(os.path.join(d, "rank0.log"), 4000).splitlines() if l.startswith("{")]
        if not out or any(p.returncode for p in procs):
            codes = [p.returncode for p in procs]
            raise BenchError("plain DDP: no result (status %s)%s"
                             % (codes, last_line(os.path.join(d, "rank0.log"))))
        return out[-1]["samples_per_s"]
    finally:
        end_job(job, procs)
        shutil.rmtree(d, ignore_errors=True)


def run_throughput(args, data, ports, workdir):
    res = {}
    for model, epochs in zip(args.models, args.epochs):
        ours, plain, errors = [], [], []
        for i in range(args.repeat):
            for kind in ("ours", "plain"):
                try:
                    if kind == "ours":
                        v = ours_throughput(args, data, model, epochs, ports.take(500), workdir)
                        ours.append(v)
                    else:
                        v = plain_throughput(args, data, model, epochs, ports.take(1), workdir)
                        plain.append(v)
                    print("  throughput %-5s %-5s run %d: %.0f samples/s" % (model, kind, i + 1, v), flush=True)
                except BenchError as exc:
                    errors.append("%s: %s" % (kind, exc))
                    print("  throughput %-5s %-5s run %d FAILED: %s" % (model, kind, i + 1, exc), flush=True)
        res[model] = {"epochs": epochs, "ours_runs": ours, "plain_runs": plain, "errors": errors,
                      "ours": statistics.median(ours) if ours else None,
                      "plain": statistics.median(plain) if plain else None}
    return res


# ---------------------------------------------------------------------------------------------- (c)
def run_churn(args):
    """bench_churn.py --engine torch as a bounded subprocess; its JSON figures (or the failure)."""
    cmd = [args.python, os.path.join(BENCH, "churn", "bench_churn.py"), "--engine", "torch", "--json",
           "--python", args.python, "--duration", str(args.churn_duration), "--port-base", "27000"]
    if args.quick:
        cmd.append("--quick")
    job = uuid.uuid4().hex[:10]
    log = os.path.join(tempfile.gettempdir(), "dtbench-churn-%s.log" % job)
    proc = spawn(cmd, log, {}, job)
    try:
        try:
            proc.wait(args.churn_timeout)
        except subprocess.TimeoutExpired:
            raise BenchError("churn benchmark did not end within %.0f s%s" % (args.churn_timeout, last_line(log)))
        res = [json.loads(l) for l in tail(log, 20000).splitlines() if l.startswith("{")]
        if not res:
            raise BenchError("churn benchmark: no result (status %s)%s" % (proc.returncode, last_line(log)))
        return res[-1]
    finally:
        end_job(job, [proc], grace=30.0)
        if not args.keep:
            try:
                os.unlink(log)
            except OSError:
                pass


def same_nets(python):
    """None when torchrun_digits.py's nets are the example's (``torch_digits.build_torch_net``), else why not."""
    code = ("import sys, torch; sys.path.insert(0, %r); import torchrun_digits as t\n"
            "from dynatrain_runtime.examples.torch_digits import build_torch_net as b\n"
            "for m in t.MODELS:\n"
            "    mine = [(k, tuple(v.shape)) for k, v in t.build_net(m).state_dict().items()]\n"
            "    theirs = [(k, tuple(v.shape)) for k, v in b(m).state_dict().items()]\n"
            "    assert mine == theirs, (m, mine, theirs)\n"
            "    assert str(t.build_net(m)) == str(b(m)), m\n" % HERE)
    try:
        out = subprocess.run([python, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120,
                             check=False)
    except subprocess.TimeoutExpired:
        return "the check timed out"
    return None if out.returncode == 0 else out.stdout.decode("utf-8", "replace").strip().splitlines()[-1]


# ---------------------------------------------------------------------------------------------- table
def med(runs, key):
    vals = [r[key] for r in runs if "error" not in r and r.get(key) is not None]
    return statistics.median(vals) if vals else None


def cell(v, fmt):
    return "n/a" if v is None else fmt % v


def print_tables(args, changes, throughput, churn):
    systems = [s for s in SYSTEMS if s in args.systems]
    if changes:
        print_changes(args, systems, changes)
    print_throughput(args, throughput)
    print_churn(args, churn)


def print_changes(args, systems, changes):
    print("")
    print("## (a) membership change -> first step at the new size (2 <-> 3 hosts on 127.0.1.x, %d cores, "
          "MLP, %.0f ms sleep/step, checkpoint every %d steps; medians of %d)"
          % (os.cpu_count(), args.step_sleep * 1000, args.checkpoint_every, args.repeat))
    print("")
    head = "| change | " + " | ".join("%s: first step s | paused s | recomputed" % s for s in systems) + " | ok runs |"
    print(head)
    print("|---|" + "---:|---:|---:|" * len(systems) + "---|")
    names = {"add": "add a host (its process starts at the change)",
             "add_warm": "add a host (ours: warm request first, as add_workers does)",
             "remove": "remove a host (graceful)", "kill": "kill a host (SIGKILL)"}
    for kind in CHANGES:
        cells, oks = [], []
        for s in systems:
            runs = [r[kind] for r in changes.get(s, []) if kind in r]
            if not runs:
                cells.append("- | - | -")
                continue
            ok = [r for r in runs if "error" not in r]
            oks.append("%s %d/%d" % (s.split("-")[-1] if s != "ours" else "ours", len(ok), len(runs)))
            rec = med(ok, "recomputed")
            cells.append("%s | %s | %s" % (cell(med(ok, "first_s"), "%.2f"), cell(med(ok, "paused_s"), "%.2f"),
                                           cell(rec, "%.0f")))
        print("| %s | %s | %s |" % (names[kind], " | ".join(cells), ", ".join(oks)))
    print("")
    print("targets (ours): add and remove <= 0.5 s, kill <= 1 s, 0 steps recomputed.  torchrun's add counts "
          "from its agent's start; ours from the host_worker edit (the new host's process starts then and imports "
          "torch while the job trains on); with the warm request add_workers writes, the edit finds it ready.")
    print("anchor (/work/shared/anchors/torchrun.md, medians of 3, torchrun defaults / tuned): add 7.7 / 7.9 s "
          "(paused 5.8 / 6.0 s, 11 steps recomputed), kill 45.2 / 6.7 s, graceful removal 47.9 / 6.8 s.")
    failures = [(s, k, r[k]["error"]) for s in systems for r in changes.get(s, []) for k in r if "error" in r[k]]
    for s, k, e in failures:
        print("  failed: %s %s: %s" % (s, k, e))


def print_throughput(args, throughput):
    if throughput:
        print("")
        print("## (b) elastic (torch engine) vs plain DDP throughput (2 hosts, global batch 64, medians of %d)"
              % args.repeat)
        print("")
        print("| model | epochs | elastic samples/s | plain DDP samples/s | ratio | target |")
        print("|---|---:|---:|---:|---:|---:|")
        for model, r in throughput.items():
            ratio = r["ours"] / r["plain"] if r["ours"] and r["plain"] else None
            target = ">= 0.97" if model == "conv" else "-"
            cells = (model, r["epochs"], cell(r["ours"], "%.0f"), cell(r["plain"], "%.0f"), cell(ratio, "%.3f"), target)
            print("| %s | %d | %s | %s | %s | %s |" % cells)
            for e in r["errors"]:
                print("  failed: %s %s" % (model, e))


def print_churn(args, churn):
    if churn is not None:
        print("")
        print("## (c) goodput under churn, torch engine (benchmarks/churn/bench_churn.py --engine torch%s)"
              % (" --quick" if args.quick else ""))
        print("")
        if "error" in churn:
            print("failed: %s" % churn["error"])
        else:
            def pm(vals):
                return "%.2f / %.2f (n=%d)" % (statistics.median(vals), max(vals), len(vals)) if vals else "n/a"
            a = churn.get("actions", {})
            print("| metric | value |")
            print("|---|---:|")
            print("| churn: duration s, drains, kills, re-adds | %.0f, %d, %d, %d |"
                  % (churn["duration_s"], a.get("drain", 0), a.get("kill", 0), a.get("add", 0)))
            print("| useful samples/s under churn | %.0f |" % churn["useful_sps"])
            print("| steady samples/s at the same world sizes (mean world %.2f) | %.0f |"
                  % (churn["mean_world"], churn["reference_sps"]))
            print("| **goodput ratio** (target >= 0.90) | **%.3f** |" % churn["ratio"])
            print("| steps recomputed (total) | %d |" % churn["recomputed_steps"])
            print("| spot notice -> drained, s (p50 / max) | %s |" % pm(churn["drained_s"]))
            print("| failure -> resumed, s (p50 / max) | %s |" % pm(churn["resumed_s"]))
            print("| add -> joined, s (p50 / max) | %s |" % pm(churn["joined_s"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--python", default=os.environ.get("DT_NODE_PYTHON") or br.NODE_PYTHON,
                    help="Python with torch==2.13.0 and dynatrain_runtime (runs every job) [%(default)s]")
    ap.add_argument("--repeat", type=int, default=3, help="runs per system / model; medians are printed")
    ap.add_argument("--parts", default="changes,throughput,churn", help="which of changes,throughput,churn")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="for (a): which of " + ",".join(SYSTEMS))
    ap.add_argument("--step-sleep", type=float, default=0.05, help="(a) sleep per step, s [%(default)s]")
    ap.add_argument("--checkpoint-every", type=int, default=20, help="(a) steps between checkpoints")
    ap.add_argument("--settle", type=float, default=3.0,
                    help="(a) steady training before each change, s (plus up to one checkpoint period, random)")
    ap.add_argument("--models", default="mlp,conv", help="(b) models")
    ap.add_argument("--epochs", default="300,60", help="(b) epochs per run, per model of --models")
    ap.add_argument("--churn-duration", type=float, default=300.0, help="(c) churn phase, s [%(default)s]")
    ap.add_argument("--start-timeout", type=float, default=180.0, help="bound: a job's start, s")
    ap.add_argument("--event-timeout", type=float, default=150.0, help="bound: one change, s")
    ap.add_argument("--run-timeout", type=float, default=400.0, help="bound: one throughput run, s")
    ap.add_argument("--churn-timeout", type=float, default=None, help="bound: the churn run, s [duration + 600]")
    ap.add_argument("--quick", action="store_true",
                    help="a short check: --repeat 1, fewer epochs, a 60 s churn (figures not for quoting)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the job directories (logs, events, timelines)")
    ap.add_argument("--json", action="store_true", help="also print the raw figures as JSON")
    args = ap.parse_args()
    if args.quick:
        args.repeat = 1
        args.epochs = "100,20"
        args.churn_duration = min(args.churn_duration, 60.0)
    args.parts = set(args.parts.split(","))
    args.systems = args.systems.split(",")
    args.models = args.models.split(",")
    args.epochs = [int(e) for e in str(args.epochs).split(",")]
    if len(args.epochs) != len(args.models) or min(args.epochs) < 4:
        ap.error("--epochs needs one count >= 4 per model of --models")
    args.churn_timeout = args.churn_timeout or args.churn_duration + 600.0
    bad = set(args.systems) - set(SYSTEMS)
    if bad or args.parts - {"changes", "throughput", "churn"}:
        ap.error("unknown system or part: %s" % ", ".join(sorted(bad | (args.parts - {"changes", "throughput",
                                                                                      "churn"}))))
    atexit.register(cleanup_all)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    workdir = tempfile.mkdtemp(prefix="dtbench-torch-")
    data = os.path.join(workdir, "digits.npz")
    subprocess.check_call([args.python, "-m", "dynatrain_runtime.examples.prepare_digits", "--out", data],
                          stdout=subprocess.DEVNULL, timeout=120)
    differs = same_nets(args.python)
    if differs:
        print("WARNING: torchrun_digits.py's nets are not the example's: %s" % differs, flush=True)
    rng, ports = random.Random(args.seed), Ports(21000)
    changes, throughput, churn = {}, {}, None
    t_start = time.time()
    try:
        if "changes" in args.parts:
            print("(a) membership changes", flush=True)
            for i in range(args.repeat):                  # systems interleaved: load hits them alike
                for s in args.systems:
                    changes.setdefault(s, []).append(run_changes(args, s, data, ports, workdir, rng))
        if "throughput" in args.parts:
            print("(b) throughput", flush=True)
            throughput = run_throughput(args, data, ports, workdir)
        if "churn" in args.parts:
            print("(c) churn (%.0f s)" % args.churn_duration, flush=True)
            try:
                churn = run_churn(args)
            except BenchError as exc:
                churn = {"error": str(exc)}
    finally:
        cleanup_all()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print("\ntorch engine benchmark: %.0f s in all, python %s" % (time.time() - t_start, args.python))
    print_tables(args, changes, throughput, churn)
    if args.json:
        print(json.dumps({"changes": changes, "throughput": throughput, "churn": churn}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
