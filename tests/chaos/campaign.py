"""Fault-injection campaign of the node runtime (issue 24): inject, let the product recover, check invariants.

    .localcloud/node-venv/bin/python tests/chaos/campaign.py                 # every fault, a table
    .localcloud/node-venv/bin/python tests/chaos/campaign.py --quick         # the subset `make test` runs
    .localcloud/node-venv/bin/python tests/chaos/campaign.py --faults torn-log-line,clock-step --seed 7
    .localcloud/node-venv/bin/python tests/chaos/campaign.py --list

Each fault runs one real job: the launcher (``--transport local``: three "hosts" on 127.x
addresses of this machine, the master last) trains the digits MLP (``--audit-samples``,
checkpoints every few steps) on a temporary shared directory.  The campaign supervises the
launcher as its systemd unit does (``Restart=on-failure``, ``RestartSec=2``,
``RestartPreventExitStatus=1 2``, ``StartLimitBurst=5`` in 600 s): restarted when it is killed
or exits with another status, never after 0, 1 or 2.  It injects the fault at a moment drawn
from ``--seed`` (printed: ``--seed S --faults NAME`` replays it), watching ``status.json``,
``events.jsonl``, the checkpoints and the markers of the fault hooks (``shim/sitecustomize.py``,
loaded into every process of the job) to time it, lets the product recover, then checks:

* the job finishes: the launcher exits 0 with ``status.json`` "finished", within the run's bound;
* exactly once: ``audit_check`` of the final checkpoint is clean, its steps are 0..N-1 with every
  epoch complete (data lost = samples never used + steps missing: must be 0);
* validation accuracy >= 0.9;
* ``host_worker_log`` parses (every line ``SEQ EVENT IP NS``, none torn; a line the campaign wrote
  as "malformed" may stay), SEQ is contiguous from 0, and its events are exactly the expected ones
  (no spurious ``FAILED``); ``host_worker`` ends with the expected membership;
* at every moment (sampled every 0.25 s) at least one checkpoint verifies once the first was
  written (meta.json parses and names its step; its files are unchanged since first seen, and
  match the digests of meta.json when it carries them); no ``.tmp-ckpt-*``/``.trash-*`` left at
  the end; the job never restarts from step 0 while a checkpoint exists;
* the launcher never stops for good (exit 1 or 2, or systemd's start limit);
* orphans: no process of a launcher incarnation lives 10 s after that launcher ended (the
  processes carry ``DT_CHAOS_RUN``/``DT_CHAOS_INC`` in their environment);
* ``events.jsonl`` parses.

Columns: ``recover_s`` = injection -> the first ``status.json`` of a live launcher incarnation
that reports a step past the highest one reported before the fault's action ended, with the
expected membership (and a newer generation when the fault caused one), counted after the
launcher's last crash and only for a run that finished; ``recomputed`` = completed steps done again
(the highest step seen before the next generation minus that generation's resume step, or the
launcher's own ``resize_end.recomputed_steps``, whichever is larger; the steps reported in the
last 0.25 s before a kill may be missed).

The hostile-node rows (issue 40) play a compromised training process on a worker: it plants links
on the volume (at ``events.jsonl``, ``logs/launcher.log``, ``results/final.json``, in a checkpoint)
aimed at ``outside/`` (the master's home: ``outside/id_ed25519`` is "its key"), writes requests
with shell strings, a broken launcher state, 300 warm requests, ``@@DT`` lines with wrong types, a
forged ``meta.json`` without digests, or moves the checkpoints away (start over) under the
checkpoint sync (``dt-checkpoint-sync`` against a moto S3 server of the controller venv,
``DT_CHAOS_MOTO_PYTHON``).  Their invariant, checked for every row: nothing outside the volume's drop
boxes changed on the master's side -- ``outside/`` is byte for byte as before and no file appeared
beside the volume, the launcher keeps training (no restart but the ones the fault causes), the
``host_worker_log`` exact, no generation resumes from a path outside ``checkpoints/``, and with the sync:
no object in S3 holds the key, ``LATEST.json`` names the run's final checkpoint, the sync's failures
and recoveries are events.  The checkpoint-writer rows crash the background writer mid-write (the
previous checkpoint must stay the newest) and slow it (training goes on, the checkpoint that came due
is ``checkpoint_skipped``).

Out of scope here (they need the local cloud and Ansible): SIGINT of ``add_workers`` (after the
launch, during configure, during the join) and of ``remove_workers``, two ``add_workers`` at
once, ``reconcile`` during an add.  The harness needs only the standard library and
``dynatrain_runtime`` (``--code tree`` runs the working tree's runtime instead of the installed one).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHIM = os.path.join(HERE, "shim")
DEFAULT_NODE_PYTHON = (os.environ.get("DT_NODE_PYTHON")
                       or os.path.join(ROOT, ".localcloud", "node-venv", "bin", "python"))
MOTO_PYTHON = os.environ.get("DT_CHAOS_MOTO_PYTHON") or os.path.join(ROOT, ".venv", "bin", "python")
SYNC_BUCKET, SYNC_PREFIX = "dt-chaos", "c1/job1/"
MASTER_KEY = b"-----BEGIN OPENSSH PRIVATE KEY-----\nthe master's node-to-node key (chaos)\n"
WORKDIR_ENTRIES = {"efs", "chaos", "outside", "launcher.out", "sync.out", "moto.out"}

A, B, M = "127.0.0.81", "127.0.0.82", "127.0.0.83"       # M: the master (last in host_worker)
HOSTS = [A, B, M]

RESTART_PREVENT = (1, 2)          # the unit's RestartPreventExitStatus
START_LIMIT_BURST, START_LIMIT_WINDOW = 5, 600.0
ORPHAN_GRACE = 10.0               # s a dead launcher's processes may take to end (the wrapper: 3 + 2 s)
LOG_LINE = re.compile(r"^(\d+) (ADDED|REMOVED|FAILED) (\d{1,3}(?:\.\d{1,3}){3}) (\d+)$")


class JobConfig(object):
    """The training job every fault runs (the digits MLP, audit mode)."""

    def __init__(self, epochs=5, step_sleep=0.1, checkpoint_every=10, global_batch=64, lr=0.1, train_seed=42,
                 timeout=300.0, restart_sec=2.0):
        self.epochs, self.step_sleep, self.checkpoint_every = epochs, step_sleep, checkpoint_every
        self.global_batch, self.lr, self.train_seed = global_batch, lr, train_seed
        self.timeout, self.restart_sec = timeout, restart_sec

    def script_args(self, data):
        return ["--data", data, "--audit-samples", "--epochs", str(self.epochs), "--seed", str(self.train_seed),
                "--global-batch", str(self.global_batch), "--lr", str(self.lr), "--step-sleep", str(self.step_sleep),
                "--checkpoint-every", str(self.checkpoint_every)]

    def total_steps(self, num_train=1438):
        return self.epochs * -(-num_train // self.global_batch)


def _runtime():
    """The product modules the harness uses (imported late: ``--code tree`` puts the tree first)."""
    return (importlib.import_module("dynatrain_runtime.contract.shared_volume"),
            importlib.import_module("dynatrain_runtime.contract.checkpoint"))


# ====================================================================== processes
def _proc_env(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as handle:
            return handle.read().split(b"\0")
    except OSError:
        return None


def _proc_state(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def processes_of(run_id, incarnation=None):
    """PIDs (live, not zombies) whose environment carries this run (and incarnation)."""
    want = [("DT_CHAOS_RUN=%s" % run_id).encode()]
    if incarnation is not None:
        want.append(("DT_CHAOS_INC=%s" % incarnation).encode())
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        env = _proc_env(int(name))
        if env and all(w in env for w in want) and _proc_state(int(name)) not in (None, "Z", "X"):
            out.append(int(name))
    return out


def kill_pids(pids):
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except OSError:
                pass


# ====================================================================== one job
class Job(object):
    """One launcher job on a temp shared directory, supervised like its systemd unit, and sampled."""

    def __init__(self, workdir, cfg, node_python, data, port_base, pythonpath, extra_env=None, out=None, sync=False):
        self.cfg = cfg
        self.workdir = workdir
        self.efs = os.path.join(workdir, "efs")
        self.chaos = os.path.join(workdir, "chaos")
        self.ckdir = os.path.join(self.efs, "checkpoints")
        os.makedirs(self.efs)
        os.makedirs(self.chaos)
        # the master's side outside the volume (its home): what a hostile node aims its links at
        self.outside = os.path.join(workdir, "outside")
        os.makedirs(os.path.join(self.outside, ".ssh"))
        with open(os.path.join(self.outside, "id_ed25519"), "wb") as handle:
            handle.write(MASTER_KEY)
        self.outside_before = tree_state(self.outside)
        self.sync = sync                  # run dt-checkpoint-sync (against a moto S3 server) beside the job
        self.sync_proc = self.moto_proc = self.s3 = None
        self.s3_final = None              # what S3 held at the end: {"latest": ..., "objects": {key: sha256}}
        self.node_python, self.data, self.port_base = node_python, data, port_base
        self.pythonpath = pythonpath
        self.extra_env = dict(extra_env or {})
        self.run_id = uuid.uuid4().hex[:12]
        self.out = out or (lambda text: None)
        self.lock = threading.RLock()
        self.proc = None
        self.incarnation = 0
        self.exits = []                   # (incarnation, pid, rc, time)
        self.starts = []                  # start times (the start limit)
        self.final = None                 # why the launcher is down for good: "exit 0", "exit 1", "start limit"
        self.hold_restart = False         # a fault holds the restart (systemd's RestartSec, stretched)
        self.restart_at = None
        self.dead = {}                    # incarnation -> death time, until its orphans were counted
        self.orphans = []                 # (incarnation, pid, cmdline)
        self.samples = []                 # (time, status dict)
        self.ckpt_seen = {}               # ckpt path -> {file: sha256} at first sight
        self.ckpt_ever = False            # a checkpoint verified once
        self.first_ckpt_at = None         # when
        self.ckpt_gaps = []               # (time, listing) of samples with none verifying
        self._ckpt_next = 0.0
        self._ev_lines, self._ev_off, self._ev_bad, self._ev_ino = [], 0, [], None
        self._ev_lock = threading.Lock()
        self.stop_flag = threading.Event()
        self.thread = None
        self.launcher_out = open(os.path.join(workdir, "launcher.out"), "ab")

    # ------------------------------------------------------------------ the launcher, under "systemd"
    def env(self):
        env = dict(os.environ)
        env.update(self.extra_env)
        env["PYTHONPATH"] = os.pathsep.join([SHIM] + self.pythonpath +
                                            ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env.update({"DT_CHAOS_DIR": self.chaos, "DT_CHAOS_RUN": self.run_id, "DT_CHAOS_INC": str(self.incarnation),
                    "PYTHONUNBUFFERED": "1"})
        return env

    def command(self):
        return [self.node_python, "-m", "dynatrain_runtime.launcher", "--efs-mount", self.efs,
                "--python", self.node_python, "--script", "dynatrain_runtime.examples.train_digits",
                "--transport", "local", "--omp-threads", "1", "--port-base", str(self.port_base),
                "--poll-interval", "0.2", "--status-interval", "0.25", "--"] + self.cfg.script_args(self.data)

    def _start_launcher(self):
        self.incarnation += 1
        self.starts.append(time.time())
        self.launcher_out.write(("\n==== chaos: launcher incarnation %d at %s\n"
                                 % (self.incarnation, time.strftime("%H:%M:%S"))).encode())
        self.launcher_out.flush()
        self.proc = subprocess.Popen(self.command(), stdout=self.launcher_out, stderr=subprocess.STDOUT,
                                     cwd=self.efs, env=self.env(), start_new_session=True)
        self.out("    launcher incarnation %d: pid %d" % (self.incarnation, self.proc.pid))

    def start(self, hosts):
        write_hosts_file(self.efs, hosts)
        if self.sync:
            self._start_sync()
        with self.lock:
            self._start_launcher()
        self.thread = threading.Thread(target=self._loop, name="chaos-supervisor", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------------ the checkpoint sync, on a moto S3
    def _start_sync(self):
        port = self.port_base + 45
        self.moto_proc = subprocess.Popen(
            [MOTO_PYTHON, "-c", "import sys, time\nfrom moto.server import ThreadedMotoServer\n"
             "ThreadedMotoServer(ip_address='127.0.0.1', port=int(sys.argv[1])).start()\n"
             "print('up', flush=True)\ntime.sleep(1e9)", str(port)],
            stdout=subprocess.PIPE, stderr=open(os.path.join(self.workdir, "moto.out"), "ab"), start_new_session=True)
        for _line in range(50):          # werkzeug may say a line of its own first
            line = self.moto_proc.stdout.readline()
            if not line or line.strip() == b"up":
                break
        if line.strip() != b"up":
            raise RuntimeError("the moto S3 server did not start (%s)" % MOTO_PYTHON)
        threading.Thread(target=self.moto_proc.stdout.read, name="moto-out", daemon=True).start()   # never full
        endpoint = "http://127.0.0.1:%d" % port
        aws = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}
        import boto3                                      # the node venv's (the sync's own dependency)
        from botocore.config import Config
        self.s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                               aws_secret_access_key="testing", region_name="us-east-1",
                               config=Config(s3={"addressing_style": "path"}))
        self.s3.create_bucket(Bucket=SYNC_BUCKET)
        env = dict(self.env(), DT_CHAOS_INC="sync", **aws)
        for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
            env.pop(name, None)
        self.sync_proc = subprocess.Popen(
            [self.node_python, "-m", "dynatrain_runtime.daemons.s3sync", "sync", "--efs", self.efs,
             "--url", "s3://%s/%s" % (SYNC_BUCKET, SYNC_PREFIX), "--interval", "1", "--keep", "2"],
            stdout=open(os.path.join(self.workdir, "sync.out"), "ab"), stderr=subprocess.STDOUT, cwd=self.workdir,
            env=env, start_new_session=True)

    def sync_state(self):
        state = read_json(os.path.join(self.efs, "control", "s3sync.json"))
        return state if isinstance(state, dict) else {}

    def _stop_sync(self):
        """After the job: let the sync catch up with the final checkpoint, stop it (SIGTERM: its last pass),
        record what S3 holds, stop the S3 server."""
        if self.sync_proc is None:
            return
        t_end = time.time()
        final = [p for p in self.checkpoint_dirs() if (read_json(os.path.join(p, "meta.json")) or {}).get("finished")]
        want = int(os.path.basename(final[-1])[len("ckpt-"):]) if final else None
        deadline = time.time() + 30
        while time.time() < deadline and self.sync_proc.poll() is None:
            st = self.sync_state()
            if (st.get("last_pass_time") or 0) > t_end + 1 and (want is None or st.get("last_step") == want):
                break
            time.sleep(0.3)
        self.sync_proc.send_signal(signal.SIGTERM)
        try:
            self.sync_proc.wait(30)
        except subprocess.TimeoutExpired:
            self.sync_proc.kill()
        try:
            objects = {}
            for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=SYNC_BUCKET):
                for obj in page.get("Contents", []):
                    data = self.s3.get_object(Bucket=SYNC_BUCKET, Key=obj["Key"])["Body"].read()
                    objects[obj["Key"]] = hashlib.sha256(data).hexdigest()
            latest = self.s3.get_object(Bucket=SYNC_BUCKET, Key=SYNC_PREFIX + "LATEST.json")["Body"].read()
            self.s3_final = {"latest": json.loads(latest), "objects": objects, "want": want}
        except Exception as exc:          # noqa: BLE001 - said as a violation, not a crash
            self.s3_final = {"error": repr(exc), "want": want}
        finally:
            kill_pids([self.moto_proc.pid])

    @property
    def pid(self):
        return self.proc.pid if self.proc is not None else None

    def launcher_alive(self):
        return self.proc is not None and self.proc.poll() is None

    def _supervise(self, now):
        """systemd: Restart=on-failure, RestartSec, RestartPreventExitStatus=1 2, the start limit."""
        with self.lock:
            if self.final is not None or self.proc is None:
                return
            rc = self.proc.poll()
            if rc is None:
                return
            if self.restart_at is None:            # it just ended
                self.exits.append((self.incarnation, self.proc.pid, rc, now))
                self.dead[self.incarnation] = now
                how = "killed by signal %d" % -rc if rc < 0 else "exit %d" % rc
                self.out("    launcher incarnation %d ended: %s" % (self.incarnation, how))
                if rc == 0 or rc in RESTART_PREVENT:
                    self.final = "exit %d" % rc
                    return
                self.restart_at = now + self.cfg.restart_sec
            if self.hold_restart or now < self.restart_at:
                return
            recent = [t for t in self.starts if now - t < START_LIMIT_WINDOW]
            if len(recent) >= START_LIMIT_BURST:
                self.final = "start limit (%d starts in %.0f s)" % (len(recent), START_LIMIT_WINDOW)
                return
            self.restart_at = None
            self._start_launcher()

    def _count_orphans(self, now, force=False):
        for inc, died in list(self.dead.items()):
            if not force and now - died < ORPHAN_GRACE:
                continue
            del self.dead[inc]
            pids = processes_of(self.run_id, inc)
            if pids:
                self.orphans.extend((inc, pid, _cmdline(pid)[:160]) for pid in pids)
                self.out("    ORPHANS of incarnation %d (%.0f s after its end): %s"
                         % (inc, now - died, pids))
                kill_pids(pids)

    def _loop(self):
        while not self.stop_flag.is_set():
            now = time.time()
            try:
                self._supervise(now)
                status = read_json(os.path.join(self.efs, "status.json"))
                if isinstance(status, dict):
                    with self.lock:
                        if not self.samples or self.samples[-1][1] != status:
                            self.samples.append((now, status))
                self.timed_events()
                if now >= self._ckpt_next:
                    self._ckpt_next = now + 0.25
                    self._sample_checkpoints(now)
                self._count_orphans(now)
            except Exception as exc:          # noqa: BLE001 - the sampler must go on
                self.out("    sampler error: %r" % (exc,))
            self.stop_flag.wait(0.1)

    # ------------------------------------------------------------------ checkpoints
    def _verify(self, path):
        """True / False, or None when it vanished meanwhile (pruned)."""
        try:
            with open(os.path.join(path, "meta.json")) as handle:
                meta = json.load(handle)
            names = sorted(n for n in os.listdir(path) if not n.startswith("."))
            digests = {}
            for name in names:
                with open(os.path.join(path, name), "rb") as handle:
                    digests[name] = hashlib.sha256(handle.read()).hexdigest()
        except FileNotFoundError:
            return None if not os.path.isdir(path) else False
        except (OSError, ValueError):
            return False
        if not isinstance(meta, dict) or not isinstance(meta.get("step"), int) or not digests.get("params"):
            return False
        first = self.ckpt_seen.setdefault(path, digests)
        if first != digests:
            return False
        recorded = _recorded_digests(meta)
        if recorded:
            for name, value in recorded.items():
                if digests.get(name) not in (value, None) and len(value) == 64:
                    return False
        return True

    def _sample_checkpoints(self, now):
        listing = []
        for _attempt in range(3):        # a prune between listing and reading is not a gap: list again
            listing = sorted(glob.glob(os.path.join(self.ckdir, "ckpt-*")))
            states = [self._verify(p) for p in listing]
            if any(states):
                if not self.ckpt_ever:
                    self.ckpt_ever, self.first_ckpt_at = True, now
                return
            if not listing and not self.ckpt_ever:
                return
            time.sleep(0.05)
        if self.ckpt_ever:
            self.ckpt_gaps.append((now, [os.path.basename(p) for p in listing]))

    def checkpoint_dirs(self):
        return sorted(glob.glob(os.path.join(self.ckdir, "ckpt-*")))

    # ------------------------------------------------------------------ reading the job
    def status(self):
        with self.lock:
            return self.samples[-1][1] if self.samples else {}

    def step(self):
        return int(self.status().get("step") or 0)

    def events(self):
        """events.jsonl so far (read incrementally; a line that is not JSON is kept aside)."""
        return [e for _t, e in self.timed_events()]

    def timed_events(self):
        """``[(t, event)]``: ``t`` = when the harness first read it (its own clock: the launcher's may step)."""
        with self._ev_lock:
            path = os.path.join(self.efs, "events.jsonl")
            try:
                with open(path, "rb") as handle:
                    ino = os.fstat(handle.fileno()).st_ino
                    if ino != self._ev_ino:          # a new file (a hostile node replaced it): from its start
                        self._ev_ino, self._ev_off = ino, 0
                    handle.seek(self._ev_off)
                    data = handle.read()
            except OSError:
                return list(self._ev_lines)
            end = data.rfind(b"\n")
            if end >= 0:
                now = time.time()
                for raw in data[:end].split(b"\n"):
                    if raw.strip():
                        try:
                            self._ev_lines.append((now, json.loads(raw)))
                        except ValueError:
                            self._ev_bad.append(raw[:200])
                self._ev_off += end + 1
            return list(self._ev_lines)

    def wait(self, pred, timeout, what):
        """Poll ``pred`` (every 0.05 s) until truthy; None after ``timeout`` s or once the launcher is down."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = pred()
            if value:
                return value
            if self.final is not None:
                value = pred()
                return value or None
            time.sleep(0.05)
        self.out("    (timed out after %.0f s waiting for %s)" % (timeout, what))
        return None

    def wait_step(self, step, timeout=None):
        return self.wait(lambda: self.step() >= step and self.launcher_alive() and
                         self.status().get("pid", self.pid) == self.pid, timeout or self.cfg.timeout / 2,
                         "step %d" % step)

    def wait_marker(self, pattern, timeout):
        def find():
            for path in glob.glob(os.path.join(self.chaos, pattern)):
                info = read_json(path)
                if isinstance(info, dict):
                    return info
            return None
        return self.wait(find, timeout, "marker %s" % pattern)

    def trigger(self, name, value):
        path = os.path.join(self.chaos, name)
        with open(path + ".tmp", "w") as handle:
            handle.write(str(value))
        os.rename(path + ".tmp", path)

    def clear(self, name):
        try:
            os.unlink(os.path.join(self.chaos, name))
        except OSError:
            pass

    def kill_launcher(self, sig=signal.SIGKILL):
        with self.lock:
            pid = self.pid
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        return pid

    def wait_incarnation_gone(self, timeout=ORPHAN_GRACE):
        """After a kill: the dead incarnation's processes ended (what the next start finds on disk is final)."""
        inc = self.incarnation
        return self.wait(lambda: not self.launcher_alive() and not processes_of(self.run_id, inc),
                         timeout, "incarnation %d's processes to end" % inc)

    # ------------------------------------------------------------------ the end
    def wait_end(self, deadline):
        while time.time() < deadline and self.final is None:
            time.sleep(0.2)
        return self.final

    def shutdown(self):
        """Stop sampling, end every process of the run, count what outlived its launcher."""
        try:
            self._stop_sync()
        except Exception as exc:          # noqa: BLE001 - the run's processes must still be ended
            self.out("    cannot stop the sync: %r" % (exc,))
        with self.lock:
            if self.final is None:
                self.final = "run bound reached"
            if self.launcher_alive():
                self.kill_launcher()
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
                self.exits.append((self.incarnation, self.pid, self.proc.poll(), time.time()))
                self.dead[self.incarnation] = time.time()
        # the last incarnation's processes get the same grace as the others
        end = time.time() + ORPHAN_GRACE
        while time.time() < end and processes_of(self.run_id):
            time.sleep(0.2)
        self.stop_flag.set()
        if self.thread is not None:
            self.thread.join(5)
        self._count_orphans(time.time(), force=True)
        left = processes_of(self.run_id)
        if left:                  # processes of no dead incarnation (the harness's own helpers)
            kill_pids(left)
        self.launcher_out.close()

    def tail(self, n=25):
        try:
            with open(os.path.join(self.workdir, "launcher.out"), "rb") as handle:
                lines = handle.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])


