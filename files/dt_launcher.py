#!/usr/bin/env python3
# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""dt_launcher: the elastic launcher of dynatrain.elastic (runs on the master).

Starts the MXNet parameter-server job (scheduler + servers on the master, one
worker per host of ``$EFS_MOUNT/host_worker``), watches ``host_worker`` and
applies every change at the next step boundary (``--resize-at step``, default)
or epoch boundary (``--resize-at epoch``, DT's behaviour):

    stop request -> every worker stops at the same boundary, rank 0 checkpoints,
    all exit -> the process group is rebuilt with the new membership -> it
    resumes from exactly that step.

``host_worker_log`` gets ``SEQ ADDED|REMOVED IP NS`` once the new group has
completed its first step, ``SEQ FAILED IP NS`` as soon as a lost worker is
dropped (process/ssh exit, silence, or a stall).  ``events.jsonl`` gets the same
and more; ``status.json`` shows the current state.  SIGTERM: stop at the next
boundary, checkpoint, exit 0; starting again resumes (SEQ continues).

Processes are started through a small wrapper (``dt_launcher.py child``) that
kills its child when its stdin closes, so nothing outlives the launcher or its
ssh session.  Worker and server processes are pre-warmed (MXNet already
imported) and get their role as one JSON line on stdin, which makes a resize
mostly a ps-lite reconnect.

This program imports only the standard library, ``dt_host_worker_file`` (the one
home of the host_worker formats) and the stdlib-only top level of
``dt_elastic`` (checkpoint layout, stop request), all shipped side by side.
"""

from __future__ import absolute_import, division, print_function

import argparse
import collections
import json
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)


def _import_host_worker_file():
    try:
        import dt_host_worker_file as mod  # shipped beside us on the nodes
        return mod
    except ImportError:
        pass
    try:
        from ansible_collections.dynatrain.elastic.plugins.module_utils import host_worker_file as mod
        return mod
    except ImportError:
        pass
    import importlib.util  # running from a checkout: files/../plugins/module_utils/
    path = os.path.join(os.path.dirname(HERE), "plugins", "module_utils", "host_worker_file.py")
    spec = importlib.util.spec_from_file_location("dt_host_worker_file", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


hwf = _import_host_worker_file()
import dt_elastic  # noqa: E402  (stdlib-only top level)

EXIT_STOPPED = dt_elastic.EXIT_STOPPED
MSG_PREFIX = dt_elastic.MSG_PREFIX


def now_ns():
    return time.time_ns()


# =========================================================================== child wrapper
def child_main(argv):
    """``dt_launcher.py child [--env K=V ...] -- CMD...``: run CMD, die with our stdin.

    Forwards stdin lines to the child; when stdin reaches EOF (the launcher or the
    ssh session is gone) or we get SIGTERM/SIGHUP, the child's process group is
    terminated (then killed).  Exits with the child's status.
    """
    ap = argparse.ArgumentParser(prog="dt_launcher.py child")
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    if not cmd:
        print("dt_launcher child: no command", file=sys.stderr)
        return 2
    env = dict(os.environ)
    for item in args.env:
        key, _sep, value = item.partition("=")
        env[key] = value
    try:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        print("dt_launcher child: cannot start %s: %s" % (cmd[0], exc), file=sys.stderr)
        return 127
    done = threading.Event()

    def kill_child(grace=3.0):
        if proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
            try:
                os.killpg(proc.pid, sig)
            except OSError:
                return
            deadline = time.time() + wait
            while time.time() < deadline:
                if proc.poll() is not None:
                    return
                time.sleep(0.05)

    def on_signal(signum, frame):
        kill_child()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    def pump():
        stdin = sys.stdin.buffer
        while True:
            line = stdin.readline()
            if not line:
                break
            try:
                proc.stdin.write(line)
                proc.stdin.flush()
            except (OSError, ValueError):
                pass
        if not done.is_set():
            kill_child()

    threading.Thread(target=pump, daemon=True).start()
    rc = proc.wait()
    done.set()
    try:
        os.killpg(proc.pid, signal.SIGKILL)     # anything the child left behind in its group
    except OSError:
        pass
    sys.stdout.flush()
    # os._exit: the pump thread is blocked in a buffered stdin read, and a normal interpreter
    # exit would abort ("_enter_buffered_busy") on Python 3.11.
    os._exit(rc if rc >= 0 else 128 - rc)


# =========================================================================== processes
class Proc(object):
    """One started process (worker / server / scheduler), local or over ssh, via the wrapper."""

    def __init__(self, launcher, host, kind, argv, env):
        self.launcher = launcher
        self.host = host
        self.kind = kind                 # "worker" or "serve" until assigned; then role
        self.role = None
        self.generation = None
        self.label = "%s@%s" % (kind, host)
        self.started = time.time()
        self.assigned_at = None
        self.last_alive = None
        self.last_hb = None
        self.ready = False
        self.stopped = False
        self.rc = None
        self.lock = threading.Lock()
        cmd = launcher.transport_cmd(host, argv, env)
        self.popen = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        self.reader = threading.Thread(target=self._read, name="read-" + self.label, daemon=True)
        self.reader.start()

    def _read(self):
        for raw in iter(self.popen.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if line.startswith(MSG_PREFIX):
                try:
                    msg = json.loads(line[len(MSG_PREFIX):])
                except ValueError:
                    msg = None
                if isinstance(msg, dict):
                    self.launcher.msgq.put((self, msg))
                    continue
            if self.assigned_at is not None or line.strip():
                self.launcher.out("[g%s %s %s] %s" % (self.generation if self.generation is not None else "-",
                                                      self.role or self.kind, self.host, line))

    def send(self, msg):
        try:
            self.popen.stdin.write((json.dumps(msg) + "\n").encode())
            self.popen.stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def assign(self, role, generation, env):
        self.role, self.generation = role, generation
        self.label = "%s@%s" % (role, self.host)
        self.assigned_at = time.time()
        return self.send({"kind": "assign", "env": env})

    def poll(self):
        if self.rc is None:
            self.rc = self.popen.poll()
        return self.rc

    def alive(self):
        return self.poll() is None

    def terminate(self):
        """Close stdin (the wrapper kills its child) and signal the local process group."""
        try:
            self.popen.stdin.close()
        except (OSError, ValueError):
            pass
        if self.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
            except OSError:
                pass

    def kill(self):
        if self.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except OSError:
                pass


def reap(procs, timeout):
    """Terminate procs, wait up to ``timeout`` s, then kill what is left."""
    procs = [p for p in procs if p is not None]
    for p in procs:
        p.terminate()
    deadline = time.time() + timeout
    while time.time() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    for p in procs:
        p.kill()
    for p in procs:
        try:
            p.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


# =========================================================================== generation
class Generation(object):
    def __init__(self, gid, membership, port, resume):
        self.id = gid
        self.membership = list(membership)
        self.port = port
        self.resume = resume                    # (path, meta) or None
        self.resume_step = resume[1]["step"] if resume else 0
        self.workers = {}                       # ip -> Proc
        self.servers = []                       # scheduler first
        self.started = time.time()
        self.first_step_at = None
        self.stop_at = None
        self.stop_reason = None
        self.exited = {}                        # ip -> rc
        self.hb = {}                            # ip -> last hb msg
        self.progress_at = time.time()
        self.max_step = self.resume_step
        self.started_hosts = set()
        self.done = False
        self.resize = None                      # info dict of the resize that created this generation
        self.last_ckpt = None
        self.samples_per_s = 0.0
        self.epoch = resume[1]["epoch"] if resume else 0
        self.server_exit_at = None
        self.server_exit = None

    @property
    def world(self):
        return len(self.membership)


class Launcher(object):
    def __init__(self, args):
        self.args = args
        self.efs = os.path.abspath(args.efs_mount)
        self.hw_path = os.path.join(self.efs, "host_worker")
        self.log_path = hwf.default_log_path(self.hw_path)
        self.events_path = os.path.join(self.efs, "events.jsonl")
        self.status_path = os.path.join(self.efs, "status.json")
        self.ctl_dir = os.path.join(self.efs, "control")
        self.state_path = os.path.join(self.ctl_dir, "launcher_state.json")
        self.store = dt_elastic.CheckpointStore(args.checkpoint_dir or os.path.join(self.efs, "checkpoints"))
        self.msgq = queue.Queue()
        self.out_lock = threading.Lock()
        self.shutdown = None                    # reason once SIGTERM/SIGINT arrived
        self.spares = collections.defaultdict(list)   # (host, kind) -> [Proc]
        self.master = args.master
        self.membership = []
        self.hw_text = None
        self.hw_error = None
        self.last_good = []
        self.state = "starting"
        self.gen = None
        self.gen_counter = 0
        self.failures_without_progress = 0
        self.last_status = 0.0
        self.pending_resize = None
        self.launcher_path = args.remote_launcher or os.path.abspath(__file__)
        self.spare_want = {}
        self.reapers = []

    # ------------------------------------------------------------------ output / records
    def out(self, text):
        with self.out_lock:
            sys.stdout.write("%s %s\n" % (time.strftime("%H:%M:%S"), text))
            sys.stdout.flush()

    def event(self, event, **fields):
        rec = dict(fields, event=event, time=time.time(), source="launcher")
        try:
            dt_elastic.append_jsonl(self.events_path, rec)
        except OSError as exc:
            self.out("cannot append to %s: %s" % (self.events_path, exc))

    def write_status(self, force=False):
        now = time.time()
        if not force and now - self.last_status < self.args.status_interval:
            return
        self.last_status = now
        g = self.gen
        status = {"state": self.state, "pid": os.getpid(), "updated": now, "master": self.master,
                  "membership": list(g.membership) if g else list(self.membership),
                  "world_size": g.world if g else len(self.membership),
                  "generation": g.id if g else None, "epoch": g.epoch if g else None,
                  "step": g.max_step if g else None, "samples_per_s": round(g.samples_per_s, 2) if g else 0.0,
                  "last_checkpoint": g.last_ckpt if g else None, "host_worker_error": self.hw_error,
                  "resize_at": self.args.resize_at,
                  "spares_ready": sum(1 for pool in self.spares.values() for p in pool if p.alive() and p.ready),
                  "spares_wanted": sum(self.spare_want.values()) if self.args.warm_spares else 0}
        try:
            dt_elastic.atomic_write_text(self.status_path, json.dumps(status, sort_keys=True, indent=1))
        except OSError as exc:
            self.out("cannot write %s: %s" % (self.status_path, exc))

    # ------------------------------------------------------------------ host_worker / log
    def read_host_worker(self):
        """Return the membership in host_worker, or None (keeping the last good one) on error."""
        try:
            with open(self.hw_path) as handle:
                text = handle.read()
        except IOError as exc:
            text = None
            err = "cannot read %s: %s" % (self.hw_path, exc)
        else:
            err = None
        if text is not None and text == self.hw_text and self.hw_error is None:
            return self.last_good
        if text is not None:
            try:
                hosts = hwf.parse_hosts(text, source=self.hw_path)
                if not hosts:
                    raise hwf.HostWorkerError("%s lists no workers" % self.hw_path)
                if self.master is not None and self.master not in hosts:
                    raise hwf.HostWorkerError("%s no longer lists the master %s; the master cannot be removed"
                                              % (self.hw_path, self.master))
                if self.master is not None and hosts[-1] != self.master:
                    raise hwf.HostWorkerError("%s must list the master %s last" % (self.hw_path, self.master))
            except hwf.HostWorkerError as exc:
                err = str(exc)
        if err is not None:
            if err != self.hw_error:
                self.hw_error = err
                self.out("ERROR host_worker: %s -- keeping the last good membership %s" % (err, self.last_good))
                self.event("host_worker_error", error=err, keeping=self.last_good)
                self.write_status(force=True)
            self.hw_text = text
            return None
        if self.hw_error is not None:
            self.out("host_worker is valid again")
            self.event("host_worker_ok", hosts=hosts)
        self.hw_text, self.hw_error, self.last_good = text, None, hosts
        return hosts

    def logged_members(self):
        """Hosts whose last host_worker_log event is ADDED."""
        last = {}
        for _seq, ev, ip, _ns in hwf.read_log(self.log_path):
            last[ip] = ev
        return [ip for ip, ev in last.items() if ev == "ADDED"]

    def append_log(self, event, ip):
        line = hwf.append_log(self.log_path, event, ip)
        self.out("host_worker_log: %s" % line)
        self.event("host_worker_log", line=line, log_event=event, ip=ip, seq=int(line.split()[0]))
        return line

    def confirm_membership(self, membership):
        """Append REMOVED/ADDED so the log matches ``membership`` (called once it has taken effect)."""
        logged = self.logged_members()
        for ip in logged:
            if ip not in membership:
                self.append_log("REMOVED", ip)
        for ip in membership:
            if ip not in logged:
                self.append_log("ADDED", ip)

    def drop_from_host_worker(self, ips):
        with hwf.locked(self.hw_path):
            hosts = hwf.read_hosts(self.hw_path)
            keep = [h for h in hosts if h not in ips]
            if keep != hosts:
                hwf.write_hosts(self.hw_path, keep, master=self.master)
        self.hw_text = None     # re-read
        self.last_good = [h for h in self.last_good if h not in ips]

    # ------------------------------------------------------------------ transport
    def is_local(self, host):
        return self.args.transport == "local" or host == self.master or host in self.args.local_ip

    def ssh_base(self, host):
        a = self.args
        return ["ssh", "-i", os.path.expanduser(a.ssh_key),
                "-o", "StrictHostKeyChecking=yes",
                "-o", "UserKnownHostsFile=%s" % os.path.expanduser(a.known_hosts),
                "-o", "BatchMode=yes", "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3",
                "-o", "ConnectTimeout=%d" % a.ssh_connect_timeout,
                "%s@%s" % (a.ssh_user, host)]

    def transport_cmd(self, host, argv, env):
        wrapper = [self.args.python, self.launcher_path, "child"]
        for key in sorted(env):
            wrapper += ["--env", "%s=%s" % (key, env[key])]
        wrapper += ["--"] + list(argv)
        if self.is_local(host):
            return wrapper
        return self.ssh_base(host) + ["--", " ".join(shlex.quote(x) for x in wrapper)]

    def static_env(self, host):
        env = {"DT_ASSIGN": "stdin", "EFS_MOUNT": self.efs, "DT_WORKER_IP": host, "PYTHONUNBUFFERED": "1",
               "DT_EVENTS": self.events_path, "DT_CHECKPOINT_DIR": self.store.directory,
               "DT_RESIZE_AT": self.args.resize_at, "DT_MASTER_IP": self.master or ""}
        if self.args.omp_threads:
            for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
                env[key] = str(self.args.omp_threads)
            env["MXNET_CPU_WORKER_NTHREADS"] = str(self.args.omp_threads)
        for item in self.args.env:
            key, _sep, value = item.partition("=")
            env[key] = value
        return env

    def spawn(self, host, kind):
        if kind == "worker":
            argv = [self.args.python, self.args.script] + list(self.args.script_args)
        else:
            argv = [self.args.python, os.path.join(os.path.dirname(self.launcher_path), "dt_elastic.py"), "serve"]
        return Proc(self, host, kind, argv, self.static_env(host))

    def take(self, host, kind):
        pool = self.spares[(host, kind)]
        while pool:
            p = pool.pop(0)
            if p.alive():
                return p
        return self.spawn(host, kind)

    def replenish_spares(self, membership, parallel=False):
        """Plan pre-warmed processes for the next generation (one per worker host, the servers)."""
        if not self.args.warm_spares:
            return
        want = {(h, "worker"): 1 for h in membership}
        want[(self.master, "serve")] = 1 + self.args.num_servers
        self.spare_want = want
        for key in list(self.spares):
            if key not in want:
                reap(self.spares.pop(key), 2.0)
        if parallel:
            while self.warm_step(limit=None):
                pass

    def warm_step(self, limit=1):
        """Start the next missing spare unless ``limit`` spares are still importing MXNet."""
        warming = sum(1 for pool in self.spares.values() for p in pool if p.alive() and not p.ready)
        if limit is not None and warming >= limit:
            return False
        for key, n in sorted(self.spare_want.items(), key=lambda kv: kv[0][1] != "serve"):
            pool = [p for p in self.spares[key] if p.alive()]
            self.spares[key] = pool
            if len(pool) < n:
                pool.append(self.spawn(*key))
                return True
        return False

    # ------------------------------------------------------------------ generations
    def next_generation_id(self):
        self.gen_counter += 1
        os.makedirs(self.ctl_dir, exist_ok=True)
        dt_elastic.atomic_write_text(self.state_path, json.dumps({"generation": self.gen_counter}))
        return self.gen_counter

    def start_generation(self, membership):
        resume = self.store.latest()
        gid = self.next_generation_id()
        port = self.args.port_base + (gid % 500)
        g = Generation(gid, membership, port, resume)
        dt_elastic.clear_stop_request(self.efs)
        ps_env = {"DMLC_PS_ROOT_URI": self.master, "DMLC_PS_ROOT_PORT": str(port),
                  "DMLC_NUM_SERVER": str(self.args.num_servers), "DMLC_NUM_WORKER": str(len(membership)),
                  "DT_GENERATION": str(gid), "PS_VERBOSE": "0"}
        if resume:
            ps_env["DT_RESUME_PATH"] = resume[0]
        else:
            ps_env["DT_RESUME"] = "none"
        sched = self.take(self.master, "serve")
        sched.assign("scheduler", gid, dict(ps_env, DMLC_ROLE="scheduler", DMLC_NODE_HOST=self.master))
        g.servers.append(sched)
        for _server in range(self.args.num_servers):
            srv = self.take(self.master, "serve")
            srv.assign("server", gid, dict(ps_env, DMLC_ROLE="server", DMLC_NODE_HOST=self.master))
            g.servers.append(srv)
        for host in membership:
            w = self.take(host, "worker")
            w.assign("worker", gid, dict(ps_env, DMLC_ROLE="worker", DMLC_NODE_HOST=host))
            g.workers[host] = w
        self.gen = g
        self.state = "running" if g.resize is None else "resizing"
        self.out("generation %d: %d worker(s) %s, scheduler %s:%d, %s"
                 % (gid, len(membership), membership, self.master, port,
                    "resume from step %d (%s)" % (g.resume_step, resume[0]) if resume else "fresh start"))
        self.event("generation_start", generation=gid, membership=membership, world=len(membership), port=port,
                   resume_step=g.resume_step, resume_path=resume[0] if resume else None)
        return g

    def request_stop(self, g, reason):
        if g.stop_at is not None:
            return
        g.stop_at = time.time()
        g.stop_reason = reason
        at = "epoch" if (reason == "resize" and self.args.resize_at == "epoch") else "step"
        dt_elastic.write_stop_request(self.efs, g.id, reason, at=at)
        for w in g.workers.values():
            w.send({"kind": "stop", "generation": g.id, "at": at, "reason": reason})
        self.out("generation %d: stop requested (%s) at the next %s boundary" % (g.id, reason, at))

    def handle_msg(self, proc, msg):
        g = self.gen
        kind = msg.get("kind")
        if kind == "ready":
            proc.ready = True
            return
        if kind == "alive":
            proc.last_alive = time.time()
            return
        if g is None or msg.get("generation") != g.id:
            return
        proc.last_alive = time.time()
        if kind == "hb":
            proc.last_hb = msg
            if msg.get("state") == "stopped":
                proc.stopped = True
            g.hb[proc.host] = msg
            g.started_hosts.add(proc.host)
            step = int(msg.get("step", 0))
            if step > g.max_step:
                g.max_step = step
                g.progress_at = time.time()
            g.epoch = msg.get("epoch", g.epoch)
            if msg.get("rank") == 0 and msg.get("samples_per_s"):
                g.samples_per_s = float(msg["samples_per_s"])
            if g.first_step_at is None and step > g.resume_step:
                self.on_first_step(g, msg)
        elif kind == "checkpoint":
            g.last_ckpt = msg.get("path")
            g.progress_at = time.time()
        elif kind == "done":
            g.done = True
            g.max_step = max(g.max_step, int(msg.get("step", 0)))

    def on_first_step(self, g, msg):
        g.first_step_at = time.time()
        self.failures_without_progress = 0
        self.state = "running"
        self.confirm_membership(g.membership)
        if g.resize is not None:
            r = g.resize
            r.update(first_step_s=round(g.first_step_at - g.started, 3),
                     total_s=round(g.first_step_at - r["detected_at"], 3),
                     first_step=int(msg.get("step", 0)), world=g.world, generation=g.id)
            self.out("resize done: world %d -> %d in %.2f s (stop %.2f s, restart %.2f s)"
                     % (r["from_world"], g.world, r["total_s"], r.get("stop_s", 0.0), r["first_step_s"]))
            self.event("resize_end", **r)
        self.replenish_spares(g.membership)
        self.write_status(force=True)

    def monitor(self, g):
        """Run generation ``g`` until it finishes, stops or fails. Returns (outcome, info)."""
        a = self.args
        next_hw = 0.0
        while True:
            try:
                proc, msg = self.msgq.get(timeout=0.1)
                self.handle_msg(proc, msg)
                while True:
                    proc, msg = self.msgq.get_nowait()
                    self.handle_msg(proc, msg)
            except queue.Empty:
                pass
            now = time.time()
            if self.shutdown and g.stop_at is None:
                self.request_stop(g, "shutdown")
            if now >= next_hw:
                next_hw = now + a.poll_interval
                hosts = self.read_host_worker()
                if hosts is not None and hosts != g.membership and g.stop_at is None:
                    added = [h for h in hosts if h not in g.membership]
                    removed = [h for h in g.membership if h not in hosts]
                    self.pending_resize = {"detected_at": now, "from": g.membership, "to": hosts,
                                           "from_world": g.world, "to_world": len(hosts),
                                           "added": added, "removed": removed, "resize_at": a.resize_at,
                                           "from_generation": g.id}
                    self.out("host_worker changed: +%s -%s -> resize at the next %s boundary"
                             % (added, removed, a.resize_at))
                    self.event("resize_start", **self.pending_resize)
                    self.state = "resizing"
                    self.request_stop(g, "resize")
            # processes
            failed = {}
            for host, w in g.workers.items():
                rc = w.poll()
                if rc is None or host in g.exited:
                    continue
                g.exited[host] = rc
                if rc == 0 or (rc == EXIT_STOPPED and g.stop_at is not None):
                    continue
                failed[host] = "worker process exited with status %d%s" % (
                    rc, " (ssh: host unreachable?)" if rc == 255 else "")
            for s in g.servers:
                if s.poll() is not None and g.server_exit_at is None:
                    g.server_exit_at = now
                    g.server_exit = "%s exited with status %s" % (s.role, s.rc)
            if (g.server_exit_at is not None and now - g.server_exit_at > 3.0 and g.stop_at is None
                    and not g.done and len(g.exited) < len(g.workers)):
                failed.setdefault(self.master, g.server_exit)   # workers can't go on without it
            # liveness: silent processes (dead host, frozen VM)
            for host, w in g.workers.items():
                if host in g.exited or host in failed:
                    continue
                seen = w.last_alive or w.assigned_at
                if w.last_alive is None and now - g.started > a.start_timeout:
                    failed[host] = "worker did not start within %.0f s" % a.start_timeout
                elif w.last_alive is not None and now - seen > a.dead_timeout:
                    failed[host] = "no sign of life for %.1f s" % (now - seen)
            # progress: a stall with everybody alive
            if not failed and g.stop_at is None:
                ref = g.progress_at if g.first_step_at else g.started
                limit = a.stall_timeout if g.first_step_at else a.start_timeout
                if now - ref > limit:
                    behind = [h for h, w in g.workers.items()
                              if (w.last_hb or {}).get("step", g.resume_step) < g.max_step]
                    if behind and len(behind) < len(g.workers):
                        for h in behind:
                            failed[h] = "stalled at step %s while others reached %d" % (
                                (g.workers[h].last_hb or {}).get("step"), g.max_step)
                    else:
                        failed[self.master] = "no progress for %.0f s (whole job stalled)" % (now - ref)
            if g.stop_at is not None and not failed and now - g.stop_at > a.stop_timeout:
                self.out("generation %d: workers did not stop within %.0f s; killing them (resume from the last "
                         "checkpoint)" % (g.id, a.stop_timeout))
                return "stopped", {"timeout": True}
            if failed:
                return "failed", failed
            if g.stop_at is not None and all(w.stopped or host in g.exited for host, w in g.workers.items()) \
                    and any(w.stopped and (w.last_hb or {}).get("rank") == 0 for w in g.workers.values()):
                return "stopped", {}        # every worker is past the boundary, rank 0 has checkpointed
            if g.first_step_at is not None and g.stop_at is None:
                self.warm_step()
            if len(g.exited) == len(g.workers):
                if all(rc == 0 for rc in g.exited.values()):
                    return "done", {}
                return "stopped", {}
            self.write_status()

    def teardown(self, g, outcome):
        """Stop the generation's processes; the next generation need not wait for their exit."""
        procs = list(g.workers.values()) + g.servers
        if outcome == "done":
            deadline = time.time() + 3.0       # let ps-lite wind down by itself
            while time.time() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.05)
            reap(procs, 2.0)
            return
        for p in procs:
            p.terminate()
        t = threading.Thread(target=reap, args=(procs, 2.0), name="reap-g%d" % g.id, daemon=True)
        t.start()
        self.reapers.append(t)

    # ------------------------------------------------------------------ main
    def install_signals(self):
        def handler(signum, frame):
            if self.shutdown is not None:
                self.out("second signal: stopping now")
                self.kill_everything()
                os._exit(1)
            self.shutdown = signal.Signals(signum).name
            self.out("%s received: stopping at the next step boundary" % self.shutdown)

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def kill_everything(self):
        for t in self.reapers:
            t.join(timeout=10)
        procs = [p for pool in self.spares.values() for p in pool]
        if self.gen is not None:
            procs += list(self.gen.workers.values()) + self.gen.servers
        reap(procs, 1.0)

    def wait_for_host_worker(self):
        deadline = time.time() + self.args.wait_host_worker
        while not self.shutdown:
            hosts = self.read_host_worker()
            if hosts:
                return hosts
            if time.time() > deadline:
                return None
            time.sleep(self.args.poll_interval)
        return None

    def run(self):
        a = self.args
        os.makedirs(self.ctl_dir, exist_ok=True)
        try:
            with open(self.state_path) as handle:
                self.gen_counter = int(json.load(handle).get("generation", 0))
        except (OSError, ValueError):
            self.gen_counter = 0
        self.install_signals()
        self.out("dt_launcher starting: efs %s, transport %s, resize at %s, script %s %s"
                 % (self.efs, a.transport, a.resize_at, a.script, " ".join(a.script_args)))
        self.event("launcher_start", pid=os.getpid(), transport=a.transport, resize_at=a.resize_at,
                   script=a.script, script_args=a.script_args)
        latest = self.store.latest()
        if latest and latest[1].get("finished"):
            self.out("training already finished (checkpoint %s); nothing to do" % latest[0])
            self.event("launcher_exit", reason="already_finished", step=latest[1]["step"])
            self.state = "finished"
            self.write_status(force=True)
            return 0
        if self.master is None:
            try:
                hosts = hwf.read_hosts(self.hw_path)
            except hwf.HostWorkerError:
                hosts = []
            self.master = hosts[-1] if hosts else None
        hosts = self.wait_for_host_worker()
        if not hosts:
            self.out("ERROR: no valid host_worker at %s; exiting" % self.hw_path)
            self.event("launcher_exit", reason="no_host_worker", error=self.hw_error)
            self.state = "failed"
            self.write_status(force=True)
            return 0 if self.shutdown else 2
        if self.master is None:
            self.master = hosts[-1]
        self.membership = hosts
        self.state = "starting"
        if a.warm_spares:      # pre-warm everything the first generation needs, in parallel
            self.replenish_spares(hosts, parallel=True)
        while True:
            if self.shutdown:
                break
            g = self.start_generation(self.membership)
            if self.pending_resize is not None:
                g.resize, self.pending_resize = self.pending_resize, None
                g.resize["stop_s"] = round(g.started - g.resize["detected_at"], 3)
            outcome, info = self.monitor(g)
            self.teardown(g, outcome)
            if outcome == "done":
                self.state = "finished"
                if g.first_step_at is None:
                    self.confirm_membership(g.membership)
                self.out("training finished (generation %d, step %d)" % (g.id, g.max_step))
                self.event("train_done", generation=g.id, step=g.max_step, membership=g.membership)
                self.write_status(force=True)
                break
            if outcome == "failed":
                self.handle_failure(g, info)
                if self.failures_without_progress > a.max_restarts:
                    self.out("ERROR: %d consecutive failed generations without progress; giving up"
                             % self.failures_without_progress)
                    self.event("launcher_exit", reason="too_many_failures")
                    self.state = "failed"
                    self.write_status(force=True)
                    self.kill_everything()
                    return 1
            if self.shutdown:
                break
            hosts = self.read_host_worker()
            self.membership = hosts if hosts is not None else self.last_good or self.membership
            if outcome == "failed":
                self.membership = [h for h in self.membership if h not in info or h == self.master]
            if self.pending_resize is not None:
                self.pending_resize["to"] = self.membership
                self.pending_resize["to_world"] = len(self.membership)
        self.kill_everything()
        if self.state != "finished":
            self.state = "stopped"
            latest = self.store.latest()
            self.out("stopped cleanly (%s); last checkpoint: %s" % (self.shutdown, latest[0] if latest else None))
            self.event("launcher_exit", reason=self.shutdown or "stopped",
                       checkpoint_step=latest[1]["step"] if latest else None)
        else:
            self.event("launcher_exit", reason="finished")
        dt_elastic.clear_stop_request(self.efs)
        self.write_status(force=True)
        return 0

    def handle_failure(self, g, failed):
        self.failures_without_progress += 1
        drop = [h for h in failed if h != self.master]
        for host, why in sorted(failed.items()):
            self.out("generation %d: FAILED %s: %s" % (g.id, host, why))
            self.event("worker_failed", generation=g.id, ip=host, reason=why, dropped=host in drop)
        for host in drop:
            self.append_log("FAILED", host)
        if drop:
            self.drop_from_host_worker(drop)
            self.failures_without_progress = 0
        latest = self.store.latest()
        self.pending_resize = {"detected_at": time.time(), "from": g.membership,
                               "to": [h for h in g.membership if h not in drop], "from_world": g.world,
                               "added": [], "removed": drop, "reason": "failure", "from_generation": g.id,
                               "resume_step": latest[1]["step"] if latest else 0}
        self.event("resize_start", **self.pending_resize)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        prog="dt_launcher.py",
        description="Elastic MXNet parameter-server launcher of dynatrain.elastic (runs on the master).",
        epilog="Arguments after -- go to the training script.")
    ap.add_argument("--efs-mount", default=os.environ.get("EFS_MOUNT", "/myEFSvolume"),
                    help="shared volume with host_worker, host_worker_log, checkpoints/ [%(default)s]")
    ap.add_argument("--python", default=sys.executable, help="node Python with MXNet [%(default)s]")
    ap.add_argument("--script", required=True, help="training script (same path on every node)")
    ap.add_argument("--transport", choices=("ssh", "local"), default="ssh",
                    help="ssh to the workers, or run every 'host' as a local process (tests) [%(default)s]")
    ap.add_argument("--ssh-user", default="admin")
    ap.add_argument("--ssh-key", default="~/.ssh/dynatrain_cluster")
    ap.add_argument("--known-hosts", default="~/.ssh/known_hosts_dynatrain")
    ap.add_argument("--ssh-connect-timeout", type=int, default=10)
    ap.add_argument("--remote-launcher", default=None,
                    help="path of dt_launcher.py (and dt_elastic.py beside it) on the nodes [this file's path]")
    ap.add_argument("--local-ip", action="append", default=[],
                    help="addresses of this machine, run without ssh (the master always is)")
    ap.add_argument("--master", default=None, help="master IP [last line of host_worker]")
    ap.add_argument("--resize-at", choices=dt_elastic.RESIZE_AT, default="step")
    ap.add_argument("--port-base", type=int, default=9091, help="scheduler port = base + generation %% 500")
    ap.add_argument("--num-servers", type=int, default=1, help="parameter servers on the master [%(default)s]")
    ap.add_argument("--checkpoint-dir", default=None, help="[EFS_MOUNT/checkpoints]")
    ap.add_argument("--omp-threads", type=int, default=0, help="OMP/MKL/MXNet CPU threads per process (0 = unset)")
    ap.add_argument("--env", action="append", default=[], help="extra KEY=VALUE for every process")
    ap.add_argument("--no-warm-spares", dest="warm_spares", action="store_false",
                    help="start processes only when needed (slower resizes)")
    ap.add_argument("--poll-interval", type=float, default=0.5, help="host_worker poll period, s [%(default)s]")
    ap.add_argument("--dead-timeout", type=float, default=6.0, help="silence before a worker is FAILED, s")
    ap.add_argument("--stall-timeout", type=float, default=12.0, help="no step progress before a stall, s")
    ap.add_argument("--start-timeout", type=float, default=60.0, help="generation start to first step, s")
    ap.add_argument("--stop-timeout", type=float, default=30.0, help="stop request to all workers stopped, s")
    ap.add_argument("--max-restarts", type=int, default=5, help="consecutive failed generations before giving up")
    ap.add_argument("--wait-host-worker", type=float, default=300.0, help="wait this long for a valid host_worker")
    ap.add_argument("--status-interval", type=float, default=2.0)
    ap.add_argument("script_args", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    if args.script_args and args.script_args[0] == "--":
        args.script_args = args.script_args[1:]
    args.script = os.path.abspath(args.script) if args.transport == "local" else args.script
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "child":
        return child_main(argv[1:])
    return Launcher(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
