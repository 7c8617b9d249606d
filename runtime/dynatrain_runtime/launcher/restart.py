"""The restart launch strategy: a new set of processes per generation, each resuming from a checkpoint.

The path of the MXNet engine (ps-lite cannot change its worker count in place) and of scripts written
for torchrun; the in-place strategy (``inplace``) builds on it and falls back to it.  A strategy is
what the loop asks, in the spirit of torch's ``SimpleElasticAgent`` over its ``_start_workers`` /
``_stop_workers`` / ``_monitor_workers``:

* ``start(membership)``: the next generation's processes, assigned (a ``Generation``);
* ``change(g, reason, at)``: tell ``g`` that it ends at the next ``at`` boundary (a resize, a drain,
  a shutdown);
* ``in_effect(g, now)``: is ``g``'s membership in effect without a step report (a torchrun script);
* ``stop(g, outcome, info)``: end ``g``'s processes (or keep them: in place);
* ``recovers_in_place(g, failed)``, ``after_failure(g, record)``: how a lost worker is survived;
* ``release()``: the launcher ends: let go of anything still held.

Which engine's group a generation is (``MXNetLayout``: the scheduler and the servers; ``TorchLayout``:
torchrun's environment, no servers) is chosen once, with the strategy (``strategy.choose``).
"""

from __future__ import annotations

import threading
import time

from ..contract.protocol import stop_command
from ..contract.shared_volume import clear_stop_request
from .generation import Generation
from .ports import free_port
from .proc import Proc, reap
from .spares import server_hosts
from .torchenv import torch_worker_env
from .transport import worker_argv

PLAIN_ALIVE_S = 1.0         # a torchrun script's wrapper says "alive" this often
PLAIN_CONFIRM_S = 2.0       # a torchrun script's group is in effect once all its processes lived this long


class MXNetLayout:
    """An MXNet generation: the scheduler on the master, the servers, one worker per host (ps-lite)."""

    servers = True                          # spares: the scheduler and the servers too

    @staticmethod
    def node_note(procs):                   # pylint: disable=unused-argument  # its worker uses every GPU
        return ""

    @staticmethod
    def serve_argv(python):
        """The pre-warmed ps-lite scheduler/server process (a spare of kind ``serve``)."""
        return [python, "-m", "dynatrain_runtime.engines.mxnet_serve"]

    @staticmethod
    def group(launcher, g, membership, port, gen_env):
        """``(servers, {host: worker env}, how they connect)``: the scheduler and servers are started here."""
        L = launcher
        servers = server_hosts(L.config.num_servers, membership, L.master)
        ps_env = dict(gen_env, DMLC_PS_ROOT_URI=L.master, DMLC_PS_ROOT_PORT=str(port),
                      DMLC_NUM_SERVER=str(len(servers)), DMLC_NUM_WORKER=str(len(membership)), PS_VERBOSE="0")
        # ps-lite has no membership change: every server (and the scheduler) is a new one each generation
        for role, host in [("scheduler", L.master)] + [("server", h) for h in servers]:
            proc = L.spares.take(host, "serve")
            proc.assign(role, g.id, dict(ps_env, DMLC_ROLE=role, DMLC_NODE_HOST=host))
            g.servers.append(proc)
        workers = {host: dict(ps_env, DMLC_ROLE="worker", DMLC_NODE_HOST=host) for host in membership}
        return servers, workers, f"scheduler {L.master}:{port}, {len(servers)} server(s)"


class TorchLayout:
    """A torch generation: torchrun's environment (a fresh rendezvous port each time), no servers."""

    servers = False                         # (so no ``serve_argv``: the spare pool starts no server)

    @staticmethod
    def node_note(procs):
        return f", {procs} process(es) per node"

    @staticmethod
    def group(launcher, g, membership, port, gen_env):     # pylint: disable=unused-argument
        L = launcher
        workers = torch_worker_env(membership, L.master, port, g.id, L.procs)
        return [], workers, f"rendezvous {L.master}:{port} (torch.distributed)"


LAYOUTS = {"mxnet": MXNetLayout, "torch": TorchLayout}     # engine -> its generation's layout