def _recorded_digests(meta):
    """``{file: sha256}`` from a meta.json that records digests (the layout issue 24 asks for), else {}."""
    for key in ("digests", "files", "sha256", "checksums"):
        value = meta.get(key)
        if isinstance(value, dict):
            out = {}
            for name, digest in value.items():
                if isinstance(digest, dict):
                    digest = digest.get("sha256")
                if isinstance(digest, str):
                    out[name] = digest
            if out:
                return out
    return {}


# ====================================================================== files
def tree_state(top):
    """``{relative path: what it is}`` under ``top``, links not followed: a file's sha256, a link's target."""
    out = {}
    for base, dirs, names in os.walk(top):
        for name in dirs + names:
            path = os.path.join(base, name)
            rel = os.path.relpath(path, top)
            if os.path.islink(path):
                out[rel] = "link -> " + os.readlink(path)
            elif os.path.isdir(path):
                out[rel] = "dir"
            else:
                with open(path, "rb") as handle:
                    out[rel] = hashlib.sha256(handle.read()).hexdigest()
    return out


def swap_in_link(path, target):
    """Replace ``path`` with a link to ``target`` in one rename, as a node user can on the shared volume."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = "%s.lnk-%d" % (path, os.getpid())
    os.symlink(target, tmp)
    os.rename(tmp, path)


def write_raw(path, text):
    """A hostile node's file: any text, written whole (temp file + rename)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as handle:
        handle.write(text)
    os.rename(path + ".tmp", path)


