"""torchft 0.2.0's side of bench_resize: a Lighthouse and one replica group per "host", the same three changes.

Groups 0 (the survivor, as our master), 1 and 2 run ``torchft_digits.py`` on 127.0.31.1-3 under the
benchmark-only venv (``benchmarks/.venv-torchft``: torch==2.13.0, torchft==0.2.0; ``make_venv_torchft.sh``
makes it).  The Lighthouse is the anchor's (``shared/anchors/torchft.md``): ``--min_replicas 1
--quorum_tick_ms 100 --join_timeout_ms 10000 --heartbeat_timeout_ms 1000`` (a 1 s join timeout split the
quorum for good there), Manager and gloo timeouts 10 s.  Groups 0 and 1 train, then

* add: group 2 starts (a cold process: torchft has no warm spare) and heals from a live peer;
* remove: SIGTERM to group 1 (finish the step, ``manager.shutdown()``: torchft has no leave API);
* kill: SIGKILL of group 2, with torchft's stock ``DistributedDataParallel`` as a user writes it.

Figures per change from the groups' timeline (one JSON line per step, ``participants`` = the quorum's size):
the change -> the first step at the new size; the survivors' pause = group 0's longest gap between two
steps from the change to then, less one ordinary step (our formula: the old group's last step -> the new
group's first, less one step); steps redone = steps group 0 ran that did not commit (``should_commit``
false: the step is discarded and done again); the state copy (bytes, seconds) from the joiner's ``healed``
record; nothing goes through the file system.
"""
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
VENV = os.path.join(ROOT, "benchmarks", ".venv-torchft")
WORKER = os.path.join(HERE, "torchft_digits.py")
ADDRS = ("127.0.31.1", "127.0.31.2", "127.0.31.3")
LIGHTHOUSE_ARGS = ["--min_replicas", "1", "--quorum_tick_ms", "100", "--join_timeout_ms", "10000",
                   "--heartbeat_timeout_ms", "1000"]
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"}


def available():
    """'' when the venv has torchft, else why not (the table says it)."""
    python = os.path.join(VENV, "bin", "python")
    if not os.path.exists(python):
        return "no %s: run benchmarks/inplace/make_venv_torchft.sh" % VENV
    if not os.path.exists(os.path.join(VENV, "bin", "torchft_lighthouse")):
        return "no torchft_lighthouse in %s" % VENV
    return ""


def read_timeline(path):
    try:
        with open(path) as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


class TorchftJob(object):
    def __init__(self, data, hidden, step_sleep, port, workdir, timeout):
        self.dir = tempfile.mkdtemp(prefix="torchft-%d-" % hidden, dir=workdir)
        self.timeline = os.path.join(self.dir, "timeline.jsonl")
        self.data, self.hidden, self.step_sleep, self.port, self.timeout = data, hidden, step_sleep, port, timeout
        self.env = dict(os.environ, **ENV)
        self.procs = {}
        self.lighthouse = self.spawn("lighthouse", [os.path.join(VENV, "bin", "torchft_lighthouse")] + LIGHTHOUSE_ARGS
                                     + ["--bind", "127.0.0.1:%d" % port])

    def spawn(self, name, cmd):
        log = open(os.path.join(self.dir, name + ".log"), "ab")
        try:
            return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env)
        finally:
            log.close()

    def start(self, group):
        t0 = time.time()
        self.procs[group] = self.spawn("group-%d" % group, [
            os.path.join(VENV, "bin", "python"), WORKER, "--group", str(group), "--addr", ADDRS[group],
            "--store-port", str(self.port + 1 + group), "--lighthouse", "http://127.0.0.1:%d" % self.port,
            "--data", self.data, "--hidden", str(self.hidden), "--step-sleep", str(self.step_sleep),
            "--timeline", self.timeline])
        return t0

    def records(self):
        return read_timeline(self.timeline)

    def steps(self, group):
        return [r for r in self.records() if r["group"] == group and "step" in r]

    def wait(self, pred, what):
        deadline = time.time() + self.timeout
        while time.time() < deadline:
            value = pred()
            if value:
                return value
            if self.procs.get(0) is not None and self.procs[0].poll() is not None:
                raise RuntimeError("torchft: group 0 exited (%s) while waiting for %s"
                                   % (self.procs[0].returncode, what))
            time.sleep(0.1)
        raise RuntimeError("torchft: timed out after %.0f s waiting for %s" % (self.timeout, what))

    def first_at(self, participants, after):
        for rec in self.steps(0):
            if rec["t"] > after and rec["participants"] == participants:
                return rec
        return None

    def change(self, kind, t0, world):
        """The figures of one change made at ``t0`` that leaves ``world`` groups training."""
        before = [r for r in self.steps(0) if r["t"] <= t0]
        recent = before[-12:]
        gaps = [b["t"] - a["t"] for a, b in zip(recent, recent[1:])]
        step = statistics.median(gaps) if gaps else 0.0
        first = self.wait(lambda: self.first_at(world, t0), kind + " -> first step at %d groups" % world)
        during = [r for r in self.steps(0) if before and before[-1]["t"] <= r["t"] <= first["t"]]
        gap = max([b["t"] - a["t"] for a, b in zip(during, during[1:])] or [0.0])
        redone = sum(1 for a, b in zip(during, during[1:]) if b["step"] <= a["step"])
        healed = [r for r in self.records() if r.get("event") == "healed" and r["t"] > t0 and r["group"] != 0]
        row = {"total": first["t"] - t0, "pause": max(0.0, gap - step), "step": step, "recomputed": redone,
               "fs_mb": 0.0, "moved_mb": 0.0, "transfer": None, "rate": None, "own_pause": None}
        if kind == "add" and healed:
            row.update(moved_mb=healed[0]["bytes"] / 1e6, transfer=healed[0]["seconds"],
                       rate=healed[0]["bytes"] / 1e6 / max(1e-9, healed[0]["seconds"]))
        return row

    def settle(self, world, steps=3):
        """``steps`` more steps of group 0 at ``world`` groups (the next change starts from a steady job)."""
        self.wait(lambda: len([r for r in self.steps(0) if r["participants"] == world]) >= steps,
                  "%d steps at %d groups" % (steps, world))
        n = len(self.steps(0))
        self.wait(lambda: len(self.steps(0)) >= n + 8, "steady steps")

    def close(self):
        for proc in list(self.procs.values()) + [self.lighthouse]:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def run_job(data, hidden, step_sleep, port, workdir, timeout):
    """Groups 0 and 1, then add 2, remove 1, kill 2: ``{change: row}``, the job's checks and the first
    error (the changes measured before it are kept: a kill that crashes the survivor still shows the add)."""
    job = TorchftJob(data, hidden, step_sleep, port, workdir, timeout)
    out, checks, error = {}, {}, None
    try:
        job.start(0)
        job.start(1)
        job.settle(2)
        t0 = job.start(2)
        out["add"] = job.change("add", t0, 3)
        job.settle(3)
        t0 = time.time()
        job.procs[1].send_signal(signal.SIGTERM)
        out["remove"] = job.change("remove", t0, 2)
        checks["leave_exit_0"] = job.procs[1].wait(timeout) == 0
        job.settle(2)
        t0 = time.time()
        job.procs[2].kill()
        out["kill"] = job.change("kill", t0, 1)
        job.settle(1)
        checks["survivor_alive"] = job.procs[0].poll() is None
    except RuntimeError as exc:
        error = str(exc)
    finally:
        job.close()
    return out, checks, error, job.dir
