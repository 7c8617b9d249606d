"""The launcher's main loop: one generation after another, each watched until done, stopped or failed.

A change of ``host_worker`` is applied at the next step boundary (``--resize-at step``,
default) or epoch boundary (``--resize-at epoch``, DT's behaviour): stop request ->
every worker stops at the same boundary, rank 0 checkpoints, all exit -> the process
group is rebuilt with the new membership -> it resumes from exactly that step (the restart
path; in place, the survivors pause at the boundary and stay: ``inplace``).
A lost worker is logged ``FAILED``, dropped from ``host_worker``, and the job resumes
from the state of the last completed step, which one survivor writes as a recovery
checkpoint when asked (``--recovery survivor``, default); only when no survivor gives it
within ``--recover-timeout`` does it resume from the last regular checkpoint.
SIGTERM: stop at the next boundary, checkpoint, exit 0.
A script written for torchrun (``--script-api torchrun``: no helper API) is run as torchrun runs
it: each generation starts it with torchrun's environment, a change ends it (SIGTERM) and starts
it again with the new membership, and it resumes from its own checkpoint.
The loop runs over a launch strategy (``strategy``: ``restart``, ``inplace``), chosen once from the
engine, the script API and ``--resize-mode``; the control requests on the volume are taken by
``intake``, a failed generation is handled by ``failures``, a change is told by a ``ResizeRecord``.
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
import time
import traceback

from ..contract.checkpoint import TMP_AGE_AT_START, CheckpointStore, NoValidCheckpoint
from ..contract.protocol import EXIT_CRASHED, EXIT_GAVE_UP, EXIT_NO_HOST_WORKER, MSG_STOP_ACK, stop_at_command
from ..contract.shared_volume import JobFiles, clear_stop_request, write_stop_request
from .config import as_config
from .failures import FailureHandling
from .generation import clean_message
from .intake import ControlIntake
from .membership import Membership
from .metrics import Metrics, serve as serve_metrics
from .proc import Proc, reap
from .records import Records
from .resize import ResizeRecord
from .spares import SparePool
from .strategy import choose
from .transport import Transport, secret_env, worker_argv


RETRY_WRITES_S = 5.0        # s between two tries of a failed host_worker_log append or host_worker edit


class Launcher:
    def __init__(self, config):
        self.config = config = as_config(config)     # built once (``cli``); read, never changed
        self.files = JobFiles(config.efs_mount, config.checkpoint_dir)
        self.efs = self.files.efs
        self.store = CheckpointStore(self.files.checkpoints)
        self.records = Records(self.files, config.status_interval)
        self.out, self.event = self.records.out, self.records.event
        self.store.warn = self._checkpoint_skipped
        self.exit = None                        # why the launcher ended (status.json), once it did
        self.retry_writes_at = 0.0              # monotonic: when to retry failed log/host_worker writes
        self.members = Membership(self.files, self.records, master=config.master)
        self.transport = Transport(config.transport, config.python, config.ssh_user, config.ssh_key,
                                   config.known_hosts, config.ssh_connect_timeout, config.local_ip,
                                   secrets=secret_env())
        # torch: a host's process is its wrapper, which runs this many (one per GPU: LOCAL_RANK)
        self.procs = config.procs
        self.intake = ControlIntake(self)       # drain and warm requests, the generation counter
        self.failures = FailureHandling(self)   # a lost worker, survivor recovery, the give-up counter
        self.strategy = choose(self)            # restart or in place: how generations start, change, stop
        self.spares = SparePool(self.spawn, config.warm_spares and self.strategy.warm_spares, config.num_servers,
                                config.spare_depth, servers=self.strategy.servers)
        self.master = config.master             # the transport runs the master's processes locally
        self.msgq = queue.Queue()
        self.metrics_server = None
        self.shutdown = None                    # reason once SIGTERM/SIGINT arrived
        self.membership = []
        self.state = "starting"
        self.gen = None
        self.pending_resize = None              # the ResizeRecord of the change the next generation makes
        self.reapers = []
        self.joining = None                     # hosts being added: {"hosts", "since"} while they warm up
        self.reported_ckpt = None               # the newest checkpoint path a worker reported writing
        self.step_time = 0.0                    # the last generation's observed s/step (timeouts scale)
        self.last_start_s = 0.0                 # the last generation's start -> first step, s
        self.judge_silence_after = 0.0          # monotonic: no silence judged before (see _note_own_stall)

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
                "resize_at": self.config.resize_at, "spares_ready": self.spares.ready_count(),
                "spares_wanted": self.spares.wanted_count(),
                "joiners_warm": [h for h in sorted(self.spares.pending) if self.spares.joiner_warm(h)],
                "exit": self.exit, "engine": self.config.engine}

    def write_status(self, force=False):
        self.records.status(self._snapshot, force=force)

    # ------------------------------------------------------------------ metrics
    def start_metrics(self):
        """Prometheus metrics on ``--metrics-port`` (0: none); counters from every event written."""
        if not self.config.metrics_port or self.metrics_server is not None:
            return
        metrics = Metrics(sync_state=self.files.s3sync_state)
        self.records.observe = metrics.observe
        self.metrics_server = serve_metrics(self.config.metrics_address, self.config.metrics_port,
                                            lambda: metrics.render(self._snapshot(), self.host_states()), self.out)

    def host_states(self):
        """{ip: state} for the metrics: training in the group, joining (warm request), draining (spot)."""
        g = self.gen
        states = {ip: "training" for ip in (g.membership if g else self.membership)}
        for ip in list(self.spares.pending):
            states.setdefault(ip, "joining")
        for ip in list(self.intake.draining):
            states[ip] = "draining"
        return states

    # ------------------------------------------------------------------ processes
    def static_env(self, host):
        c = self.config
        env = {"EFS_MOUNT": self.efs, "DT_WORKER_IP": host, "PYTHONUNBUFFERED": "1",
               "DT_EVENTS": self.files.events, "DT_CHECKPOINT_DIR": self.store.directory,
               "DT_RESIZE_AT": c.resize_at, "DT_MASTER_IP": self.master or "",
               "DT_RECOVERY": c.recovery, "DT_ENGINE": c.engine}
        env.update(self.strategy.env())         # the helper API's: a warm process waits for its assignment
        if c.omp_threads:
            for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MXNET_CPU_WORKER_NTHREADS"):
                env[key] = str(c.omp_threads)
        for item in c.env:
            key, _sep, value = item.partition("=")
            env[key] = value
        return env

    def spawn(self, host, kind):
        """A warm process (the spare pool's): a worker, or a scheduler/server (``serve``: the layout's)."""
        argv = worker_argv(self.config) if kind == "worker" else self.strategy.layout.serve_argv(self.config.python)
        cmd = self.transport.command(host, argv, self.static_env(host), procs=self.procs if kind == "worker" else 1)
        return Proc(host, kind, cmd, self.msgq, self.out, stdin_head=self.transport.stdin_head(host))

    # ------------------------------------------------------------------ generations
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
        at = "epoch" if (reason == "resize" and self.config.resize_at == "epoch") else "step"   # drains: step
        g.stop_mode = at
        self.strategy.change(g, reason, at)                      # first: the workers are told
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
        self.failures.progressed(g)
        self.state = "running"
        self.intake.confirm(g.membership)
        if g.resize is not None:
            r = g.resize
            stop_step = g.resume_step if r.stop_step is None else r.stop_step
            r.set(first_step_s=round(g.first_step_at - g.started, 3),
                  total_s=round(g.first_step_at - r.detected_at, 3),
                  first_step=int(msg.get("step", 0)), world=g.world, generation=g.id,
                  resume_step=g.resume_step,
                  recomputed_steps=None if g.plain else max(0, stop_step - g.resume_step))   # plain: the script's
            if msg.get("phases"):               # where the restart went, s after the assignment (this worker)
                r.phases = dict(msg["phases"], host=proc.host)
            self.out(f"resize done: world {r.from_world} -> {g.world} in {r.total_s:.2f} s "
                     f"(stop {r.stop_s or 0.0:.2f} s, restart {r.first_step_s:.2f} s)")
            self.event("resize_end", **r.event_fields())
        self.spares.plan(g.membership, self.master)
        self.write_status(force=True)

    # ------------------------------------------------------------------ watching a generation
    def drain_messages(self):
        """Handle the workers' messages: the first within 0.1 s, then whatever is queued."""
        try:
            proc, msg = self.msgq.get(timeout=0.1)
            self.handle_msg(proc, msg)
            while True:
                proc, msg = self.msgq.get_nowait()
                self.handle_msg(proc, msg)
        except queue.Empty:
            pass

    def _check_host_worker(self, g, now):
        """Start a resize when host_worker names another membership (or a node asked to be drained)."""
        self._retry_membership_writes(now)
        self.intake.take_drains(g)
        self.intake.take_warm_requests(g, now)
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
        r = self.pending_resize = ResizeRecord.for_change(g, hosts, self.procs, since, now, self.config.resize_at,
                                                          self.intake.draining)
        boundary = "step" if r.drained else self.config.resize_at
        self.state = "resizing"
        self.request_stop(g, r.reason or "resize")                  # before the records: they fsync
        self.out(f"host_worker changed: +{added} -{removed} -> resize at the next {boundary} boundary")
        self.event("resize_start", **r.event_fields())

    def _retry_membership_writes(self, now=None):
        """Write the log lines and host_worker edits that failed before (a lock held, a volume error);
        from the loop (``now``) at most every RETRY_WRITES_S: each try may wait for the lock."""
        if not self.members.behind() or (now is not None and now < self.retry_writes_at):
            return
        self.retry_writes_at = time.monotonic() + RETRY_WRITES_S
        unconfirmed = self.members.retry()
        if unconfirmed is not None:
            self.intake.confirm(unconfirmed)

    def _joiners_warm(self, added, now):
        """True once every added host has a warm process (or one of them cannot start one, or it took
        ``--join-warm-timeout`` s): a resize then pauses training for a reconnect, not for a cold start."""
        if not self.spares.enabled or self.config.join_warm_timeout <= 0:
            return True
        if self.joining is None:
            self.joining = {"since": now, "hosts": set()}
        new = [h for h in added if h not in self.joining["hosts"]]
        if new:                                 # once: a process that dies is not started again here
            self.joining["hosts"].update(new)
            self.spares.prewarm(new)
            self.out(f"host_worker adds {new}: starting their processes; training goes on until they are warm")
        states = [self.spares.joiner_warm(h) for h in added]
        return all(states) or None in states or now - self.joining["since"] >= self.config.join_warm_timeout

    def limits(self, g):
        """``(start, stall)`` limits, s: the options are floors; a slow model gets --timeout-steps of its
        observed step time (this generation's, else the last one's), and a start at least twice the last
        generation's (checkpoint load and connection included)."""
        a = self.config
        step_time = g.step_time or self.step_time
        stall = max(a.stall_timeout, a.timeout_steps * step_time)
        start = max(a.start_timeout, 2.0 * self.last_start_s + a.timeout_steps * step_time)
        return start, stall

    def _failures(self, g, now):
        a = self.config
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
        if g.stop_at is not None and not failed and now - g.stop_at > self.config.stop_timeout:
            self.out(f"generation {g.id}: workers did not stop within {self.config.stop_timeout:.0f} s; "
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
        if g.finished_training():               # the rest is exiting: the strategy's stop gives them a moment, then ends them
            return "done", {}
        return None

    def monitor(self, g):
        """Run generation ``g`` until it finishes, stops or fails. Returns (outcome, info)."""
        next_hw = 0.0
        last_tick = time.monotonic()
        while True:
            self.drain_messages()
            now = time.monotonic()
            self._note_own_stall(now - last_tick, now)
            last_tick = now
            if self.shutdown and g.stop_at is None:
                self.request_stop(g, "shutdown")
            if now >= next_hw:
                next_hw = now + self.config.poll_interval
                self._check_host_worker(g, now)
            self.decide_stop(g)
            if g.first_step_at is None and g.stop_at is None and self.strategy.in_effect(g, now):
                self.on_first_step(g, None, {"step": g.resume_step})      # (a torchrun script reports no steps)
            result = self._outcome(g, now, self._failures(g, now))
            if result is not None:
                return result
            self.write_status()

    def _note_own_stall(self, gap, now):
        """A loop turn far longer than its 0.1 s means this process was frozen (SIGSTOP, a paused VM,
        swapping): the readers' backlog is not queued yet and every worker would look silent.  Judge
        silence and stalls again only a full dead timeout after we run again."""
        if gap > self.config.dead_timeout / 2:
            self.judge_silence_after = now + self.config.dead_timeout
            self.out(f"the launcher itself was stalled for {gap:.1f} s; no worker is judged silent "
                     f"for the next {self.config.dead_timeout:.0f} s")

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
        deadline = time.monotonic() + self.config.wait_host_worker
        while not self.shutdown:
            hosts = self.members.read()
            if hosts:
                return hosts
            if time.monotonic() > deadline:
                return None
            time.sleep(self.config.poll_interval)
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
        a = self.config
        self.intake.open()
        self.install_signals()
        self.start_metrics()
        per_node = self.strategy.layout.node_note(self.procs)
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
            g = self.strategy.start(self.membership)
            if self.pending_resize is not None:
                g.resize, self.pending_resize = self.pending_resize, None
                waited = g.resize.warm_wait_s or 0                     # training went on meanwhile
                g.resize.stop_s = round(g.started - g.resize.detected_at - waited, 3)
            outcome, info = self.monitor(g)
            self.step_time = g.step_time or self.step_time
            recovery = None
            if outcome == "failed":
                self.failures.report(g, info)
                if not self.strategy.recovers_in_place(g, info):
                    recovery = self.failures.recover(g, info)
            self.strategy.stop(g, outcome, info)        # its processes end (in place: survivors may stay)
            if self.pending_resize is not None:
                self.pending_resize.stop_step = g.max_step     # how far the old group got
            if outcome == "done":
                self._train_done(g)
                break
            if outcome == "failed":
                self.pending_resize = self.failures.handle(g, info, recovery)
                if self.failures.gave_up():
                    message = (f"{self.failures.without_progress} consecutive failed generations without "
                               "progress; giving up")
                    self.out(f"ERROR: {message}")
                    self.kill_everything()
                    return self._finish("failed", "too_many_failures", EXIT_GAVE_UP, message=message)
            if self.shutdown:
                break
            if self.pending_resize is not None:      # detection -> the old group's last step (a kill: < 0)
                r = self.pending_resize
                if r.boundary_s is None:
                    r.boundary_s = round(g.progress_at - r.detected_at, 3)
            self._next_membership(outcome, g.lost(info) if outcome == "failed" else info)
        self.strategy.release(checkpoint=True)      # held survivors: rank 0 checkpoints their boundary
        return self._stop()

    def _train_done(self, g):
        self.state = "finished"
        if g.first_step_at is None:
            self.intake.confirm(g.membership)
        self.out(f"training finished (generation {g.id}" + (")" if g.plain else f", step {g.max_step})"))
        self.event("train_done", generation=g.id, step=g.max_step, membership=g.membership)
        self.write_status(force=True)

    def _next_membership(self, outcome, info):
        hosts = self.members.read()
        self.membership = hosts if hosts is not None else self.members.last_good or self.membership
        if outcome == "failed":
            self.membership = [h for h in self.membership if h not in info or h == self.master]
        if self.pending_resize is not None:
            self.pending_resize.to = self.membership
            self.pending_resize.to_world = len(self.membership) * self.procs

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