def read_json(path, default=None):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return default


def write_hosts_file(efs, hosts, text=None):
    """Write host_worker as the module does: under host_worker.lock, temp file + rename."""
    hwf, _ck = _runtime()
    path = os.path.join(efs, "host_worker")
    with hwf.locked(path):
        hwf.atomic_write(path, text if text is not None else "".join(h + "\n" for h in hosts))


def raw_log(efs):
    try:
        with open(os.path.join(efs, "host_worker_log"), "rb") as handle:
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def append_raw_log(efs, text):
    """Append ``text`` to host_worker_log as a writer does (under its lock, fsync'd)."""
    hwf, _ck = _runtime()
    path = os.path.join(efs, "host_worker_log")
    with hwf.locked(path):
        with open(path, "a") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())


def next_seq(efs):
    seqs = [int(m.group(1)) for m in (LOG_LINE.match(l.strip()) for l in raw_log(efs).splitlines()) if m]
    return (max(seqs) + 1) if seqs else 0


# ====================================================================== faults
class Injection(object):
    """What a fault did: when, at which step, and what the job must look like afterwards."""

    def __init__(self):
        self.injected = False
        self.moment = ""
        self.t0 = None            # injection start
        self.t_end = None         # the fault's action over (lock released, restart allowed, ...)
        self.step = None          # the step reported when it was injected
        self.gen = 0              # the generation then
        self.members = list(HOSTS)
        self.log = [("ADDED", h) for h in HOSTS]
        self.failed = set()       # hosts allowed a worker_failed event
        self.allowed_bad_lines = set()
        self.damaged = None       # a checkpoint the campaign damaged: never to be resumed from
        self.notes = []
        self.max_restarts = None  # a hostile input must not stop the launcher: restarts allowed (None: any)
        self.expect_events = []   # (event, {field: value}) that must be in events.jsonl after the injection
        self.sync_events = []     # events of the sync (source checkpoint-sync) that must be there
        self.sync_error = None    # text the sync's error must have held once (a link it refused)
        self.sync_errors = []     # errors seen in control/s3sync.json while the fault ran

    def start(self, job):
        self.injected, self.t0, self.step = True, time.time(), job.step()
        self.gen = job.status().get("generation") or 0
        if self.t_end is None:
            self.t_end = self.t0

    def remove(self, host):
        self.members = [h for h in self.members if h != host]
        self.log.append(("REMOVED", host))


def _moment(rng, lo=8, hi=80):
    return rng.randint(lo, hi)


def _ckpt_window(job):
    return 3 * job.cfg.checkpoint_every * max(job.cfg.step_sleep, 0.05) + 30


def fault_none(job, rng, inj):
    """Control run: no fault."""
    k = _moment(rng)
    inj.moment = "none (step %d observed)" % k
    if job.wait_step(k):
        inj.start(job)