class Restart:
    """The restart strategy of a script that uses the helper API: warm spares assigned, a step boundary."""

    mode = "restart"
    plain = False                           # the script says its steps (``@@DT`` heartbeats)
    warm_spares = True

    def __init__(self, launcher, layout):
        self.launcher = launcher
        self.layout = layout
        self.servers = layout.servers

    def env(self):
        """What every process of this strategy gets in its environment beside the launcher's."""
        return {"DT_ASSIGN": "stdin"}       # a warm process waits for its generation's environment

    # ------------------------------------------------------------------ start
    def start(self, membership):
        L = self.launcher
        resume = L.resume_point()
        gid = L.intake.next_generation_id()
        # MXNet's scheduler and torch's store both bind on the master, beside the launcher's own metrics (9110 by
        # default, inside port_base..+499: every MXNet job's generation 19 failed to bind and recovered from its
        # checkpoint): a taken port is skipped
        port = free_port(L.config.port_base, gid)
        g = Generation(gid, membership, port, resume, plain=self.plain, procs=L.procs)
        L.joining = None
        clear_stop_request(L.files)
        gen_env = {"DT_GENERATION": str(gid)}
        if resume:
            gen_env["DT_RESUME_PATH"] = resume[0]
        else:
            gen_env["DT_RESUME"] = "none"
        servers, worker_env, connect = self.layout.group(L, g, membership, port, gen_env)
        for host in membership:
            g.workers[host] = self._worker(host, gid, dict(gen_env, **worker_env[host]))
        L.spares.plan(membership, L.master)   # what to replace (warmed once this group trains)
        L.gen = g
        L.state = "running" if g.resize is None else "resizing"
        start = f"resume from step {g.resume_step} ({resume[0]})" if resume else "fresh start"
        per_node = f" x {L.procs} processes" if L.procs > 1 else ""
        L.out(f"generation {gid}: {len(membership)} worker(s){per_node} {membership}, {connect}, {start}")
        L.event("generation_start", generation=gid, membership=membership, world=g.world, port=port,
                procs_per_node=L.procs,
                servers=servers, engine=L.config.engine,
                resume_step=g.resume_step, resume_path=resume[0] if resume else None)
        return g

    def _worker(self, host, gid, env):
        """The worker process of ``host`` in generation ``gid``: a warm spare, assigned its environment."""
        w = self.launcher.spares.take(host, "worker")
        w.assign("worker", gid, env)
        return w

    # ------------------------------------------------------------------ change and effect
    def change(self, g, reason, at):
        for w in g.workers.values():        # on stdin: each stops at the boundary the group agrees on
            w.send(stop_command(g.id, at, reason))

    def in_effect(self, g, now):            # pylint: disable=unused-argument
        return False                        # its first step report says so (``Launcher.on_first_step``)

    # ------------------------------------------------------------------ stop
    def stop(self, g, outcome, info):       # pylint: disable=unused-argument
        """Stop the generation's processes; the next generation need not wait for their exit."""
        L = self.launcher
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
        L.reapers.append(t)

    def release(self, g=None, checkpoint=True):     # pylint: disable=unused-argument
        """Nothing is held between generations on the restart path."""

    # ------------------------------------------------------------------ a lost worker
    def recovers_in_place(self, g, failed):         # pylint: disable=unused-argument
        return False

    def after_failure(self, g, record):
        self.launcher.out(f"generation {g.id}: resuming from the {record.recovered_from} at step "
                          f"{record.resume_step} ({record.recomputed_steps} completed step(s) to redo)")


class ScriptRestart(Restart):
    """A script written for torchrun (no helper API): each generation starts it with torchrun's
    environment, a change ends it (its wrapper says "exited") and starts it again, and it resumes from
    its own checkpoint -- torchrun's restart.  No warm spares, no step boundary, no survivor's state."""

    plain = True
    warm_spares = False

    def env(self):
        return {}

    def _worker(self, host, gid, env):
        """The script's process of generation ``gid``, its environment given at its start."""
        L = self.launcher
        cmd = L.transport.command(host, worker_argv(L.config), dict(L.static_env(host), **env), alive=PLAIN_ALIVE_S,
                                  procs=L.procs)
        proc = Proc(host, "worker", cmd, L.msgq, L.out, stdin_head=L.transport.stdin_head(host))
        proc.role, proc.generation, proc.label = "worker", gid, f"worker@{host}"
        proc.remote = not L.transport.is_local(host)     # ended through its wrapper, not its ssh (``end``)
        proc.assigned_at = proc.started
        return proc

    def change(self, g, reason, at):        # pylint: disable=unused-argument  # no boundary: ended
        for w in g.workers.values():
            w.end()     # ended (its wrapper says "exited"), started again (torchrun's way)

    def in_effect(self, g, now):
        """In effect once each of its processes has lived PLAIN_CONFIRM_S: it reports no steps, and one
        that fails at its start ends the group first."""
        return now - g.started >= PLAIN_CONFIRM_S and all(
            w.last_alive is not None and w.alive() for w in g.workers.values())

    def after_failure(self, g, record):
        record.set(recovered_from="script", resume_step=None, recomputed_steps=None)
        self.launcher.out(f"generation {g.id}: restarting the script on {record.to} "
                          "(it resumes from its own checkpoint)")
