"""Pre-warmed processes (MXNet already imported) waiting for a role, so a resize is mostly a reconnect."""

from __future__ import annotations

import collections

from .proc import reap


class SparePool:
    """Keeps one warm worker per member host and the scheduler + servers on the master.

    ``spawn(host, kind)`` starts a process (kind ``worker`` or ``serve``).  Spares are started
    one at a time while training runs (``warm_step``), all at once before the first generation.
    """

    def __init__(self, spawn, enabled=True, num_servers=1):
        self.spawn = spawn
        self.enabled = enabled
        self.num_servers = num_servers
        self.pools = collections.defaultdict(list)     # (host, kind) -> [Proc]
        self.want = {}

    def take(self, host, kind):
        """A warm process for (host, kind), or a new one."""
        pool = self.pools[(host, kind)]
        while pool:
            p = pool.pop(0)
            if p.alive():
                return p
        return self.spawn(host, kind)

    def plan(self, membership, master, parallel=False):
        """Plan the spares of the next generation; with ``parallel`` start them all now."""
        if not self.enabled:
            return
        want = {(h, "worker"): 1 for h in membership}
        want[(master, "serve")] = 1 + self.num_servers
        self.want = want
        for key in list(self.pools):
            if key not in want:
                reap(self.pools.pop(key), 2.0)
        if parallel:
            while self.warm_step(limit=None):
                pass

    def warm_step(self, limit=1):
        """Start the next missing spare unless ``limit`` spares are still importing MXNet."""
        warming = sum(1 for p in self.procs() if p.alive() and not p.ready)
        if limit is not None and warming >= limit:
            return False
        for key, n in sorted(self.want.items(), key=lambda kv: kv[0][1] != "serve"):
            pool = [p for p in self.pools[key] if p.alive()]
            self.pools[key] = pool
            if len(pool) < n:
                pool.append(self.spawn(*key))
                return True
        return False

    def procs(self):
        return [p for pool in self.pools.values() for p in pool]

    def ready_count(self):
        return sum(1 for p in self.procs() if p.alive() and p.ready)

    def wanted_count(self):
        return sum(self.want.values()) if self.enabled else 0
