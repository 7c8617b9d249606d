"""Pre-warmed processes (the framework already imported) waiting for a role, so a resize is mostly a reconnect.

MXNet: a worker per member host, the scheduler and the servers (``serve``).  torch: workers only
(``servers=False``): a pre-started training script that has imported torch -- and what
DistributedDataParallel imports -- and waits in ``Elastic()`` for its assignment.
"""

from __future__ import annotations

import collections
import threading

from .proc import reap


def server_hosts(num_servers, membership, master):
    """One host per parameter server: ``num_servers`` on the master, or one per member (``per-node``)."""
    if num_servers == "per-node":
        return list(membership)
    return [master] * int(num_servers)


def reap_later(procs, timeout=2.0):
    """End ``procs`` without blocking the caller: they are told to stop now, killed after ``timeout`` by
    a thread.  (A blocking reap here cost every resize that drops a host ~2 s before the launcher saw
    the new group's first step: an idle spare takes that long to go.)"""
    procs = [p for p in procs if p is not None]
    if not procs:
        return None
    for p in procs:
        p.terminate()
    t = threading.Thread(target=reap, args=(procs, timeout), name="reap-spares", daemon=True)
    t.start()
    return t


class SparePool:
    """Keeps one warm worker per member host, the scheduler on the master and the servers where they run.

    ``spawn(host, kind)`` starts a process (kind ``worker`` or ``serve``).  Spares are started
    while training runs one at a time per host (``warm_step``: a host imports MXNet once at a
    time, hosts in parallel, so a resize soon after another finds them warm again), all at
    once before the first generation.
    """

    def __init__(self, spawn, enabled=True, num_servers=1, depth=1, servers=True):
        self.spawn = spawn
        self.enabled = enabled
        self.servers = servers                # False (torch): no scheduler or server processes
        self.num_servers = num_servers
        self.depth = max(1, int(depth))       # sets of spares: 2 = a second change soon after one is warm too
        self.pools = collections.defaultdict(list)     # (host, kind) -> [Proc]
        self.want = {}
        self.pending = set()                  # hosts about to join (warm requests): their worker is kept
        self.members = set()                  # the membership of the last plan

    def take(self, host, kind):
        """A warm process for (host, kind) (a ready one first), or a new one."""
        key = (host, kind)
        pool = [p for p in self.pools[key] if p.alive()]
        pool.sort(key=lambda p: not p.ready)
        self.pools[key] = pool
        return pool.pop(0) if pool else self.spawn(host, kind)

    def plan(self, membership, master, parallel=False):
        """Plan the spares of the next generation; with ``parallel`` start them all now."""
        if not self.enabled:
            return
        self.members = set(membership)
        want = {(h, "worker"): self.depth for h in membership}
        serve = [master] + server_hosts(self.num_servers, membership, master) if self.servers else []
        for host, n in collections.Counter(serve).items():
            want[(host, "serve")] = n * self.depth      # the scheduler on the master, the servers
        self.want = want
        keep = {key for h in self.pending for key in self.joiner_keys(h)}   # expected joiners' (``expect``)
        for key in list(self.pools):
            if key not in want and key not in keep:
                reap_later(self.pools.pop(key))
        if parallel:
            while self.warm_step(limit=None):
                pass

    def warm_step(self, limit=1):
        """Start the next missing spare of each host that has fewer than ``limit`` importing MXNet."""
        warming = collections.Counter(p.host for p in self.procs() if p.alive() and not p.ready)
        started = False
        for key, n in sorted(self.want.items(), key=lambda kv: kv[0][1] != "serve"):
            host = key[0]
            if limit is not None and warming[host] >= limit:
                continue
            pool = [p for p in self.pools[key] if p.alive()]
            self.pools[key] = pool
            if len(pool) < n:
                pool.append(self.spawn(*key))
                warming[host] += 1
                started = True
        return started

    def prewarm(self, hosts):
        """Start a worker process on each of ``hosts`` now (new members: they join once warm)."""
        if not self.enabled:
            return
        for host in hosts:
            for key in self.joiner_keys(host):
                self.want[key] = max(1, self.want.get(key, 0))
                pool = [p for p in self.pools[key] if p.alive()]
                self.pools[key] = pool
                if not pool:
                    pool.append(self.spawn(*key))

    def joiner_keys(self, host):
        """What a host needs warm to join: its worker, and its server with ``per-node`` servers."""
        return [(host, "worker")] + ([(host, "serve")] if self.servers and self.num_servers == "per-node" else [])

    def joiner_warm(self, host):
        """``warm`` of everything ``host`` needs to join: True, False (starting) or None (one is dead)."""
        states = [self.warm(*key) for key in self.joiner_keys(host)]
        return None if None in states else all(states)

    def expect(self, hosts):
        """Hosts about to join (warm requests, not members yet): start a worker on each new one now and
        keep it until they join; a host no longer expected loses its spare unless it is a member.

        A host's process is started once per request (one that dies is not restarted here: the join
        then starts one, as without a request).  Returns the hosts started now.
        """
        hosts = set(hosts) if self.enabled else set()
        for host in self.pending - hosts:
            for key in self.joiner_keys(host):
                if host not in self.members and key not in self.want:     # (a joining host is in want)
                    reap_later(self.pools.pop(key, []))
        new = sorted(hosts - self.pending)
        self.pending = hosts
        for host in new:             # not in ``want``: warm_step never restarts one that died
            for key in self.joiner_keys(host):
                if not [p for p in self.pools[key] if p.alive()]:
                    self.pools[key].append(self.spawn(*key))
        return new

    def warm(self, host, kind="worker"):
        """True: a ready process waits for ``host``; False: one is starting; None: none is alive."""
        alive = [p for p in self.pools[(host, kind)] if p.alive()]
        if not alive:
            return None
        return any(p.ready for p in alive)

    def procs(self):
        return [p for pool in self.pools.values() for p in pool]

    def ready_count(self):
        return sum(1 for p in self.procs() if p.alive() and p.ready)

    def wanted_count(self):
        return sum(self.want.values()) if self.enabled else 0
