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
A script written for torchrun (``--script-api torchrun``: no helper API) is run as torchrun runs
it: each generation starts it with torchrun's environment, a change ends it (SIGTERM) and starts
it again with the new membership, and it resumes from its own checkpoint.
Every interval and timeout is measured on the monotonic clock (a wall-clock step must not
mark workers FAILED); wall-clock times only go into the records.  An unexpected error ends
the launcher with EXIT_CRASHED, which systemd restarts; only the final statuses (gave up,
no valid host_worker, no checkpoint that verifies) need a person, and status.json says why.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
import traceback

from ..contract.checkpoint import TMP_AGE_AT_START, CheckpointStore, NoValidCheckpoint
from ..contract.protocol import (EXIT_CRASHED, EXIT_GAVE_UP, EXIT_NO_HOST_WORKER, MSG_STOP_ACK, stop_at_command,
                                 stop_command)
from ..contract.shared_volume import (WARM_TTL, JobFiles, clean_text, clear_drain_request, clear_stop_request,
                                      clear_warm_request, is_number, read_drain_requests, read_json,
                                      read_warm_requests, warm_dir, write_json, write_stop_request)
from .generation import Generation, clean_int, clean_message
from .membership import Membership
from .metrics import Metrics, serve as serve_metrics
from .proc import Proc, reap
from .records import Records
from .spares import SparePool, server_hosts
from .inplace import make_strategy
from .torchenv import free_port, procs_per_node, torch_worker_env
from .transport import Transport, secret_env


RETRY_WRITES_S = 5.0        # s between two tries of a failed host_worker_log append or host_worker edit
PLAIN_ALIVE_S = 1.0         # a torchrun script's wrapper says "alive" this often
PLAIN_CONFIRM_S = 2.0       # a torchrun script's group is in effect once all its processes lived this long
PLAIN_PROGRESS_S = 60.0     # a torchrun script's group that trained this long made progress (it reports no steps)
MAX_WARM_REQUESTS = 8       # hosts warmed ahead of their join at once: each is a process (an ssh) and a thread


def saved_generation(path):
    """The generation counter in ``control/launcher_state.json``, 0 when it holds none: the volume is
    writable by every node, so any other content (a list, a string, bytes, a negative) is ignored."""
    state = read_json(path)
    value = clean_int(state.get("generation")) if isinstance(state, dict) else None
    return value if value is not None and value >= 0 else 0


def drain_fields(req):
    """The fields of a drain request (a node's own file) that go into the records: typed, printable, short."""
    return {"reason": clean_text(req.get("reason")), "notice": clean_text(req.get("notice")),
            "requested_at": req.get("time") if is_number(req.get("time")) else None}


def wall_clock_resize(resize):
    """A resize's fields for events.jsonl: ``detected_at`` as wall-clock time, as every event's ``time``
    (the launcher keeps it on the monotonic clock, which its intervals are measured on)."""
    out = dict(resize)
    if out.get("detected_at") is not None:
        out["detected_at"] = round(time.time() - (time.monotonic() - out["detected_at"]), 3)
    return out