def fault_launcher_kill_random(job, rng, inj):
    """SIGKILL of the launcher at a random step (systemd restarts it)."""
    k, jitter = _moment(rng), round(rng.uniform(0, 0.5), 2)
    inj.moment = "step>=%d +%.2fs" % (k, jitter)
    if job.wait_step(k):
        time.sleep(jitter)
        inj.start(job)
        job.kill_launcher()


def _pause_checkpoint(job, rng, inj, what):
    k, frac, delay = _moment(rng), round(rng.uniform(0.1, 0.9), 2), 3.0
    if not job.wait_step(k):
        return None
    job.trigger("ckpt_delay", delay)
    marker = job.wait_marker("ckpt_writing.*", _ckpt_window(job))
    if marker is None:
        job.clear("ckpt_delay")
        inj.notes.append("no checkpoint write seen (hook not reached)")
        return None
    time.sleep(frac * delay)
    inj.moment = "step>=%d, %s in the checkpoint of step %d (%.0f%% of a %.0f s pause before meta.json)" % (
        k, what, marker["step"], 100 * frac, delay)
    return marker


def fault_launcher_kill_mid_checkpoint(job, rng, inj):
    """SIGKILL of the launcher while a worker writes a checkpoint (payload written, meta.json not yet)."""
    marker = _pause_checkpoint(job, rng, inj, "launcher killed")
    if marker is not None:
        inj.start(job)
        job.kill_launcher()
        job.clear("ckpt_delay")


def fault_worker_kill_mid_checkpoint(job, rng, inj):
    """SIGKILL of the worker that writes a checkpoint, in the middle of the write."""
    marker = _pause_checkpoint(job, rng, inj, "writer killed")
    if marker is None:
        return
    inj.start(job)
    try:
        os.kill(int(marker["pid"]), signal.SIGKILL)
    except OSError as exc:
        inj.notes.append("kill %s: %s" % (marker["pid"], exc))
    job.clear("ckpt_delay")
    victim = marker["ip"]
    inj.moment += " on %s" % victim
    inj.failed.add(victim)
    if victim != M:                      # a lost worker is dropped and logged FAILED; the master stays
        inj.members = [h for h in inj.members if h != victim]
        inj.log.append(("FAILED", victim))


def fault_launcher_kill_mid_resize(job, rng, inj):
    """host_worker loses a worker; the launcher is SIGKILLed after resize_start, before the new group trains."""
    k, delay = _moment(rng), round(rng.uniform(0, 0.3), 2)
    if not job.wait_step(k):
        return
    mark = len(job.events())
    write_hosts_file(job.efs, [B, M])
    inj.remove(A)
    ev = job.wait(lambda: [e for e in job.events()[mark:] if e.get("event") == "resize_start"], 30, "resize_start")
    if not ev:
        inj.notes.append("no resize_start")
        return
    time.sleep(delay)
    inj.start(job)
    mid = not [e for e in job.events()[mark:] if e.get("event") == "resize_end"]
    job.kill_launcher()
    inj.moment = "step>=%d, -%s, kill %.2f s after resize_start (%s)" % (
        k, A, delay, "mid-resize" if mid else "after resize_end: NOT mid-resize")


def fault_launcher_kill_mid_append(job, rng, inj):
    """SIGKILL of the launcher in the middle of its host_worker_log append (half the line written)."""
    k = _moment(rng)
    if not job.wait_step(k):
        return
    job.trigger("append_tear", 1)
    write_hosts_file(job.efs, [B, M])
    inj.remove(A)
    marker = job.wait_marker("appending.*", 60)
    if marker is None:
        job.clear("append_tear")
        inj.notes.append("the append hook was not reached")
        return
    inj.start(job)
    job.kill_launcher()
    inj.moment = "step>=%d, -%s, killed after writing %r" % (k, A, marker.get("written"))


def fault_torn_log_line(job, rng, inj):
    """A torn last host_worker_log line ('N REMOV', no newline), then a membership change."""
    k = _moment(rng)
    if not job.wait_step(k):
        return
    seq = next_seq(job.efs)
    inj.start(job)
    append_raw_log(job.efs, "%d REMOV" % seq)
    write_hosts_file(job.efs, [B, M])
    inj.remove(A)
    inj.moment = "step>=%d, '%d REMOV' appended, then -%s" % (k, seq, A)


def fault_malformed_log_line(job, rng, inj):
    """A complete but malformed host_worker_log line, then a membership change."""
    k = _moment(rng)
    if not job.wait_step(k):
        return
    bad = "%d ADDED not-an-address 12345" % next_seq(job.efs)
    inj.start(job)
    append_raw_log(job.efs, bad + "\n")
    inj.allowed_bad_lines.add(bad)
    write_hosts_file(job.efs, [B, M])
    inj.remove(A)
    inj.moment = "step>=%d, %r appended, then -%s" % (k, bad, A)


def fault_malformed_host_worker(job, rng, inj):
    """host_worker gets a malformed line (kept: the last good membership trains on), then a valid edit."""
    k, hold = _moment(rng), 3.0
    if not job.wait_step(k):
        return
    mark = len(job.events())
    inj.start(job)
    write_hosts_file(job.efs, None, text="%s\nnot-an-ip\n%s\n%s\n" % (A, B, M))
    time.sleep(hold)
    reported = [e for e in job.events()[mark:] if e.get("event") == "host_worker_error"]
    if not reported:
        inj.notes.append("malformed host_worker not reported (no host_worker_error event)")
    if [e for e in job.events()[mark:] if e.get("event") == "generation_start"]:
        inj.notes.append("a new generation started on the malformed file")
    inj.t_end = time.time()
    write_hosts_file(job.efs, [B, M])
    inj.remove(A)
    inj.moment = "step>=%d, 'not-an-ip' line for %.0f s, then -%s" % (k, hold, A)


