"""The launcher's main loop: one generation after another, each watched until done, stopped or failed.

A change of ``host_worker`` is applied at the next step boundary (``--resize-at step``,
default) or epoch boundary (``--resize-at epoch``, DT's behaviour): stop request ->
every worker stops at the same boundary, rank 0 checkpoints, all exit -> the process
group is rebuilt with the new membership -> it resumes from exactly that step.
A lost worker is logged ``FAILED``, dropped from ``host_worker``, and the job resumes
from the state of the last completed step, which one survivor writes as a recovery
checkpoint when asked (``--recovery survivor``, default); only when no survivor gives it
within ``--recover-timeout`` does it resume from the last regular checkpoint.
SIGTERM: stop at the next boundary, checkpoint, exit 0.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import threading
import time

from ..checkpoint import CheckpointStore
from ..protocol import MSG_STOP_ACK, stop_at_command, stop_command
from ..jobfiles import (WARM_TTL, JobFiles, clear_drain_request, clear_stop_request, clear_warm_request,
                        read_drain_requests, read_warm_requests, warm_dir, write_json, write_stop_request)
from .generation import Generation
from .membership import Membership
from .proc import Proc, reap
from .records import Records
from .spares import SparePool, server_hosts
from .transport import Transport


class Launcher:
    def __init__(self, args):
        self.args = args
        self.files = JobFiles(args.efs_mount, args.checkpoint_dir)
        self.efs = self.files.efs
        self.store = CheckpointStore(self.files.checkpoints)
        self.records = Records(self.files, args.status_interval)
        self.out, self.event = self.records.out, self.records.event
        self.members = Membership(self.files, self.records, master=args.master)
        self.transport = Transport(args.transport, args.python, args.ssh_user, args.ssh_key, args.known_hosts,
                                   args.ssh_connect_timeout, args.local_ip)
        self.spares = SparePool(self.spawn, args.warm_spares, args.num_servers, args.spare_depth)
        self.master = args.master             # the transport runs the master's processes locally
        self.msgq = queue.Queue()
        self.shutdown = None                    # reason once SIGTERM/SIGINT arrived
        self.membership = []
        self.state = "starting"
        self.gen = None
        self.gen_counter = 0
        self.failures_without_progress = 0
        self.pending_resize = None
        self.reapers = []
        self.draining = {}                      # ip -> its drain request (spot notice), until it has left
        self.joining = None                     # hosts being added: {"hosts", "since"} while they warm up
        self.reported_ckpt = None               # the newest checkpoint path a worker reported writing
        self.step_time = 0.0                    # the last generation's observed s/step (timeouts scale)
        self.last_start_s = 0.0                 # the last generation's start -> first step, s

    @property
    def master(self):
        return self.members.master

    @master.setter
    def master(self, ip):
        self.members.master = ip
        self.transport.master = ip

    # ------------------------------------------------------------------ status
    def _snapshot(self):
        g = self.gen
        return {"state": self.state, "master": self.master,
                "membership": list(g.membership) if g else list(self.membership),
                "world_size": g.world if g else len(self.membership),
                "generation": g.id if g else None, "epoch": g.epoch if g else None,
                "step": g.max_step if g else None, "samples_per_s": round(g.samples_per_s, 2) if g else 0.0,
                "last_checkpoint": g.last_ckpt if g else None, "host_worker_error": self.members.error,
                "resize_at": self.args.resize_at, "spares_ready": self.spares.ready_count(),
                "spares_wanted": self.spares.wanted_count(),
                "joiners_warm": [h for h in sorted(self.spares.pending) if self.spares.joiner_warm(h)]}

    def write_status(self, force=False):
        self.records.status(self._snapshot, force=force)

    # ------------------------------------------------------------------ processes
    def static_env(self, host):
        env = {"DT_ASSIGN": "stdin", "EFS_MOUNT": self.efs, "DT_WORKER_IP": host, "PYTHONUNBUFFERED": "1",
               "DT_EVENTS": self.files.events, "DT_CHECKPOINT_DIR": self.store.directory,
               "DT_RESIZE_AT": self.args.resize_at, "DT_MASTER_IP": self.master or "",
               "DT_RECOVERY": self.args.recovery}
        if self.args.omp_threads:
            for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MXNET_CPU_WORKER_NTHREADS"):
                env[key] = str(self.args.omp_threads)
        for item in self.args.env:
            key, _sep, value = item.partition("=")
            env[key] = value
        return env

    def spawn(self, host, kind):
        a = self.args
        if kind == "worker":
            argv = [a.python] + script_argv(a.script) + list(a.script_args)
        else:
            argv = [a.python, "-m", "dynatrain_runtime.serve"]
        cmd = self.transport.command(host, argv, self.static_env(host))
        return Proc(host, kind, cmd, self.msgq, self.out)

    # ------------------------------------------------------------------ generations
    def next_generation_id(self):
        self.gen_counter += 1
        write_json(self.files.launcher_state, {"generation": self.gen_counter})
        return self.gen_counter

    def start_generation(self, membership):
        resume = self.resume_point()
        gid = self.next_generation_id()
        port = self.args.port_base + (gid % 500)
        g = Generation(gid, membership, port, resume)
        self.joining = None
        clear_stop_request(self.files)
        servers = server_hosts(self.args.num_servers, membership, self.master)
        ps_env = {"DMLC_PS_ROOT_URI": self.master, "DMLC_PS_ROOT_PORT": str(port),
                  "DMLC_NUM_SERVER": str(len(servers)), "DMLC_NUM_WORKER": str(len(membership)),
                  "DT_GENERATION": str(gid), "PS_VERBOSE": "0"}
        if resume:
            ps_env["DT_RESUME_PATH"] = resume[0]
        else:
            ps_env["DT_RESUME"] = "none"
        # ps-lite has no membership change: every server (and the scheduler) is a new one each generation
        for role, host in [("scheduler", self.master)] + [("server", h) for h in servers]:
            proc = self.spares.take(host, "serve")
            proc.assign(role, gid, dict(ps_env, DMLC_ROLE=role, DMLC_NODE_HOST=host))
            g.servers.append(proc)
        for host in membership:
            w = self.spares.take(host, "worker")
            w.assign("worker", gid, dict(ps_env, DMLC_ROLE="worker", DMLC_NODE_HOST=host))
            g.workers[host] = w
        self.spares.plan(membership, self.master)   # what to replace (warmed once this group trains)
        self.gen = g
        self.state = "running" if g.resize is None else "resizing"
        start = f"resume from step {g.resume_step} ({resume[0]})" if resume else "fresh start"
        self.out(f"generation {gid}: {len(membership)} worker(s) {membership}, scheduler {self.master}:{port}, "
                 f"{len(servers)} server(s), "
                 f"{start}")
        self.event("generation_start", generation=gid, membership=membership, world=len(membership), port=port,
                   servers=servers,
                   resume_step=g.resume_step, resume_path=resume[0] if resume else None)
        return g

    def resume_point(self):
        """``(path, meta)`` to resume from: the newest checkpoint, trusting the path its writer reported
        over a directory listing that may lag on a shared volume (``CheckpointStore.newest``)."""
        return self.store.newest(self.reported_ckpt)

    def request_stop(self, g, reason):
        if g.stop_at is not None:
            return
        g.stop_at = time.time()
        g.stop_reason = reason
        at = "epoch" if (reason == "resize" and self.args.resize_at == "epoch") else "step"   # drains: step
        g.stop_mode = at
        for w in g.workers.values():                             # first: the workers get it on stdin
            w.send(stop_command(g.id, at, reason))
        write_stop_request(self.files, g.id, reason, at=at)      # the record (an fsync: after the sends)
        self.out(f"generation {g.id}: stop requested ({reason}) at the next {at} boundary")

    def decide_stop(self, g):
        """Once every running worker reported its completed steps, send them all the stop boundary."""
        if g.stop_at is None or g.stop_boundary is not None:
            return
        running = [h for h in g.workers if h not in g.exited]
        if not running or any(h not in g.stop_acks for h in running):
            return
        cmd = stop_at_command(g.id, [g.stop_acks[h] for h in running], g.stop_mode)
        g.stop_boundary = cmd["step"]
        for h in running:
            g.workers[h].send(cmd)

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
            if g.on_heartbeat(proc, msg):
                self.on_first_step(g, proc, msg)
        elif kind == "checkpoint":
            g.last_ckpt = self.reported_ckpt = msg.get("path")
            g.progress_at = time.time()
        elif kind == MSG_STOP_ACK:
            g.stop_acks[proc.host] = int(msg.get("step", 0))
        elif kind == "recovery":
            g.recovery = dict(msg, received_at=time.time())
            if msg.get("ok") and msg.get("path"):
                self.reported_ckpt = msg["path"]
        elif kind == "done":
            g.done = True
            g.max_step = max(g.max_step, int(msg.get("step", 0)))

    def on_first_step(self, g, proc, msg):
        g.first_step_at = time.time()
        self.last_start_s = g.first_step_at - g.started
        self.failures_without_progress = 0
        self.state = "running"
        self.confirm(g.membership)
        if g.resize is not None:
            r = g.resize
            r.update(first_step_s=round(g.first_step_at - g.started, 3),
                     total_s=round(g.first_step_at - r["detected_at"], 3),
                     first_step=int(msg.get("step", 0)), world=g.world, generation=g.id,
                     resume_step=g.resume_step,
                     recomputed_steps=max(0, r.get("stop_step", g.resume_step) - g.resume_step))
            if msg.get("phases"):               # where the restart went, s after the assignment (this worker)
                r["phases"] = dict(msg["phases"], host=proc.host)
            self.out(f"resize done: world {r['from_world']} -> {g.world} in {r['total_s']:.2f} s "
                     f"(stop {r.get('stop_s', 0.0):.2f} s, restart {r['first_step_s']:.2f} s)")
            self.event("resize_end", **r)
        self.spares.plan(g.membership, self.master)
        self.write_status(force=True)

    # ------------------------------------------------------------------ watching a generation
    def _drain_messages(self):
        try:
            proc, msg = self.msgq.get(timeout=0.1)
            self.handle_msg(proc, msg)
            while True:
                proc, msg = self.msgq.get_nowait()
                self.handle_msg(proc, msg)
        except queue.Empty:
            pass

    def confirm(self, membership):
        """Log the membership now in effect; drained nodes that left are logged with their reason."""
        reasons = {ip: req.get("reason") for ip, req in self.draining.items()}
        for ip in self.members.confirm(membership, reasons):
            if ip in self.draining:
                del self.draining[ip]
                clear_drain_request(self.files, ip)

    def _take_drains(self, g):
        """Drop the nodes that asked to be drained from host_worker: they leave at the next step."""
        requests = read_drain_requests(self.files)
        new = [ip for ip in requests if ip in g.membership and ip not in self.draining]
        for ip in new:
            req = requests[ip]
            if ip == self.master:
                self.out(f"drain requested for the master {ip} ({req.get('reason')}): the master cannot leave; "
                         "the job checkpoints every --checkpoint-every steps")
                self.event("drain_refused", ip=ip, reason=req.get("reason"), notice=req.get("notice"))
                clear_drain_request(self.files, ip)
                continue
            self.draining[ip] = req
            self.out(f"drain requested for {ip} ({req.get('reason')}): it leaves at the next step boundary")
            self.event("drain_requested", ip=ip, reason=req.get("reason"), notice=req.get("notice"),
                       requested_at=req.get("time"))
        leaving = [ip for ip in new if ip in self.draining]
        if leaving:
            self.members.drop(leaving)
        for ip in requests:                 # requests of nodes that are gone already
            if ip not in g.membership and ip not in self.draining:
                clear_drain_request(self.files, ip)

    def _take_warm_requests(self, g, now):
        """Hosts about to join (``control/warm/<ip>.json``, written by add_workers before its host_worker
        edit): their worker process starts now, so the resize after the edit finds it warm.  A request
        is deleted once its host is a member, or after its ``ttl`` when it never joined."""
        expected = []
        for ip, req in read_warm_requests(self.files).items():
            try:
                expired = now - float(req.get("time", now)) > float(req.get("ttl", WARM_TTL))
            except (TypeError, ValueError):
                expired = True
            if ip in g.membership or expired:
                clear_warm_request(self.files, ip)
                if expired and ip not in g.membership:
                    self.event("warm_request_expired", ip=ip)
            else:
                expected.append(ip)
        started = self.spares.expect(expected)
        if started:
            self.out(f"warm request for {started}: starting their processes before they join")
            self.event("warm_request", hosts=started)

    def _check_host_worker(self, g, now):
        """Start a resize when host_worker names another membership (or a node asked to be drained)."""
        self._take_drains(g)
        self._take_warm_requests(g, now)
        hosts = self.members.read()
        if hosts is None or hosts == g.membership or g.stop_at is not None:
            if hosts == g.membership:
                self.joining = None
            return
        added = [h for h in hosts if h not in g.membership]
        removed = [h for h in g.membership if h not in hosts]
        if added and not removed and not self._joiners_warm(added, now):
            return                              # train on while the new hosts import MXNet
        since, self.joining = (self.joining or {}).get("since", now), None
        self.pending_resize = {"detected_at": since, "warm_wait_s": round(now - since, 3),
                               "from": g.membership, "to": hosts, "from_world": g.world, "to_world": len(hosts),
                               "added": added, "removed": removed, "resize_at": self.args.resize_at,
                               "from_generation": g.id}
        drained = [h for h in removed if h in self.draining]
        if drained:
            self.pending_resize["reason"] = "drain"
            self.pending_resize["drained"] = {h: self.draining[h].get("reason") for h in drained}
        boundary = "step" if drained else self.args.resize_at
        self.state = "resizing"
        self.request_stop(g, "drain" if drained else "resize")      # before the records: they fsync
        self.out(f"host_worker changed: +{added} -{removed} -> resize at the next {boundary} boundary")
        self.event("resize_start", **self.pending_resize)

    def _joiners_warm(self, added, now):
        """True once every added host has a warm process (or one of them cannot start one, or it took
        ``--join-warm-timeout`` s): a resize then pauses training for a reconnect, not for a cold start."""
        if not self.spares.enabled or self.args.join_warm_timeout <= 0:
            return True
        if self.joining is None:
            self.joining = {"since": now, "hosts": set()}
        new = [h for h in added if h not in self.joining["hosts"]]
        if new:                                 # once: a process that dies is not started again here
            self.joining["hosts"].update(new)
            self.spares.prewarm(new)
            self.out(f"host_worker adds {new}: starting their processes; training goes on until they are warm")
        states = [self.spares.joiner_warm(h) for h in added]
        return all(states) or None in states or now - self.joining["since"] >= self.args.join_warm_timeout

    def limits(self, g):
        """``(start, stall)`` limits, s: the options are floors; a slow model gets --timeout-steps of its
        observed step time (this generation's, else the last one's), and a start at least twice the last
        generation's (checkpoint load and connection included)."""
        a = self.args
        step_time = g.step_time or self.step_time
        stall = max(a.stall_timeout, a.timeout_steps * step_time)
        start = max(a.start_timeout, 2.0 * self.last_start_s + a.timeout_steps * step_time)
        return start, stall

    def _failures(self, g, now):
        a = self.args
        start, stall = self.limits(g)
        failed = g.exited_badly(now, self.master)
        failed.update(g.silent(now, failed, start, a.dead_timeout))
        if not failed:
            failed = g.stalled(now, self.master, start, stall)
        return failed

    def _outcome(self, g, now, failed):
        """``(outcome, info)`` once the generation is over, else None."""
        if g.stop_at is not None and not failed and now - g.stop_at > self.args.stop_timeout:
            self.out(f"generation {g.id}: workers did not stop within {self.args.stop_timeout:.0f} s; "
                     "killing them (resume from the last checkpoint)")
            return "stopped", {"timeout": True}
        if failed:
            g.failed_at = now
            return "failed", failed
        if g.stopped_at_boundary():
            return "stopped", {}
        if g.first_step_at is not None and g.stop_at is None:     # not while the group connects
            self.spares.warm_step()
            if g.spares_warm_s is None and self.spares.wanted_count() \
                    and self.spares.ready_count() >= self.spares.wanted_count():
                g.spares_warm_s = round(now - g.first_step_at, 3)      # re-warmed: the next change is fast
                self.event("spares_warm", generation=g.id, seconds=g.spares_warm_s,
                           spares=self.spares.wanted_count())
        if len(g.exited) == len(g.workers):
            return ("done", {}) if all(rc == 0 for rc in g.exited.values()) else ("stopped", {})
        return None

    def monitor(self, g):
        """Run generation ``g`` until it finishes, stops or fails. Returns (outcome, info)."""
        next_hw = 0.0
        while True:
            self._drain_messages()
            now = time.time()
            if self.shutdown and g.stop_at is None:
                self.request_stop(g, "shutdown")
            if now >= next_hw:
                next_hw = now + self.args.poll_interval
                self._check_host_worker(g, now)
            self.decide_stop(g)
            result = self._outcome(g, now, self._failures(g, now))
            if result is not None:
                return result
            self.write_status()

    def teardown(self, g, outcome):
        """Stop the generation's processes; the next generation need not wait for their exit."""
        procs = g.procs()
        if outcome == "done":
            deadline = time.time() + 3.0       # let ps-lite wind down by itself
            while time.time() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.05)
            reap(procs, 2.0)
            return
        for p in procs:
            p.terminate()
        t = threading.Thread(target=reap, args=(procs, 2.0), name=f"reap-g{g.id}", daemon=True)
        t.start()
        self.reapers.append(t)

    def recover(self, g, failed):
        """Ask the survivors, best rank first, to write the last completed step's state.

        Their training threads are blocked in a collective with the dead peer; the request is
        served by their stdin channel.  Returns the answer that wrote a checkpoint, else None.
        """
        if self.args.recovery != "survivor" or g.first_step_at is None:
            return None                         # before its first step the group is at its resume point
        t0 = time.time()
        deadline = t0 + self.args.recover_timeout
        tried = []
        for w in g.survivors(failed):
            if time.time() >= deadline:
                break
            g.recovery = None
            tried.append(w.host)
            if not w.send({"kind": "recover", "generation": g.id, "failed": sorted(failed)}):
                continue
            while g.recovery is None and w.alive() and time.time() < deadline:
                self._drain_messages()
            answer = g.recovery
            if answer is not None and answer.get("ok"):
                answer["seconds_total"] = round(answer["received_at"] - t0, 3)
                self.out(f"generation {g.id}: survivor {w.host} (rank {answer.get('rank')}) wrote the state of "
                         f"step {answer.get('step')} in {answer['seconds_total']:.2f} s")
                self.event("recovery_checkpoint", generation=g.id, writer=w.host, rank=answer.get("rank"),
                           step=answer.get("step"), path=answer.get("path"), seconds=answer["seconds_total"],
                           write_s=answer.get("seconds"), failed=sorted(failed))
                return answer
            why = answer.get("reason") if answer else ("no answer" if w.alive() else "exited")
            self.out(f"generation {g.id}: survivor {w.host} could not give the state: {why}")
        self.event("recovery_unavailable", generation=g.id, tried=tried, failed=sorted(failed),
                   seconds=round(time.time() - t0, 3))
        return None

    def report_failure(self, g, failed):
        for host, why in sorted(failed.items()):
            self.out(f"generation {g.id}: FAILED {host}: {why}")
            self.event("worker_failed", generation=g.id, ip=host, reason=why, dropped=host != self.master)

    def handle_failure(self, g, failed, recovery=None):
        self.failures_without_progress += 1
        drop = [h for h in failed if h != self.master]
        for host in drop:
            self.members.append_log("FAILED", host)
        if drop:
            self.members.drop(drop)
            self.failures_without_progress = 0
        latest = self.resume_point()
        resume_step = latest[1]["step"] if latest else 0
        mark = (latest[1].get("recovery") or {}) if latest else {}
        from_survivor = mark.get("generation") == g.id       # (also when its answer came too late)
        stop_step = max(g.max_step, int(recovery["step"]) if recovery else 0)     # last completed step
        self.pending_resize = {"detected_at": g.failed_at or time.time(), "from": g.membership,
                               "to": [h for h in g.membership if h not in drop], "from_world": g.world,
                               "added": [], "removed": drop, "reason": "failure", "from_generation": g.id,
                               "recovered_from": "survivor" if from_survivor else "checkpoint",
                               "resume_step": resume_step, "stop_step": stop_step,
                               "recomputed_steps": max(0, stop_step - resume_step)}
        if recovery:
            self.pending_resize["recovery_s"] = recovery.get("seconds_total")
        self.out(f"generation {g.id}: resuming from the {self.pending_resize['recovered_from']} at step "
                 f"{resume_step} ({self.pending_resize['recomputed_steps']} completed step(s) to redo)")
        self.event("resize_start", **self.pending_resize)

    # ------------------------------------------------------------------ main
    def install_signals(self):
        def handler(signum, _frame):
            if self.shutdown is not None:
                self.out("second signal: stopping now")
                self.kill_everything()
                os._exit(1)
            self.shutdown = signal.Signals(signum).name
            self.out(f"{self.shutdown} received: stopping at the next step boundary")

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def kill_everything(self):
        for t in self.reapers:
            t.join(timeout=10)
        procs = self.spares.procs() + (self.gen.procs() if self.gen is not None else [])
        reap(procs, 1.0)

    def wait_for_host_worker(self):
        deadline = time.time() + self.args.wait_host_worker
        while not self.shutdown:
            hosts = self.members.read()
            if hosts:
                return hosts
            if time.time() > deadline:
                return None
            time.sleep(self.args.poll_interval)
        return None

    def _finish(self, state, reason, code, **fields):
        self.event("launcher_exit", reason=reason, **fields)
        self.state = state
        self.write_status(force=True)
        return code

    def _start(self):
        """Load the state, find the membership; an exit code when there is nothing to run."""
        a = self.args
        os.makedirs(self.files.control, exist_ok=True)
        os.makedirs(warm_dir(self.files), exist_ok=True)     # add_workers writes its warm requests there
        try:
            with open(self.files.launcher_state) as handle:
                self.gen_counter = int(json.load(handle).get("generation", 0))
        except (OSError, ValueError):
            self.gen_counter = 0
        self.install_signals()
        self.out(f"dynatrain launcher starting: efs {self.efs}, transport {a.transport}, resize at {a.resize_at}, "
                 f"script {a.script} {' '.join(a.script_args)}")
        self.event("launcher_start", pid=os.getpid(), transport=a.transport, resize_at=a.resize_at,
                   script=a.script, script_args=a.script_args)
        latest = self.store.latest()
        if latest and latest[1].get("finished"):
            self.out(f"training already finished (checkpoint {latest[0]}); nothing to do")
            return self._finish("finished", "already_finished", 0, step=latest[1]["step"])
        if self.master is None:
            self.master = self.members.master_from_file()
        hosts = self.wait_for_host_worker()
        if not hosts:
            self.out(f"ERROR: no valid host_worker at {self.files.host_worker}; exiting")
            return self._finish("failed", "no_host_worker", 0 if self.shutdown else 2, error=self.members.error)
        if self.master is None:
            self.master = hosts[-1]
        self.membership = hosts
        self.state = "starting"
        self.spares.plan(hosts, self.master, parallel=True)   # everything the first generation needs
        return None

    def run(self):
        code = self._start()
        if code is not None:
            return code
        while not self.shutdown:
            g = self.start_generation(self.membership)
            if self.pending_resize is not None:
                g.resize, self.pending_resize = self.pending_resize, None
                waited = g.resize.get("warm_wait_s", 0)                # training went on meanwhile
                g.resize["stop_s"] = round(g.started - g.resize["detected_at"] - waited, 3)
            outcome, info = self.monitor(g)
            self.step_time = g.step_time or self.step_time
            recovery = None
            if outcome == "failed":
                self.report_failure(g, info)
                recovery = self.recover(g, info)
            self.teardown(g, outcome)
            if self.pending_resize is not None:
                self.pending_resize["stop_step"] = g.max_step     # how far the old group got
            if outcome == "done":
                self._train_done(g)
                break
            if outcome == "failed":
                self.handle_failure(g, info, recovery)
                if self.failures_without_progress > self.args.max_restarts:
                    self.out(f"ERROR: {self.failures_without_progress} consecutive failed generations "
                             "without progress; giving up")
                    self.kill_everything()
                    return self._finish("failed", "too_many_failures", 1)
            if self.shutdown:
                break
            self._next_membership(outcome, info)
        return self._stop()

    def _train_done(self, g):
        self.state = "finished"
        if g.first_step_at is None:
            self.confirm(g.membership)
        self.out(f"training finished (generation {g.id}, step {g.max_step})")
        self.event("train_done", generation=g.id, step=g.max_step, membership=g.membership)
        self.write_status(force=True)

    def _next_membership(self, outcome, info):
        hosts = self.members.read()
        self.membership = hosts if hosts is not None else self.members.last_good or self.membership
        if outcome == "failed":
            self.membership = [h for h in self.membership if h not in info or h == self.master]
        if self.pending_resize is not None:
            self.pending_resize["to"] = self.membership
            self.pending_resize["to_world"] = len(self.membership)

    def _stop(self):
        self.kill_everything()
        if self.state != "finished":
            self.state = "stopped"
            latest = self.resume_point()
            self.out(f"stopped cleanly ({self.shutdown}); last checkpoint: {latest[0] if latest else None}")
            self.event("launcher_exit", reason=self.shutdown or "stopped",
                       checkpoint_step=latest[1]["step"] if latest else None)
        else:
            self.event("launcher_exit", reason="finished")
        clear_stop_request(self.files)
        self.write_status(force=True)
        return 0


def script_argv(script):
    """How the node Python runs the training script: a file path, or ``-m module`` for a dotted name."""
    if os.sep in script or script.endswith(".py"):
        return [script]
    return ["-m", script]