class Launcher:
    def __init__(self, args):
        self.args = args
        self.files = JobFiles(args.efs_mount, args.checkpoint_dir)
        self.efs = self.files.efs
        self.store = CheckpointStore(self.files.checkpoints)
        self.records = Records(self.files, args.status_interval)
        self.out, self.event = self.records.out, self.records.event
        self.store.warn = self._checkpoint_skipped
        self.exit = None                        # why the launcher ended (status.json), once it did
        self.warm_seen = {}                     # ip -> (its warm request, monotonic time first seen)
        self.warm_capped = None                 # how many warm requests were over the cap when last said
        self.retry_writes_at = 0.0              # monotonic: when to retry failed log/host_worker writes
        self.members = Membership(self.files, self.records, master=args.master)
        self.transport = Transport(args.transport, args.python, args.ssh_user, args.ssh_key, args.known_hosts,
                                   args.ssh_connect_timeout, args.local_ip, secrets=secret_env())
        self.plain = args.script_api == "torchrun"      # no helper API: no spares, no step boundary
        # torch: a host's process is its wrapper, which runs this many (one per GPU: LOCAL_RANK)
        self.procs = procs_per_node(getattr(args, "procs_per_node", 1), args.engine)
        self.spares = SparePool(self.spawn, args.warm_spares and not self.plain, args.num_servers, args.spare_depth,
                                servers=args.engine == "mxnet")      # torch: workers only
        self.master = args.master             # the transport runs the master's processes locally
        self.msgq = queue.Queue()
        self.metrics_server = None
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
        self.judge_silence_after = 0.0          # monotonic: no silence judged before (see _note_own_stall)
        self.inplace = make_strategy(self)      # --resize-mode: survivors kept in place (None: restart path)

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
                "world_size": g.world if g else len(self.membership) * self.procs,
                "procs_per_node": self.procs,
                "generation": g.id if g else None, "epoch": g.epoch if g else None,
                "step": g.max_step if g else None, "samples_per_s": round(g.samples_per_s, 2) if g else 0.0,
                "last_checkpoint": g.last_ckpt if g else None, "host_worker_error": self.members.error,
                "resize_at": self.args.resize_at, "spares_ready": self.spares.ready_count(),
                "spares_wanted": self.spares.wanted_count(),
                "joiners_warm": [h for h in sorted(self.spares.pending) if self.spares.joiner_warm(h)],
                "exit": self.exit, "engine": self.args.engine}

    def write_status(self, force=False):
        self.records.status(self._snapshot, force=force)

    # ------------------------------------------------------------------ metrics
    def start_metrics(self):
        """Prometheus metrics on ``--metrics-port`` (0: none); counters from every event written."""
        if not self.args.metrics_port or self.metrics_server is not None:
            return
        metrics = Metrics()
        self.records.observe = metrics.observe
        self.metrics_server = serve_metrics(self.args.metrics_address, self.args.metrics_port,
                                            lambda: metrics.render(self._snapshot(), self.host_states()), self.out)

    def host_states(self):
        """{ip: state} for the metrics: training in the group, joining (warm request), draining (spot)."""
        g = self.gen
        states = {ip: "training" for ip in (g.membership if g else self.membership)}
        for ip in list(self.spares.pending):
            states.setdefault(ip, "joining")
        for ip in list(self.draining):
            states[ip] = "draining"
        return states

    # ------------------------------------------------------------------ processes
    def static_env(self, host):
        env = {"EFS_MOUNT": self.efs, "DT_WORKER_IP": host, "PYTHONUNBUFFERED": "1",
               "DT_EVENTS": self.files.events, "DT_CHECKPOINT_DIR": self.store.directory,
               "DT_RESIZE_AT": self.args.resize_at, "DT_MASTER_IP": self.master or "",
               "DT_RECOVERY": self.args.recovery, "DT_ENGINE": self.args.engine}
        if not self.plain:
            env["DT_ASSIGN"] = "stdin"          # a warm process waits for its generation's environment
        if self.inplace is not None:
            env.update(self.inplace.env())
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
            argv = [a.python, "-m", "dynatrain_runtime.engines.mxnet_serve"]
        cmd = self.transport.command(host, argv, self.static_env(host), procs=self.procs if kind == "worker" else 1)
        return Proc(host, kind, cmd, self.msgq, self.out, stdin_head=self.transport.stdin_head(host))

    def spawn_plain(self, host, gid, env):
        """A torchrun script's process of generation ``gid``, its environment given at its start."""
        a = self.args
        argv = [a.python] + script_argv(a.script) + list(a.script_args)
        cmd = self.transport.command(host, argv, dict(self.static_env(host), **env), alive=PLAIN_ALIVE_S,
                                     procs=self.procs)
        proc = Proc(host, "worker", cmd, self.msgq, self.out, stdin_head=self.transport.stdin_head(host))
        proc.role, proc.generation, proc.label = "worker", gid, f"worker@{host}"
        proc.remote = not self.transport.is_local(host)     # ended through its wrapper, not its ssh (``end``)
        proc.assigned_at = proc.started
        return proc

    # ------------------------------------------------------------------ generations
    def next_generation_id(self):
        self.gen_counter += 1
        write_json(self.files.launcher_state, {"generation": self.gen_counter})
        return self.gen_counter

    def start_generation(self, membership):
        resume = self.resume_point()
        gid = self.next_generation_id()
        port = self.args.port_base + (gid % 500)
        if self.args.engine == "torch":         # the store binds on the master, here: skip a taken port
            port = free_port(self.args.port_base, gid)
        g = Generation(gid, membership, port, resume, plain=self.plain, procs=self.procs)
        self.joining = None
        clear_stop_request(self.files)
        gen_env = {"DT_GENERATION": str(gid)}
        if resume:
            gen_env["DT_RESUME_PATH"] = resume[0]
        else:
            gen_env["DT_RESUME"] = "none"
        if self.args.engine == "torch":
            servers, worker_env = [], torch_worker_env(membership, self.master, port, gid, self.procs)
            connect = f"rendezvous {self.master}:{port} (torch.distributed)"
        else:
            servers, worker_env = self._start_servers(g, membership, port, gen_env)
            connect = f"scheduler {self.master}:{port}, {len(servers)} server(s)"
        for host in membership:
            if self.plain:
                g.workers[host] = self.spawn_plain(host, gid, dict(gen_env, **worker_env[host]))
                continue
            w = self.spares.take(host, "worker")
            w.assign("worker", gid, dict(gen_env, **worker_env[host]))
            g.workers[host] = w
        self.spares.plan(membership, self.master)   # what to replace (warmed once this group trains)
        self.gen = g
        self.state = "running" if g.resize is None else "resizing"
        start = f"resume from step {g.resume_step} ({resume[0]})" if resume else "fresh start"
        per_node = f" x {self.procs} processes" if self.procs > 1 else ""
        self.out(f"generation {gid}: {len(membership)} worker(s){per_node} {membership}, {connect}, {start}")
        self.event("generation_start", generation=gid, membership=membership, world=g.world, port=port,
                   procs_per_node=self.procs,
                   servers=servers, engine=self.args.engine,
                   resume_step=g.resume_step, resume_path=resume[0] if resume else None)
        return g

    def _start_servers(self, g, membership, port, gen_env):
        """MXNet: the scheduler and the servers of generation ``g``; ``(servers, {host: worker env})``."""
        servers = server_hosts(self.args.num_servers, membership, self.master)
        ps_env = dict(gen_env, DMLC_PS_ROOT_URI=self.master, DMLC_PS_ROOT_PORT=str(port),
                      DMLC_NUM_SERVER=str(len(servers)), DMLC_NUM_WORKER=str(len(membership)), PS_VERBOSE="0")
        # ps-lite has no membership change: every server (and the scheduler) is a new one each generation
        for role, host in [("scheduler", self.master)] + [("server", h) for h in servers]:
            proc = self.spares.take(host, "serve")
            proc.assign(role, g.id, dict(ps_env, DMLC_ROLE=role, DMLC_NODE_HOST=host))
            g.servers.append(proc)
        return servers, {host: dict(ps_env, DMLC_ROLE="worker", DMLC_NODE_HOST=host) for host in membership}

    def resume_point(self):
        """``(path, meta)`` to resume from: the newest checkpoint that verifies, trusting the path its writer
        reported over a directory listing that may lag on a shared volume (``CheckpointStore.newest``).
        Raises NoValidCheckpoint when checkpoints exist and none verifies: never a silent fresh start."""
        return self.store.resume_point(self.reported_ckpt)

    def _checkpoint_skipped(self, path, reason):
        self.out(f"WARNING checkpoint {path} does not verify, skipped for an older one: {reason}")
        self.event("checkpoint_damaged", path=path, reason=reason)

    def request_stop(self, g, reason):
        if g.stop_at is not None:
            return
        g.stop_at = time.monotonic()
        g.stop_reason = reason
        at = "epoch" if (reason == "resize" and self.args.resize_at == "epoch") else "step"   # drains: step
        g.stop_mode = at
        for w in g.workers.values():                             # first: the workers get it on stdin
            if self.plain:
                w.end()     # a torchrun script: ended (its wrapper says "exited"), started again (torchrun's way)
            else:
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
        msg = clean_message(msg)            # a worker's output is hostile input: typed fields, or dropped
        if msg is None:
            return
        g = self.gen
        kind = msg.get("kind")
        if kind == "ready":
            proc.ready = True
            return
        if kind == "alive":
            proc.last_alive = time.monotonic()
            return
        if kind == "exited":                    # the wrapper's last word: its command has ended
            proc.wrapper_rc = msg.get("rc")
            return
        if g is None or msg.get("generation") != g.id:
            return
        proc.last_alive = time.monotonic()
        if kind == "hb":
            if g.on_heartbeat(proc, msg):
                self.on_first_step(g, proc, msg)
        elif kind == "checkpoint":
            path = self._checkpoint_path(msg.get("path"))
            if path is not None:
                g.last_ckpt = self.reported_ckpt = path
            g.progress_at = time.monotonic()
        elif kind == MSG_STOP_ACK:
            g.stop_acks[proc.host] = msg.get("step", 0)
        elif kind == "recovery":
            path = self._checkpoint_path(msg.get("path"))
            g.recovery = dict(msg, path=path, received_at=time.monotonic())
            if msg.get("ok") and "step" not in msg:
                g.recovery["ok"] = False        # a state without its step cannot be resumed from
            if g.recovery.get("ok") and path:
                self.reported_ckpt = path
        elif kind == "done":
            g.done = proc.done = True
            g.max_step = max(g.max_step, msg.get("step", 0))
        elif kind == "peer_lost":               # torch: its collective raised; it waits for "recover"
            self.out(f"generation {g.id}: worker {proc.host} (rank {msg.get('rank')}) lost a peer at step "
                     f"{msg.get('step')}: {msg.get('error')}")

    def _checkpoint_path(self, path):
        """A path a worker reported, if it is a ``ckpt-*`` directory on the volume or in the checkpoint
        directory; else None (the launcher reads no meta.json a worker named on the master's own disk)."""
        if not isinstance(path, str) or not path or "\0" in path:
            return None
        full = os.path.abspath(path)
        ok = os.path.basename(full).startswith("ckpt-") and any(
            full.startswith(os.path.abspath(top) + os.sep) for top in (self.efs, self.store.directory))
        return full if ok else None

    def on_first_step(self, g, proc, msg):
        g.first_step_at = time.monotonic()
        self.last_start_s = g.first_step_at - g.started
        if not g.plain:                         # a torchrun script's progress is unknown: torchrun's count
            self.failures_without_progress = 0
        self.state = "running"
        self.confirm(g.membership)
        if g.resize is not None:
            r = g.resize
            r.update(first_step_s=round(g.first_step_at - g.started, 3),
                     total_s=round(g.first_step_at - r["detected_at"], 3),
                     first_step=int(msg.get("step", 0)), world=g.world, generation=g.id,
                     resume_step=g.resume_step,
                     recomputed_steps=None if g.plain else max(0, r.get("stop_step", g.resume_step)
                                                               - g.resume_step))   # plain: the script's
            if msg.get("phases"):               # where the restart went, s after the assignment (this worker)
                r["phases"] = dict(msg["phases"], host=proc.host)
            self.out(f"resize done: world {r['from_world']} -> {g.world} in {r['total_s']:.2f} s "
                     f"(stop {r.get('stop_s', 0.0):.2f} s, restart {r['first_step_s']:.2f} s)")
            self.event("resize_end", **wall_clock_resize(r))
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
            req = drain_fields(requests[ip])
            if ip == self.master:
                self.out(f"drain requested for the master {ip} ({req['reason']!r}): the master cannot leave; "
                         "the job checkpoints every --checkpoint-every steps")
                self.event("drain_refused", ip=ip, reason=req["reason"], notice=req["notice"])
                clear_drain_request(self.files, ip)
                continue
            self.draining[ip] = req
            self.out(f"drain requested for {ip} ({req['reason']!r}): it leaves at the next step boundary")
            self.event("drain_requested", ip=ip, **req)
        leaving = [ip for ip in new if ip in self.draining]
        if leaving:
            self.members.drop(leaving)
        for ip in requests:                 # requests of nodes that are gone already
            if ip not in g.membership and ip not in self.draining:
                clear_drain_request(self.files, ip)

    def _warm_request_age(self, ip, req, now):
        """Seconds since this launcher first saw the request (``now``: monotonic).  Its ``time`` is the
        controller's clock, not ours: it only tells a rewritten request from the one seen before."""
        key = (req.get("time"), req.get("ttl"))
        seen = self.warm_seen.get(ip)
        if seen is None or seen[0] != key:
            seen = self.warm_seen[ip] = (key, now)
        return now - seen[1]

    def _take_warm_requests(self, g, now):
        """Hosts about to join (``control/warm/<ip>.json``, written by add_workers before its host_worker
        edit): their worker process starts now, so the resize after the edit finds it warm.  A request
        is deleted once its host is a member, or ``ttl`` s after the launcher first saw it when it never
        joined (after a launcher restart: a full ``ttl`` again, the safe side)."""
        expected = []
        requests = read_warm_requests(self.files)
        for ip, req in requests.items():
            try:
                expired = self._warm_request_age(ip, req, now) > float(req.get("ttl", WARM_TTL))
            except (TypeError, ValueError):
                expired = True
            if ip in g.membership or expired:
                clear_warm_request(self.files, ip)
                self.warm_seen.pop(ip, None)
                if expired and ip not in g.membership:
                    self.event("warm_request_expired", ip=ip)
            else:
                expected.append(ip)
        for ip in [ip for ip in self.warm_seen if ip not in requests]:      # deleted by someone else
            del self.warm_seen[ip]
        expected = self._cap_warm(sorted(expected))
        started = self.spares.expect(expected)
        if started:
            self.out(f"warm request for {started}: starting their processes before they join")
            self.event("warm_request", hosts=started)

    def _cap_warm(self, expected):
        """At most MAX_WARM_REQUESTS hosts warmed ahead of their join (any node can write a request);
        the rest wait for their host_worker edit, as without a request.  Said once per excess."""
        if len(expected) <= MAX_WARM_REQUESTS:
            self.warm_capped = None
            return expected
        if self.warm_capped != len(expected):
            self.warm_capped = len(expected)
            self.out(f"WARNING {len(expected)} warm requests: warming only the first {MAX_WARM_REQUESTS}")
            self.event("warm_requests_capped", requested=len(expected), warmed=expected[:MAX_WARM_REQUESTS])
        return expected[:MAX_WARM_REQUESTS]

    def _check_host_worker(self, g, now):
        """Start a resize when host_worker names another membership (or a node asked to be drained)."""
        self._retry_membership_writes(now)
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
                               "from": g.membership, "to": hosts, "from_world": g.world,
                               "to_world": len(hosts) * self.procs,
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
        self.event("resize_start", **wall_clock_resize(self.pending_resize))

    def _retry_membership_writes(self, now=None):
        """Write the log lines and host_worker edits that failed before (a lock held, a volume error);
        from the loop (``now``) at most every RETRY_WRITES_S: each try may wait for the lock."""
        if not self.members.behind() or (now is not None and now < self.retry_writes_at):
            return
        self.retry_writes_at = time.monotonic() + RETRY_WRITES_S
        unconfirmed = self.members.retry()
        if unconfirmed is not None:
            self.confirm(unconfirmed)

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
        if now < self.judge_silence_after:      # we were frozen ourselves: our view of their silence is stale
            return failed
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
        if g.finished_training():               # the rest is exiting: teardown gives them a moment, then ends them
            return "done", {}
        return None

    def monitor(self, g):
        """Run generation ``g`` until it finishes, stops or fails. Returns (outcome, info)."""
        next_hw = 0.0
        last_tick = time.monotonic()
        while True:
            self._drain_messages()
            now = time.monotonic()
            self._note_own_stall(now - last_tick, now)
            last_tick = now
            if self.shutdown and g.stop_at is None:
                self.request_stop(g, "shutdown")
            if now >= next_hw:
                next_hw = now + self.args.poll_interval
                self._check_host_worker(g, now)
            self.decide_stop(g)
            self._plain_in_effect(g, now)
            result = self._outcome(g, now, self._failures(g, now))
            if result is not None:
                return result
            self.write_status()

    def _plain_in_effect(self, g, now):
        """A torchrun script's group is in effect (logged) once each of its processes has lived
        PLAIN_CONFIRM_S: it reports no steps, and one that fails at its start ends the group first."""
        if not g.plain or g.first_step_at is not None or g.stop_at is not None:
            return
        if now - g.started >= PLAIN_CONFIRM_S and all(
                w.last_alive is not None and w.alive() for w in g.workers.values()):
            self.on_first_step(g, None, {"step": g.resume_step})

    def _note_own_stall(self, gap, now):
        """A loop turn far longer than its 0.1 s means this process was frozen (SIGSTOP, a paused VM,
        swapping): the readers' backlog is not queued yet and every worker would look silent.  Judge
        silence and stalls again only a full dead timeout after we run again."""
        if gap > self.args.dead_timeout / 2:
            self.judge_silence_after = now + self.args.dead_timeout
            self.out(f"the launcher itself was stalled for {gap:.1f} s; no worker is judged silent "
                     f"for the next {self.args.dead_timeout:.0f} s")

    def teardown(self, g, outcome):
        """Stop the generation's processes; the next generation need not wait for their exit."""
        procs = g.procs()
        if outcome == "done":
            deadline = time.monotonic() + 3.0       # let ps-lite wind down by itself
            while time.monotonic() < deadline and any(p.poll() is None for p in procs):
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
        if self.args.recovery != "survivor" or g.plain or (g.first_step_at is None
                                                           and not getattr(g, "holds_state", False)):
            return None                         # before its first step the group is at its resume point
        t0 = time.monotonic()
        deadline = t0 + self.args.recover_timeout
        tried = []
        for w in g.survivors(failed):
            if time.monotonic() >= deadline:
                break
            g.recovery = None
            tried.append(w.host)
            if not w.send({"kind": "recover", "generation": g.id, "failed": sorted(failed)}):
                continue
            while g.recovery is None and w.alive() and time.monotonic() < deadline:
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
                   seconds=round(time.monotonic() - t0, 3))
        return None

    def report_failure(self, g, failed):
        for host, why in sorted(failed.items()):
            self.out(f"generation {g.id}: FAILED {host}: {why}")
            self.event("worker_failed", generation=g.id, ip=host, reason=why,
                       dropped=host != self.master and host not in g.script_failed)

    def made_progress(self, g, now=None):
        """Did generation ``g`` move the job on?  Steps past its resume point; a torchrun script (no steps):
        a group that trained PLAIN_PROGRESS_S.  The give-up counter counts failures in a row without it."""
        if not g.plain:
            return g.max_step > g.resume_step
        end = g.failed_at or (time.monotonic() if now is None else now)
        return g.first_step_at is not None and end - g.first_step_at >= PLAIN_PROGRESS_S

    def count_failure(self, g):
        """One more failed generation; the count starts again after one that made progress."""
        if self.made_progress(g):
            self.failures_without_progress = 0
        self.failures_without_progress += 1

    def handle_failure(self, g, failed, recovery=None):
        self.count_failure(g)
        drop = [h for h in g.lost(failed) if h != self.master]
        for host in drop:
            self.members.append_log("FAILED", host)
        if drop:
            self.members.drop(drop)
            self.failures_without_progress = 0
        if g.first_step_at is None and g.resume:
            self.store.forget(g.resume[0])      # it failed to start: verify its checkpoint again
        latest = self.resume_point()
        resume_step = latest[1]["step"] if latest else 0
        mark = (latest[1].get("recovery") or {}) if latest else {}
        # a survivor wrote it (also when its answer came too late), or gave a checkpoint of its very step
        # that a periodic save had written already: the same state, nothing lost
        from_survivor = mark.get("generation") == g.id or bool(
            latest and recovery and recovery.get("ok") and recovery.get("path") == latest[0])
        stop_step = max(g.max_step, clean_int((recovery or {}).get("step"), 0))     # last completed step
        self.pending_resize = {"detected_at": g.failed_at or time.monotonic(), "from": g.membership,
                               "to": [h for h in g.membership if h not in drop], "from_world": g.world,
                               "added": [], "removed": drop, "reason": "failure", "from_generation": g.id,
                               "recovered_from": "survivor" if from_survivor else "checkpoint",
                               "resume_step": resume_step, "stop_step": stop_step,
                               "recomputed_steps": max(0, stop_step - resume_step)}
        if recovery:
            self.pending_resize["recovery_s"] = recovery.get("seconds_total")
        if self.inplace is not None and self.inplace.holding(g):
            self.inplace.annotate(self.pending_resize)
        elif g.plain:
            self.pending_resize.update(recovered_from="script", resume_step=None, recomputed_steps=None)
            self.out(f"generation {g.id}: restarting the script on {self.pending_resize['to']} "
                     "(it resumes from its own checkpoint)")
        else:
            self.out(f"generation {g.id}: resuming from the {self.pending_resize['recovered_from']} at step "
                     f"{resume_step} ({self.pending_resize['recomputed_steps']} completed step(s) to redo)")
        self.event("resize_start", **wall_clock_resize(self.pending_resize))

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
        # every writer this launcher started is gone now: what a killed one left is garbage (a restart
        # after systemd's 2 s would find it too young for the start's age rule)
        removed = self.store.clean(max_age=0) if self.gen is not None else []
        if removed:
            self.out(f"removed unfinished checkpoint writes {removed}")

    def wait_for_host_worker(self):
        deadline = time.monotonic() + self.args.wait_host_worker
        while not self.shutdown:
            hosts = self.members.read()
            if hosts:
                return hosts
            if time.monotonic() > deadline:
                return None
            time.sleep(self.args.poll_interval)
        return None

    def _finish(self, state, reason, code, message=None, **fields):
        """End with exit status ``code``; status.json's ``exit`` and stderr say why."""
        self.exit = dict(fields, reason=reason, code=code, message=message, time=time.time())
        if message and code:
            print(f"dt-launcher: {message} (exit status {code})", file=sys.stderr, flush=True)
        self.event("launcher_exit", reason=reason, code=code, message=message, **fields)
        self.state = state
        self.write_status(force=True)
        return code

    def _start(self):
        """Load the state, find the membership; an exit code when there is nothing to run."""
        a = self.args
        os.makedirs(self.files.control, exist_ok=True)
        os.makedirs(warm_dir(self.files), exist_ok=True)     # add_workers writes its warm requests there
        self.gen_counter = saved_generation(self.files.launcher_state)
        self.install_signals()
        self.start_metrics()
        per_node = f", {self.procs} process(es) per node" if a.engine == "torch" else ""
        self.out(f"dynatrain launcher starting: engine {a.engine}{per_node}, efs {self.efs}, transport {a.transport}, "
                 f"resize at {a.resize_at}, "
                 f"script {a.script} {' '.join(a.script_args)}")
        self.event("launcher_start", pid=os.getpid(), transport=a.transport, resize_at=a.resize_at,
                   script=a.script, script_args=a.script_args, engine=a.engine, procs_per_node=self.procs)
        removed = self.store.clean(max_age=TMP_AGE_AT_START)     # what writers killed with us left
        if removed:
            self.out(f"removed unfinished checkpoint writes {removed}")
            self.event("checkpoint_leftovers_removed", names=removed)
        latest = self.resume_point()            # refuses when checkpoints exist and none verifies
        if latest and latest[1].get("finished"):
            self.out(f"training already finished (checkpoint {latest[0]}); nothing to do")
            return self._finish("finished", "already_finished", 0, step=latest[1]["step"])
        if self.master is None:
            self.master = self.members.master_from_file()
        hosts = self.wait_for_host_worker()
        if not hosts:
            message = f"no valid host_worker at {self.files.host_worker}: {self.members.error or 'no workers'}"
            self.out(f"ERROR: {message}; exiting")
            return self._finish("failed", "no_host_worker", 0 if self.shutdown else EXIT_NO_HOST_WORKER,
                                message=None if self.shutdown else message, error=self.members.error)
        if self.master is None:
            self.master = hosts[-1]
        self.membership = hosts
        self.state = "starting"
        self.spares.plan(hosts, self.master, parallel=True)   # everything the first generation needs
        return None

    def run(self):
        """Train until done or stopped; the exit status (``protocol``: final ones need a person)."""
        try:
            return self._run()
        except NoValidCheckpoint as exc:        # a person must choose what to resume from
            self.out(f"ERROR: {exc}")
            self._end_processes()
            return self._finish("failed", "no_valid_checkpoint", EXIT_GAVE_UP, message=str(exc))
        except Exception as exc:                # noqa: BLE001 - whatever it is, systemd restarts us
            return self._crashed(exc)

    def _crashed(self, exc):
        """An unexpected error: end the processes, say so, exit with a status systemd restarts."""
        detail = traceback.format_exc()
        try:
            self.out(f"ERROR: unexpected {type(exc).__name__}: {exc}; exiting with status {EXIT_CRASHED} "
                     f"(restarted; it resumes from the last checkpoint)\n{detail}")
            self._end_processes()
            self._finish("crashed", "crashed", EXIT_CRASHED, message=f"unexpected {type(exc).__name__}: {exc}",
                         traceback=detail[-4000:])
        except Exception:                       # noqa: BLE001 - the volume may be what failed
            traceback.print_exc()
        return EXIT_CRASHED

    def _end_processes(self):
        try:
            self.kill_everything()
        except Exception:                       # noqa: BLE001 - exiting anyway
            traceback.print_exc()

    def _run(self):
        code = self._start()
        if code is not None:
            return code
        while not self.shutdown:
            g = (self.inplace and self.inplace.start(self.membership)) or self.start_generation(self.membership)
            if self.pending_resize is not None:
                g.resize, self.pending_resize = self.pending_resize, None
                waited = g.resize.get("warm_wait_s", 0)                # training went on meanwhile
                g.resize["stop_s"] = round(g.started - g.resize["detected_at"] - waited, 3)
            outcome, info = self.monitor(g)
            self.step_time = g.step_time or self.step_time
            recovery = None
            if outcome == "failed":
                self.report_failure(g, info)
                if self.inplace is None or not self.inplace.can_recover(g, info):
                    recovery = self.recover(g, info)
            if self.inplace is None or not self.inplace.hold(g, outcome, info):
                self.teardown(g, outcome)
            if self.pending_resize is not None:
                self.pending_resize["stop_step"] = g.max_step     # how far the old group got
            if outcome == "done":
                self._train_done(g)
                break
            if outcome == "failed":
                self.handle_failure(g, info, recovery)
                if self.failures_without_progress > self.args.max_restarts:
                    message = (f"{self.failures_without_progress} consecutive failed generations without "
                               "progress; giving up")
                    self.out(f"ERROR: {message}")
                    self.kill_everything()
                    return self._finish("failed", "too_many_failures", EXIT_GAVE_UP, message=message)
            if self.shutdown:
                break
            if self.pending_resize is not None:      # detection -> the old group's last step (a kill: < 0)
                r = self.pending_resize
                r.setdefault("boundary_s", round(g.progress_at - r["detected_at"], 3))
            self._next_membership(outcome, g.lost(info) if outcome == "failed" else info)
        if self.inplace is not None:
            self.inplace.release(checkpoint=True)     # held survivors: rank 0 checkpoints their boundary
        return self._stop()

    def _train_done(self, g):
        self.state = "finished"
        if g.first_step_at is None:
            self.confirm(g.membership)
        self.out(f"training finished (generation {g.id}" + (")" if g.plain else f", step {g.max_step})"))
        self.event("train_done", generation=g.id, step=g.max_step, membership=g.membership)
        self.write_status(force=True)

    def _next_membership(self, outcome, info):
        hosts = self.members.read()
        self.membership = hosts if hosts is not None else self.members.last_good or self.membership
        if outcome == "failed":
            self.membership = [h for h in self.membership if h not in info or h == self.master]
        if self.pending_resize is not None:
            self.pending_resize["to"] = self.membership
            self.pending_resize["to_world"] = len(self.membership) * self.procs

    def _stop(self):
        self.kill_everything()
        if self.state != "finished":
            self.state = "stopped"
            latest = self.store.newest(self.reported_ckpt)
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