def _damage_newest(job, rng, inj, what, link=False):
    k = _moment(rng, lo=3 * job.cfg.checkpoint_every, hi=85)
    if not job.wait_step(k):
        return
    if not job.wait(lambda: len(job.checkpoint_dirs()) >= 2, 60, "two checkpoints"):
        inj.notes.append("fewer than 2 checkpoints")
        return
    job.hold_restart = True
    inj.start(job)
    job.kill_launcher()
    gone = job.wait_incarnation_gone()
    newest = job.checkpoint_dirs()[-1]
    path = os.path.join(newest, what)
    size = os.path.getsize(path)
    if link:                                  # a hostile node: the payload is a link to the master's key
        swap_in_link(path, os.path.join(job.outside, "id_ed25519"))
    elif what == "meta.json":
        with open(path, "r+b") as handle:     # half a JSON document: unreadable
            handle.truncate(size // 2)
    else:
        with open(path, "r+b") as handle:     # the second half zeroed: a torn/damaged payload
            handle.seek(size // 2)
            handle.write(b"\0" * (size - size // 2))
    inj.damaged = newest
    inj.moment = "step>=%d, launcher killed, %s of %s %s, restart" % (
        k, what, os.path.basename(newest), "-> outside/id_ed25519" if link else "damaged (%d bytes)" % size)
    if not gone:
        inj.notes.append("processes of the killed launcher still ran when the checkpoint was damaged")
    inj.t_end = time.time()
    job.hold_restart = False


def fault_ckpt_damaged_params(job, rng, inj):
    """The newest checkpoint's params are damaged while the launcher is down (it must use an older one)."""
    _damage_newest(job, rng, inj, "params")


def fault_ckpt_damaged_meta(job, rng, inj):
    """The newest checkpoint's meta.json is torn while the launcher is down (it must use an older one)."""
    _damage_newest(job, rng, inj, "meta.json")


def fault_clock_step(job, rng, inj):
    """The master's wall clock jumps +60 s (launcher and the master's processes; monotonic untouched)."""
    k = _moment(rng)
    if not job.wait_step(k):
        return
    inj.start(job)
    job.trigger("clock_offset", 60)
    inj.moment = "step>=%d, time.time() +60 s on the master" % k


def _stall(job, rng, inj, hold):
    k = _moment(rng)
    if not job.wait_step(k):
        return
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, job.efs], stdout=subprocess.PIPE, env=dict(job.env(), DT_CHAOS_INC="holder"),
        start_new_session=True)
    line = holder.stdout.readline()
    if b"held" not in line:
        inj.notes.append("the lock holder did not get the locks: %r" % line)
        holder.kill()
        return
    inj.start(job)
    write_hosts_file_unlocked(job.efs, [B, M])
    inj.remove(A)
    time.sleep(hold)
    os.kill(holder.pid, signal.SIGCONT)
    try:
        holder.wait(10)
    except subprocess.TimeoutExpired:
        holder.kill()
    inj.t_end = time.time()
    inj.moment = ("step>=%d, a writer SIGSTOPped for %.0f s holding host_worker.lock, host_worker_log.lock, "
                  "events.jsonl.lock; -%s meanwhile" % (k, hold, A))


HOLDER = r"""
import os, signal, sys
from dynatrain_runtime.contract import shared_volume as hwf
efs = sys.argv[1]
with hwf.locked(os.path.join(efs, "host_worker")):
    with hwf.locked(os.path.join(efs, "host_worker_log")):
        with hwf.locked(os.path.join(efs, "events.jsonl")):
            print("held", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)       # a writer frozen with the locks (NFS stall, SIGSTOP)
"""


def write_hosts_file_unlocked(efs, hosts):
    """The edit that reached host_worker just before the volume stalled (its lock is held by the frozen writer)."""
    hwf, _ck = _runtime()
    hwf.atomic_write(os.path.join(efs, "host_worker"), "".join(h + "\n" for h in hosts))


def fault_stall_lock(job, rng, inj):
    """A writer frozen for 15 s holding the host_worker, log and events locks, during a resize."""
    _stall(job, rng, inj, 15.0)


def fault_stall_lock_timeout(job, rng, inj):
    """The same for 40 s: longer than the 30 s lock timeout of shared_volume.locked."""
    _stall(job, rng, inj, 40.0)


def fault_stall_launcher(job, rng, inj):
    """The launcher frozen (SIGSTOP: a master stalled on the shared volume) twice 7 s, > the 6 s dead timeout."""
    k, hold, gap = _moment(rng, lo=5, hi=20), 7.0, round(rng.uniform(0.5, 1.5), 2)
    if not job.wait_step(k):
        return
    inj.start(job)
    for i in range(2):               # twice: what the launcher does right after SIGCONT is a race
        job.kill_launcher(signal.SIGSTOP)
        time.sleep(hold)
        job.kill_launcher(signal.SIGCONT)
        if i == 0:
            time.sleep(gap)
    inj.t_end = time.time()
    inj.moment = "step>=%d, launcher SIGSTOPped %.0f s, SIGCONT, %.2f s later again %.0f s" % (k, hold, gap, hold)


# ---------------------------------------------------------------------- a hostile node (issue 40)
def _key(job):
    return os.path.join(job.outside, "id_ed25519")


def _hostile_start(job, rng, inj, lo=8, hi=80):
    """Wait for the moment; the launcher must then train on without a restart."""
    k = _moment(rng, lo, hi)
    if not job.wait_step(k):
        return None
    inj.max_restarts = 0
    return k


def fault_hostile_link_events(job, rng, inj):
    """A worker replaces events.jsonl with a link to the master's ~/.ssh/rc, then a membership change is logged."""
    k = _hostile_start(job, rng, inj)
    if k is None:
        return
    rc, hold = os.path.join(job.outside, ".ssh", "rc"), 4.0
    inj.start(job)
    swap_in_link(os.path.join(job.efs, "events.jsonl"), rc)
    write_hosts_file(job.efs, [B, M])
    inj.remove(A)
    time.sleep(hold)
    os.unlink(os.path.join(job.efs, "events.jsonl"))      # the link taken away: the launcher writes a new file
    inj.t_end = time.time()
    inj.moment = "step>=%d, events.jsonl -> outside/.ssh/rc for %.0f s, -%s meanwhile" % (k, hold, A)


def fault_hostile_link_in_checkpoint(job, rng, inj):
    """The newest checkpoint's params become a link to the master's key while the launcher is down."""
    _damage_newest(job, rng, inj, "params", link=True)


def fault_hostile_drain_shell(job, rng, inj):
    """A drain request for a worker whose reason and notice are shell strings aimed at the master."""
    k = _hostile_start(job, rng, inj)
    if k is None:
        return
    mark = os.path.join(job.outside, "pwned")
    reason = "$(touch %s) `touch %s`; touch %s #" % (mark, mark, mark)
    inj.start(job)
    write_raw(os.path.join(job.efs, "control", "drain", A + ".json"),
              json.dumps({"ip": A, "reason": reason, "notice": reason, "time": time.time()}))
    inj.remove(A)                      # a drain request is honoured: A leaves, REMOVED logged
    hwf, _ck = _runtime()
    inj.expect_events.append(("drain_requested", {"ip": A, "reason": hwf.clean_text(reason)}))   # data, cut
    inj.moment = "step>=%d, control/drain/%s.json with reason %r" % (k, A, reason[:40] + "...")


def fault_hostile_launcher_state(job, rng, inj):
    """control/launcher_state.json set to [] while the launcher is down (every start read it and exited 3)."""
    k = _moment(rng)
    if not job.wait_step(k):
        return
    inj.max_restarts = 1
    job.hold_restart = True
    inj.start(job)
    job.kill_launcher()
    job.wait_incarnation_gone()
    write_raw(os.path.join(job.efs, "control", "launcher_state.json"), "[]")
    inj.t_end = time.time()
    job.hold_restart = False
    inj.moment = "step>=%d, launcher killed, launcher_state.json = [], restart" % k


def fault_hostile_heartbeat(job, rng, inj):
    """A worker's training process writes @@DT lines with wrong types ("step": "x", a checkpoint outside)."""
    k = _hostile_start(job, rng, inj)
    if k is None:
        return
    st = job.status()
    gen, now = st.get("generation") or 0, time.time()
    hb = {"kind": "hb", "state": "training", "generation": gen, "host": A, "rank": 1, "world": 3, "epoch": 0,
          "pos": 0, "step": "x", "samples_per_s": 1.0, "time": now}
    lines = [json.dumps(hb),
             json.dumps(dict(hb, step=None, generation="x", epoch=[], time="now")),
             json.dumps({"kind": "checkpoint", "step": "x", "epoch": 0, "pos": 0, "path": _key(job),
                         "reason": "periodic", "seconds": 0.1, "stall": 0.0, "generation": gen}),
             json.dumps({"kind": "checkpoint", "step": 10 ** 12, "epoch": 0, "pos": 0, "path": _key(job),
                         "reason": "periodic", "seconds": "x", "stall": None, "generation": gen}),
             "{not json", "[]", json.dumps({"kind": "done", "step": "x", "generation": gen})]
    inj.start(job)
    job.trigger("dt_line", "\n".join(lines))
    if not job.wait(lambda: not os.path.exists(os.path.join(job.chaos, "dt_line")), 30, "the dt_line hook"):
        inj.notes.append("no training process of %s wrote the lines (the dt_line hook was not reached)" % A)
    inj.t_end = time.time()
    inj.moment = "step>=%d, %d hostile @@DT lines from %s's training process" % (k, len(lines), A)


def fault_hostile_warm_flood(job, rng, inj):
    """300 warm requests (control/warm/) for addresses that never join: at most 8 warmed, the job trains on."""
    k = _hostile_start(job, rng, inj, lo=8, hi=40)
    if k is None:
        return
    n, ttl, hold = 300, 12.0, 8.0
    before = len(processes_of(job.run_id))
    warm = os.path.join(job.efs, "control", "warm")
    ips = ["127.0.%d.%d" % (2 + i // 250, 1 + i % 250) for i in range(n)]
    inj.start(job)
    for ip in ips:
        write_raw(os.path.join(warm, ip + ".json"), json.dumps({"ip": ip, "ttl": ttl, "time": time.time()}))
    peak, end = before, time.time() + hold
    while time.time() < end:
        peak = max(peak, len(processes_of(job.run_id)))
        time.sleep(0.2)
    for ip in ips:                      # the requests are taken back (as add_workers' cleanup does)
        try:
            os.unlink(os.path.join(warm, ip + ".json"))
        except OSError:
            pass
    inj.t_end = time.time()
    allowed = 8 * 4                     # MAX_WARM_REQUESTS hosts, a few processes each (wrapper, worker, server)
    if peak - before > allowed:
        inj.notes.append("%d processes more during the flood (at most %d allowed): the warm requests are not capped"
                         % (peak - before, allowed))
    inj.expect_events.append(("warm_requests_capped", {}))
    inj.moment = "step>=%d, %d warm requests (ttl %.0f s) for %.0f s: %d -> %d processes" % (
        k, n, ttl, hold, before, peak)


def _wait_sync_step(job, inj, step, timeout=90):
    if job.wait(lambda: (job.sync_state().get("last_step") or -1) >= step, timeout, "the sync's LATEST >= %d" % step):
        return True
    inj.notes.append("the sync never backed up step %d (s3sync.json: %s)" % (step, json.dumps(job.sync_state())[:300]))
    return False


def fault_hostile_forged_meta(job, rng, inj):
    """A forged ckpt-9999999999 (meta.json {"step": 9999999999}, no digests) under the launcher and the sync."""
    k = _moment(rng, lo=2 * job.cfg.checkpoint_every, hi=70)
    if not job.wait_step(k) or not _wait_sync_step(job, inj, job.cfg.checkpoint_every):
        return
    inj.max_restarts = 1
    job.hold_restart = True
    inj.start(job)
    job.kill_launcher()
    job.wait_incarnation_gone()
    forged = os.path.join(job.ckdir, "ckpt-9999999999")
    os.makedirs(forged)
    shutil.copy(os.path.join(job.checkpoint_dirs()[-2], "params"), os.path.join(forged, "params"))
    with open(os.path.join(forged, "meta.json"), "w") as handle:
        json.dump({"step": 9999999999}, handle)
    inj.damaged = forged
    inj.t_end = time.time()
    job.hold_restart = False
    inj.moment = "step>=%d, launcher killed, forged ckpt-9999999999 without digests, restart" % k


def fault_hostile_link_job_files(job, rng, inj):
    """logs/launcher.log and results/final.json become links to the master's key under the sync."""
    k = _hostile_start(job, rng, inj)
    if k is None or not _wait_sync_step(job, inj, 0):
        return
    log, result = os.path.join(job.efs, "logs", "launcher.log"), os.path.join(job.efs, "results", "final.json")
    inj.start(job)
    swap_in_link(log, _key(job))
    swap_in_link(result, _key(job))      # left there: rank 0's final write must replace it, not write through
    seen = job.wait(lambda: job.sync_state().get("error"), 20, "the sync to refuse the links")
    if seen:
        inj.sync_errors.append(seen)
    time.sleep(2.0)
    os.unlink(log)                        # the operator takes the log's link away: the sync must recover
    inj.t_end = time.time()
    inj.sync_error = "launcher.log"
    inj.sync_events = ["checkpoint_sync_failed", "checkpoint_sync_recovered"]
    inj.moment = "step>=%d, logs/launcher.log and results/final.json -> outside/id_ed25519 (the log's for ~%.0f s)" % (
        k, inj.t_end - inj.t0)


def fault_hostile_start_over(job, rng, inj):
    """checkpoints/ moved away while the launcher is down (NoValidCheckpoint's advice): a new run under the sync."""
    k = _moment(rng, lo=3 * job.cfg.checkpoint_every, hi=70)
    if not job.wait_step(k) or not _wait_sync_step(job, inj, 2 * job.cfg.checkpoint_every):
        return
    inj.max_restarts = 1
    job.hold_restart = True
    inj.start(job)
    job.kill_launcher()
    job.wait_incarnation_gone()
    moved = time.time()
    os.rename(job.ckdir, job.ckdir + ".old")
    with job.lock:                        # a new run: its first checkpoint is the first again
        job.ckpt_ever, job.first_ckpt_at, job.ckpt_seen = False, None, {}
        job.ckpt_gaps = [g for g in job.ckpt_gaps if g[0] < moved]
    inj.t_end = time.time()
    inj.sync_events = ["checkpoint_sync_new_run"]
    job.hold_restart = False
    inj.moment = "step>=%d (S3 LATEST at %s), launcher killed, checkpoints/ -> checkpoints.old/, restart" % (
        k, job.sync_state().get("last_step"))


# ---------------------------------------------------------------------- the background checkpoint writer
def fault_ckpt_writer_crash(job, rng, inj):
    """The training process SIGKILLed while its background writer is mid-write: the previous checkpoint stays newest."""
    marker = _pause_checkpoint(job, rng, inj, "writer process killed")
    if marker is None:
        return
    before = [os.path.basename(p) for p in job.checkpoint_dirs()]
    inj.start(job)
    try:
        os.kill(int(marker["pid"]), signal.SIGKILL)
    except OSError as exc:
        inj.notes.append("kill %s: %s" % (marker["pid"], exc))
    job.clear("ckpt_delay")
    time.sleep(0.3)
    # the crashed write never shows; the one before it is still there and verifies (a survivor's recovery
    # checkpoint, written since, may be newer: that is the product recovering, not the crashed write)
    after = [os.path.basename(p) for p in job.checkpoint_dirs()]
    name = "ckpt-%010d" % int(marker["step"])
    if name in after:
        inj.notes.append("%s listed after its writer was killed mid-write" % name)
    if before and before[-1] not in after:
        inj.notes.append("the newest checkpoint before the crash, %s, is gone after it (%s)" % (before[-1], after))
    elif before and not job._verify(os.path.join(job.ckdir, before[-1])):
        inj.notes.append("the previous checkpoint %s does not verify after the crash" % before[-1])
    time.sleep(3.0)                       # nor later: the write died with its process
    if name in [os.path.basename(p) for p in job.checkpoint_dirs()]:
        inj.notes.append("%s appeared after its writer was killed mid-write" % name)
    victim = marker["ip"]
    inj.moment += " on %s (newest before: %s)" % (victim, before[-1] if before else None)
    inj.failed.add(victim)
    if victim != M:
        inj.members = [h for h in inj.members if h != victim]
        inj.log.append(("FAILED", victim))


def fault_ckpt_writer_slow(job, rng, inj):
    """One checkpoint write stalls 4 s in the background: training goes on, the ones due meanwhile are skipped."""
    k, delay = _moment(rng), 4.0
    if not job.wait_step(k):
        return
    inj.max_restarts = 0
    job.trigger("ckpt_delay", delay)
    marker = job.wait_marker("ckpt_writing.*", _ckpt_window(job))
    job.clear("ckpt_delay")               # this write only
    if marker is None:
        inj.notes.append("no checkpoint write seen (hook not reached)")
        return
    inj.start(job)
    first = job.step()
    job.wait(lambda: not glob.glob(os.path.join(job.chaos, "ckpt_writing.*")), delay + 10, "the write's end")
    trained = job.step() - first
    inj.t_end = time.time()
    if trained < job.cfg.checkpoint_every:
        inj.notes.append("training stalled during the background write: %d step(s) in %.0f s" % (trained, delay))
    inj.expect_events.append(("checkpoint_skipped", {}))
    inj.moment = "step>=%d, the write of step %d paused %.0f s: %d steps trained meanwhile" % (
        k, marker["step"], delay, trained)


FAULTS = [
    ("none", fault_none, {}),
    ("launcher-kill-random", fault_launcher_kill_random, {}),
    ("launcher-kill-mid-checkpoint", fault_launcher_kill_mid_checkpoint, {}),
    ("launcher-kill-mid-resize", fault_launcher_kill_mid_resize, {}),
    ("launcher-kill-mid-append", fault_launcher_kill_mid_append, {}),
    ("worker-kill-mid-checkpoint", fault_worker_kill_mid_checkpoint, {}),
    ("torn-log-line", fault_torn_log_line, {}),
    ("malformed-log-line", fault_malformed_log_line, {}),
    ("malformed-host-worker", fault_malformed_host_worker, {}),
    ("ckpt-damaged-params", fault_ckpt_damaged_params, {}),
    ("ckpt-damaged-meta", fault_ckpt_damaged_meta, {}),
    ("clock-step", fault_clock_step, {"DT_CHAOS_CLOCK": "1", "DT_CHAOS_CLOCK_HOSTS": M}),
    ("stall-lock", fault_stall_lock, {}),
    ("stall-lock-timeout", fault_stall_lock_timeout, {}),
    ("stall-launcher", fault_stall_launcher, {}),
    ("hostile-link-events", fault_hostile_link_events, {}),
    ("hostile-link-in-checkpoint", fault_hostile_link_in_checkpoint, {}),
    ("hostile-link-job-files", fault_hostile_link_job_files, {}),
    ("hostile-drain-shell-reason", fault_hostile_drain_shell, {}),
    ("hostile-launcher-state-list", fault_hostile_launcher_state, {}),
    ("hostile-heartbeat-step-x", fault_hostile_heartbeat, {"DT_CHAOS_DT_LINE_HOSTS": A}),
    ("hostile-warm-flood", fault_hostile_warm_flood, {}),
    ("hostile-forged-meta", fault_hostile_forged_meta, {}),
    ("hostile-start-over", fault_hostile_start_over, {}),
    ("ckpt-writer-crash-mid-write", fault_ckpt_writer_crash, {}),
    ("ckpt-writer-slow-write", fault_ckpt_writer_slow, {}),
]
FAULT_NAMES = [f[0] for f in FAULTS]
# the rows that run dt-checkpoint-sync beside the job (a moto S3 server of the controller venv)
SYNC_FAULTS = {"hostile-link-job-files", "hostile-forged-meta", "hostile-start-over"}
# `make test` (tests/unit/runtime/launcher/test_chaos_quick.py): the crash leftovers of issue 24's defects 1 and 2,
# and (issue 40) a hostile worker's @@DT lines and a crash of the background checkpoint writer
QUICK = ["torn-log-line", "launcher-kill-mid-checkpoint", "ckpt-damaged-meta", "hostile-heartbeat-step-x",
         "ckpt-writer-crash-mid-write"]


# ====================================================================== invariants
def check(job, inj):
    """Invariant violations of a finished (or abandoned) run, and the measured numbers."""
    hwf, ck = _runtime()
    v = []
    res = {"recover_s": None, "recomputed": None, "data_lost": None, "orphans": len(job.orphans),
           "val_acc": None, "restarts": max(0, job.incarnation - 1)}
    # --- the launcher never stops for good; the job finishes
    if job.final == "run bound reached":
        v.append("the job did not finish within the run's bound (%.0f s)" % job.cfg.timeout)
    elif job.final != "exit 0":
        v.append("launcher down for good: %s" % job.final)
    status = read_json(os.path.join(job.efs, "status.json")) or {}
    if job.final == "exit 0" and status.get("state") != "finished":
        v.append("launcher exited 0 with status.json state %r" % status.get("state"))
    final = read_json(os.path.join(job.efs, "results", "final.json"))
    if final is None:
        v.append("no results/final.json: the job did not finish")
    else:
        res["val_acc"] = final.get("val_acc")
        if not isinstance(final.get("val_acc"), (int, float)) or final["val_acc"] < 0.9:
            v.append("val_acc %s < 0.9" % final.get("val_acc"))
    # --- exactly once (the final checkpoint's audit)
    latest = None
    for path in reversed(job.checkpoint_dirs()):
        meta = read_json(os.path.join(path, "meta.json"))
        if isinstance(meta, dict) and meta.get("finished"):
            latest = meta
            break
    if latest is None:
        if final is not None:
            v.append("no finished checkpoint to audit")
    else:
        audit, n = latest.get("audit") or {}, int(latest.get("num_samples") or 0)
        problems = ck.audit_check(audit, n)
        v.extend("audit: %s" % p for p in problems)
        steps = [r["step"] for r in audit.get("steps", [])]
        missing_steps = sorted(set(range(max(steps) + 1 if steps else 0)) - set(steps))
        repeated_steps = len(steps) - len(set(steps))
        if missing_steps or repeated_steps:
            v.append("audit steps not 0..N-1: %d missing %s, %d repeated" % (len(missing_steps), missing_steps[:10],
                                                                             repeated_steps))
        epochs = sorted(audit.get("completed_epochs", []))
        if epochs != list(range(job.cfg.epochs)):
            v.append("completed epochs %s, expected 0..%d" % (epochs, job.cfg.epochs - 1))
        lost = 0
        per_epoch = {}
        for rec in audit.get("steps", []):
            per_epoch.setdefault(rec["epoch"], set()).update(rec["idx"])
        for epoch in range(job.cfg.epochs):
            lost += n - len(per_epoch.get(epoch, set()) & set(range(n)))
        res["data_lost"] = lost + len(missing_steps)
    # --- host_worker_log
    text = raw_log(job.efs)
    lines = text.split("\n")
    if lines and lines[-1] != "":
        v.append("host_worker_log: torn last line %r (no newline)" % lines[-1])
    parsed = []
    for raw in [l for l in lines if l.strip()]:
        m = LOG_LINE.match(raw.strip())
        if m:
            parsed.append((int(m.group(1)), m.group(2), m.group(3)))
        elif raw.strip() not in inj.allowed_bad_lines:
            v.append("host_worker_log: line does not parse: %r" % raw)
    seqs = [p[0] for p in parsed]
    if seqs != list(range(len(seqs))):
        v.append("host_worker_log: SEQ not contiguous from 0: %s" % seqs)
    got = [(p[1], p[2]) for p in parsed]
    if got != inj.log:
        v.append("host_worker_log events %s, expected %s" % (_fmt_log(got), _fmt_log(inj.log)))
    try:
        hosts = hwf.parse_hosts(open(os.path.join(job.efs, "host_worker")).read())
    except (OSError, ValueError) as exc:
        hosts = "unreadable: %s" % exc
    if hosts != inj.members:
        v.append("host_worker %s, expected %s" % (hosts, inj.members))
    # --- failures, fresh starts, checkpoints
    timed = job.timed_events()
    events = [e for _t, e in timed]
    for e in events:
        if e.get("event") == "worker_failed" and e.get("ip") not in inj.failed:
            v.append("spurious worker_failed %s: %s" % (e.get("ip"), e.get("reason")))
    gens = [e for e in events if e.get("event") == "generation_start"]
    for t, e in timed:
        if e.get("event") == "generation_start" and job.first_ckpt_at is not None and t > job.first_ckpt_at + 0.3 \
                and not e.get("resume_step"):
            v.append("generation %s started from step 0 while checkpoints existed" % e.get("generation"))
    if inj.damaged:
        for e in gens:
            if e.get("resume_path") and os.path.abspath(e["resume_path"]) == os.path.abspath(inj.damaged):
                v.append("generation %s resumed from the damaged %s"
                         % (e.get("generation"), os.path.basename(inj.damaged)))
    if job.ckpt_gaps:
        t, listing = job.ckpt_gaps[0]
        v.append("no verifying checkpoint at %d sample(s), first %.1f s after the injection: %s"
                 % (len(job.ckpt_gaps), t - (inj.t0 or t), listing))
    left = [n for n in os.listdir(job.ckdir) if n.startswith((".tmp-", ".trash-"))] if os.path.isdir(job.ckdir) \
        else []
    if left:
        v.append("left in checkpoints/: %s" % left)
    if job._ev_bad:
        v.append("events.jsonl: %d line(s) not JSON: %r" % (len(job._ev_bad), job._ev_bad[0]))
    if job.orphans:
        v.append("orphans: %s" % ["inc%d pid %d %s" % o for o in job.orphans][:3])
    # --- recovery time and recomputed steps
    if inj.injected:
        # recovered: after the fault's action and after the launcher's last crash, a live incarnation
        # trains past the injection's step with the expected membership -- and the run ended well
        # (a generation started since the injection: one after the injection's; the step: past the highest
        # reported before the fault's action ended)
        t_from = max([inj.t_end or inj.t0] + [when for _i, _p, rc, when in job.exits if rc != 0])
        ref = max([inj.step or 0] + [int(s.get("step") or 0) for t, s in job.samples if t <= t_from])
        new_gen = any(e.get("event") == "generation_start" for t, e in timed if t >= inj.t0)
        for t, s in (job.samples if job.final == "exit 0" else []):
            if t < t_from:
                continue
            if s.get("state") == "finished" or (
                    int(s.get("step") or 0) > ref and s.get("pid") not in _killed_before(job, t) and
                    (not new_gen or int(s.get("generation") or 0) > inj.gen) and
                    list(s.get("membership") or []) == inj.members):
                res["recover_s"] = round(t - inj.t0, 1)
                break
        after = [(t, e) for t, e in timed if e.get("event") == "generation_start" and t >= inj.t0]
        reported = [e.get("recomputed_steps", 0) or 0 for t, e in timed
                    if e.get("event") == "resize_end" and t >= inj.t0]
        recomputed = 0
        if after:
            t_gen, gen = after[0]
            seen = [int(s.get("step") or 0) for t, s in job.samples if t <= t_gen]
            recomputed = max(0, max(seen or [0]) - int(gen.get("resume_step") or 0))
        res["recomputed"] = max([recomputed] + reported)
    else:
        v.append("fault not injected: %s" % ("; ".join(inj.notes) or "its moment never came"))
    v.extend(check_master_side(job, inj, timed))
    for note in inj.notes:
        if inj.injected:
            v.append(note)
    return _collapse(v), res


def check_master_side(job, inj, timed):
    """Issue 40's invariant: nothing outside the volume's drop boxes changed on the master's side."""
    v = []
    after = tree_state(job.outside)
    if after != job.outside_before:
        changed = sorted(k for k in set(after) | set(job.outside_before) if after.get(k) != job.outside_before.get(k))
        v.append("outside the volume changed: %s" % changed)
    extra = sorted(set(os.listdir(job.workdir)) - WORKDIR_ENTRIES)
    if extra:
        v.append("files created beside the volume: %s" % extra)
    restarts = max(0, job.incarnation - 1)
    if inj.max_restarts is not None and restarts > inj.max_restarts:
        v.append("the launcher restarted %d time(s), %d expected: the hostile input stopped it"
                 % (restarts, inj.max_restarts))
    ckdir = os.path.realpath(job.ckdir)
    for _t, e in timed:
        path = e.get("resume_path") if e.get("event") == "generation_start" else None
        if path and not os.path.realpath(str(path)).startswith(ckdir + os.sep):
            v.append("generation %s resumed from %s, outside checkpoints/" % (e.get("generation"), path))
    since = [e for t, e in timed if inj.t0 is not None and t >= inj.t0 - 1]
    for name, fields in inj.expect_events:
        if not [e for e in since if e.get("event") == name and all(e.get(f) == x for f, x in fields.items())]:
            v.append("no %s event%s after the injection" % (name, " with %s" % fields if fields else ""))
    if job.sync:
        v.extend(_check_sync(job, inj, since))
    return v


def _check_sync(job, inj, since):
    v, final = [], job.s3_final or {}
    if final.get("error"):
        return ["S3 unreadable at the end: %s" % final["error"]]
    with open(os.path.join(job.outside, "id_ed25519"), "rb") as handle:
        key_sha = hashlib.sha256(handle.read()).hexdigest()
    leaked = [k for k, sha in final.get("objects", {}).items() if sha == key_sha]
    if leaked:
        v.append("the master's key is in S3: %s" % leaked)
    forged = [k for k in final.get("objects", {}) if "ckpt-9999999999" in k]
    if forged:
        v.append("a forged checkpoint is in S3: %s" % forged[:3])
    latest = final.get("latest") or {}
    if latest.get("step") != final.get("want"):
        v.append("S3's LATEST.json at step %s, the run's final checkpoint is step %s"
                 % (latest.get("step"), final.get("want")))
    state = job.sync_state()
    if state.get("error") is not None:
        v.append("the sync's last pass failed: %s" % state.get("error"))
    said = [e.get("event") for e in since if e.get("source") == "checkpoint-sync"]
    for name in inj.sync_events:
        if name not in said:
            v.append("no %s event of the sync (its events: %s)" % (name, said))
    if inj.sync_error and not [e for e in inj.sync_errors if inj.sync_error in str(e)]:
        v.append("the sync did not report the link at %s (its errors: %s)" % (inj.sync_error, inj.sync_errors))
    return v


def _collapse(violations):
    """One line per kind: repeats counted, 'generation N ...' lines merged into 'generations N, M ...'."""
    out, index = [], {}
    for item in violations:
        m = re.match(r"^generation (\d+) (.*)$", item)
        key = ("gen", m.group(2)) if m else ("same", item)
        if key in index:
            index[key][1].append(m.group(1) if m else None)
        else:
            index[key] = (len(out), [m.group(1) if m else None])
            out.append(key)
    lines = []
    for key in out:
        hits = index[key][1]
        if key[0] == "gen":
            lines.append("generation%s %s %s" % ("s" if len(hits) > 1 else "", ", ".join(hits), key[1]))
        else:
            lines.append(key[1] + (" (x%d)" % len(hits) if len(hits) > 1 else ""))
    return lines


def _killed_before(job, t):
    """PIDs of launcher incarnations that had ended by ``t`` (a status.json they wrote is stale)."""
    return {pid for _inc, pid, _rc, when in job.exits if when <= t}


def _fmt_log(entries):
    return "[" + ", ".join("%s %s" % (e, ip.rsplit(".", 1)[-1]) for e, ip in entries) + "]"


# ====================================================================== the campaign
class Result(object):
    def __init__(self, fault, seed):
        self.fault, self.seed = fault, seed
        self.inj = None
        self.violations = []
        self.numbers = {}
        self.seconds = 0.0
        self.workdir = None
        self.version = "?"

    @property
    def ok(self):
        return self.inj is not None and self.inj.injected and not self.violations

    def row(self):
        n, inj = self.numbers, self.inj
        rec = n.get("recover_s")
        return [self.fault, "yes" if inj and inj.injected else "NO",
                "yes" if (inj and inj.injected and rec is not None) else "NO",
                "-" if rec is None else "%.1f" % rec,
                _dash(n.get("recomputed")), _dash(n.get("data_lost")), _dash(n.get("orphans")),
                _dash(n.get("restarts")), str(len(self.violations)), "PASS" if self.ok else "FAIL"]


def _dash(value):
    return "-" if value is None else str(value)


HEADER = ["fault", "injected", "recovered", "recover_s", "recomputed", "data_lost", "orphans", "restarts",
          "violations", "result"]


def format_table(results):
    rows = [HEADER] + [r.row() for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    out = []
    for i, row in enumerate(rows):
        out.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
        if i == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def format_details(results):
    out = []
    for r in results:
        kept = " [kept: %s]" % r.workdir if r.workdir else ""
        out.append("%s (seed %d, runtime %s): %s -- %s%s" % (r.fault, r.seed, r.version,
                                                             r.inj.moment if r.inj else "?",
                                                             "PASS" if r.ok else "FAIL", kept))
        for item in r.violations:
            out.append("    - " + item)
    return "\n".join(out)


def stage_code(kind, dest):
    """A runtime package to put first on the path: this working tree's (``tree``) or HEAD's (``head``).

    Assembled as runtime/build.py stages the wheel: the package plus the collection's
    ``shared_volume.py`` (into ``contract/``) and a ``_version.py``.  Returns ``(directory, version)``.
    """
    pkg = os.path.join(dest, "dynatrain_runtime")
    fmt = os.path.join("plugins", "module_utils", "shared_volume.py")
    if kind == "tree":
        shutil.copytree(os.path.join(ROOT, "runtime", "dynatrain_runtime"), pkg,
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(os.path.join(ROOT, fmt), os.path.join(pkg, "contract"))
    else:
        rev = subprocess.check_output(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], text=True).strip()
        raw = os.path.join(dest, "git")
        os.makedirs(raw)
        archive = subprocess.run(["git", "-C", ROOT, "archive", "HEAD", "runtime/dynatrain_runtime", fmt],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", raw], input=archive, check=True)
        shutil.move(os.path.join(raw, "runtime", "dynatrain_runtime"), pkg)
        shutil.copy(os.path.join(raw, fmt), os.path.join(pkg, "contract"))
        shutil.rmtree(raw)
    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(pkg, "**", "*.py"), recursive=True)):
        with open(path, "rb") as handle:
            digest.update(os.path.relpath(path, pkg).encode() + b"\0" + handle.read())
    version = "%s-%s" % (kind if kind == "tree" else "head-" + rev, digest.hexdigest()[:10])
    with open(os.path.join(pkg, "_version.py"), "w") as handle:
        handle.write("__version__ = %r\n" % version)
    return dest, version


def runtime_version(node_python, pythonpath):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath)) if pythonpath else None
    try:
        return subprocess.check_output([node_python, "-c", "import dynatrain_runtime as d; print(d.__version__)"],
                                       env=env, text=True, stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def prepare_data(node_python, dest, pythonpath):
    out = os.path.join(dest, "digits.npz")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath)) if pythonpath else None
    subprocess.check_call([node_python, "-m", "dynatrain_runtime.examples.prepare_digits", "--out", out],
                          stdout=subprocess.DEVNULL, env=env)
    return out


def run_fault(name, seed, cfg, node_python, data, base_dir, index, pythonpath=(), port_base=23000, out=print):
    fn, env = {f[0]: (f[1], f[2]) for f in FAULTS}[name]
    result = Result(name, seed)
    workdir = tempfile.mkdtemp(prefix="%s-" % name, dir=base_dir)
    rng = random.Random("%d:%s" % (seed, name))
    job = Job(workdir, cfg, node_python, data, port_base + 50 * index, list(pythonpath), env, out=out,
              sync=name in SYNC_FAULTS)
    inj = Injection()
    result.inj = inj
    t0 = time.time()
    result.version = runtime_version(node_python, list(pythonpath))
    out("--- %s (seed %d, runtime %s) in %s" % (name, seed, result.version, workdir))
    try:
        job.start(HOSTS)
        try:
            fn(job, rng, inj)
        except Exception as exc:           # noqa: BLE001 - a harness error is a failed row, not a crash
            inj.notes.append("harness error while injecting: %r" % (exc,))
            import traceback
            traceback.print_exc()
        out("    injected: %s" % (inj.moment or "-"))
        job.wait_end(t0 + cfg.timeout)
        if job.final is None:
            inj.notes.append("run bound of %.0f s reached (job neither finished nor stopped)" % cfg.timeout)
    finally:
        job.shutdown()
    result.violations, result.numbers = check(job, inj)
    after = runtime_version(node_python, list(pythonpath))
    if after != result.version:
        result.violations.append("harness: the runtime was reinstalled during the run (%s -> %s): rerun"
                                 % (result.version, after))
    result.seconds = round(time.time() - t0, 1)
    result.tail = job.tail()
    result.workdir = workdir
    out("    %s in %.0f s: %d violation(s)" % ("PASS" if result.ok else "FAIL", result.seconds,
                                               len(result.violations)))
    for item in result.violations:
        out("      - " + item)
    return result


def run_campaign(faults, seed=1, cfg=None, node_python=DEFAULT_NODE_PYTHON, code="installed", base_dir=None,
                 keep="failed", port_base=23000, out=print):
    cfg = cfg or JobConfig()
    own_base = base_dir is None
    base_dir = base_dir or tempfile.mkdtemp(prefix="dt-chaos-")
    pythonpath = []
    if code in ("tree", "head"):
        staged, _version = stage_code(code, tempfile.mkdtemp(prefix="code-%s-" % code, dir=base_dir))
        pythonpath = [staged]
        sys.path.insert(0, staged)
        for mod in [m for m in sys.modules if m == "dynatrain_runtime" or m.startswith("dynatrain_runtime.")]:
            del sys.modules[mod]
    data = prepare_data(node_python, base_dir, pythonpath)
    results = []
    for i, name in enumerate(faults):
        r = run_fault(name, seed, cfg, node_python, data, base_dir, i, pythonpath, port_base, out)
        if keep == "none" or (keep == "failed" and r.ok):
            shutil.rmtree(r.workdir, ignore_errors=True)
            r.workdir = None
        results.append(r)
    if own_base and keep == "none":
        shutil.rmtree(base_dir, ignore_errors=True)
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--faults", default=None, help="comma-separated fault names [all]")
    ap.add_argument("--quick", action="store_true", help="the quick subset (%s)" % ",".join(QUICK))
    ap.add_argument("--list", action="store_true", help="list the faults and exit")
    ap.add_argument("--seed", type=int, default=1, help="draws every fault's moment (printed) [%(default)s]")
    ap.add_argument("--python", default=DEFAULT_NODE_PYTHON, help="node Python with MXNet [%(default)s]")
    ap.add_argument("--code", choices=("installed", "tree", "head"), default="installed",
                    help="the runtime installed in --python, or a copy of this working tree's, or of git HEAD's "
                         "(the product before the uncommitted fixes) [%(default)s]")
    ap.add_argument("--timeout", type=float, default=300.0, help="bound of one run, s [%(default)s]")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--step-sleep", type=float, default=0.1)
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--port-base", type=int, default=23000)
    ap.add_argument("--keep", choices=("failed", "all", "none"), default="failed",
                    help="keep the work directories of these runs [%(default)s]")
    ap.add_argument("--workdir", default=None, help="parent of the runs' directories [a new temp dir]")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    if args.list:
        for name, fn, _env in FAULTS:
            print("%-30s %s%s" % (name, (fn.__doc__ or "").strip(), "  [quick]" if name in QUICK else ""))
        return 0
    faults = QUICK if args.quick else (args.faults.split(",") if args.faults else FAULT_NAMES)
    unknown = [f for f in faults if f not in FAULT_NAMES]
    if unknown:
        ap.error("unknown fault(s) %s; --list shows them" % unknown)
    if not os.access(args.python, os.X_OK):
        ap.error("no node Python at %s (make node-venv, or --python)" % args.python)
    cfg = JobConfig(epochs=args.epochs, step_sleep=args.step_sleep, checkpoint_every=args.checkpoint_every,
                    timeout=args.timeout)
    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)
    t0 = time.time()
    results = run_campaign(faults, args.seed, cfg, args.python, args.code, args.workdir, args.keep,
                           args.port_base)
    print()
    print("chaos campaign: seed %d, %d fault(s), %.0f s; replay one with: %s --seed %d --faults NAME"
          % (args.seed, len(results), time.time() - t0, os.path.relpath(__file__), args.seed))
    print(format_table(results))
    print()
    print(format_details(results))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([{"fault": r.fault, "seed": r.seed, "ok": r.ok, "moment": r.inj.moment if r.inj else None,
                        "injected": bool(r.inj and r.inj.injected), "violations": r.violations,
                        "seconds": r.seconds, "workdir": r.workdir, "runtime": r.version, **r.numbers} for r in results], handle, indent=1)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
