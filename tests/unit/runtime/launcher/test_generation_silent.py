"""A worker that stopped at the agreed boundary is not 'silent' while rank 0 still checkpoints.

Seen in bench_resize on a loaded machine: the non-rank-0 worker stopped, went quiet while its
interpreter exited, rank 0 needed > --dead-timeout to write the stop checkpoint, and the stopped
worker was logged FAILED (the job then redid hundreds of steps from an older checkpoint)."""
from __future__ import annotations

import time

from dynatrain_runtime.launcher.generation import Generation

A, M = "127.0.0.2", "127.0.0.1"


class _Worker:
    def __init__(self, host, stopped, last_alive):
        self.host, self.stopped, self.last_alive, self.last_hb = host, stopped, last_alive, None

    def poll(self):
        return None


def test_stopped_worker_is_not_silent_but_a_running_one_is():
    g = Generation(4, [A, M], 9000, None)
    old = time.monotonic() - 30
    g.workers = {A: _Worker(A, stopped=True, last_alive=old), M: _Worker(M, stopped=False, last_alive=old)}
    out = g.silent(time.monotonic(), {}, start_timeout=60, dead_timeout=6)
    assert list(out) == [M] and "no sign of life" in out[M]


def test_stopped_at_boundary_waits_for_rank_0():
    g = Generation(4, [A, M], 9000, None)
    g.stop_at = time.monotonic()
    now = time.monotonic()
    w0, w1 = _Worker(M, stopped=False, last_alive=now), _Worker(A, stopped=True, last_alive=now)
    w0.last_hb, w1.last_hb = {"rank": 0}, {"rank": 1}
    g.workers = {M: w0, A: w1}
    assert not g.stopped_at_boundary()
    w0.stopped = True
    assert g.stopped_at_boundary()
