"""Pre-warmed processes and warm joins: the launcher's decisions with fake processes (no MXNet)."""
import os
import time

from dynatrain_runtime.launcher import loop, parse_args
from dynatrain_runtime.launcher.generation import Generation
from dynatrain_runtime.launcher.spares import SparePool

M, A, B = "127.0.0.1", "127.0.0.2", "127.0.0.3"


class FakeProc(object):
    def __init__(self, host, kind):
        self.host, self.kind, self.ready, self.rc = host, kind, False, None

    def alive(self):
        return self.rc is None

    def poll(self):
        return self.rc

    def terminate(self):
        self.rc = -15

    def kill(self):
        self.rc = -9

    class popen(object):           # noqa: N801 - what reap() waits on
        @staticmethod
        def wait(timeout=None):
            return 0


def pool(depth=1):
    started = []

    def spawn(host, kind):
        started.append(FakeProc(host, kind))
        return started[-1]
    return SparePool(spawn, True, 1, depth), started


def test_warm_step_starts_one_per_host_at_a_time_and_take_prefers_ready():
    spares, started = pool(depth=2)
    spares.plan([A, M], M)
    assert spares.wanted_count() == 2 + 2 + 4                 # two sets: workers on A and M, 2x(scheduler+server)
    assert spares.warm_step()
    assert sorted((p.host, p.kind) for p in started) == sorted([(A, "worker"), (M, "serve")])
    assert not spares.warm_step()                              # each host is still importing one
    started[0].ready = started[1].ready = True
    assert spares.warm_step() and len(started) == 4
    first_a = [p for p in started if p.host == A][0]
    assert spares.take(A, "worker") is first_a                 # the ready one, not the newest
    assert spares.warm(A) is False                             # the other one is still starting
    first_a.rc = 0
    assert spares.take(A, "worker").ready is False


def test_added_host_joins_once_its_process_is_warm(tmp_path):
    la = loop.Launcher(parse_args(["--efs-mount", str(tmp_path), "--script", "/bin/true", "--transport", "local",
                                   "--master", M, "--join-warm-timeout", "30"]))
    started = []

    def spawn(host, kind):
        started.append(FakeProc(host, kind))
        return started[-1]
    la.spares.spawn = spawn
    g = Generation(1, [A, M], 9000, None)
    la.members.confirm(g.membership)
    with open(os.path.join(str(tmp_path), "host_worker"), "w") as handle:
        handle.write(f"{A}\n{B}\n{M}\n")
    now = time.time()
    la._check_host_worker(g, now)
    assert g.stop_at is None and [(p.host, p.kind) for p in started] == [(B, "worker")]
    la._check_host_worker(g, now + 1)
    assert g.stop_at is None and len(started) == 1             # not started twice, still training
    started[0].ready = True
    la._check_host_worker(g, now + 2)
    assert g.stop_at is not None and la.pending_resize.added == [B]
    assert la.pending_resize.detected_at == now and la.pending_resize.warm_wait_s == 2
    assert la.spares.take(B, "worker") is started[0]


def test_a_host_that_cannot_start_joins_at_once_and_timeout_bounds_the_wait(tmp_path):
    la = loop.Launcher(parse_args(["--efs-mount", str(tmp_path), "--script", "/bin/true", "--transport", "local",
                                   "--master", M, "--join-warm-timeout", "5"]))
    started = []

    def spawn(host, kind):
        started.append(FakeProc(host, kind))
        return started[-1]
    la.spares.spawn = spawn
    g = Generation(1, [A, M], 9000, None)
    with open(os.path.join(str(tmp_path), "host_worker"), "w") as handle:
        handle.write(f"{A}\n{B}\n{M}\n")
    now = time.time()
    la._check_host_worker(g, now)
    assert g.stop_at is None and len(started) == 1
    started[0].rc = 255                                        # e.g. ssh: host unreachable
    la._check_host_worker(g, now + 1)                          # a dead spare: no point waiting
    assert g.stop_at is not None and len(started) == 1
    g2 = Generation(2, [A, M], 9001, None)
    la.joining = None                                          # as a new generation does
    la._check_host_worker(g2, now + 2)
    assert g2.stop_at is None and len(started) == 2            # one more try
    la._check_host_worker(g2, now + 8)                         # still importing after the timeout
    assert g2.stop_at is not None and la.pending_resize.warm_wait_s == 6


def _launcher_with_fakes(tmp_path, *extra):
    la = loop.Launcher(parse_args(["--efs-mount", str(tmp_path), "--script", "/bin/true", "--transport", "local",
                                   "--master", M, "--join-warm-timeout", "30"] + list(extra)))
    started = []

    def spawn(host, kind):
        started.append(FakeProc(host, kind))
        return started[-1]
    la.spares.spawn = spawn
    return la, started


def test_warm_request_starts_the_joiner_before_the_host_worker_edit(tmp_path):
    from dynatrain_runtime.contract.shared_volume import read_warm_requests, write_warm_request
    la, started = _launcher_with_fakes(tmp_path)
    g = Generation(1, [A, M], 9000, None)
    la.members.confirm(g.membership)
    with open(os.path.join(str(tmp_path), "host_worker"), "w") as handle:
        handle.write(f"{A}\n{M}\n")
    write_warm_request(la.files, B)
    now = time.time()
    la._check_host_worker(g, now)
    assert [(p.host, p.kind) for p in started] == [(B, "worker")] and g.stop_at is None
    la.spares.plan(g.membership, M)                            # a new plan keeps the expected joiner's process
    assert started[0].alive()
    la._check_host_worker(g, now + 1)
    assert len(started) == 1                                   # started once per request
    started[0].ready = True
    with open(os.path.join(str(tmp_path), "host_worker"), "w") as handle:
        handle.write(f"{A}\n{B}\n{M}\n")
    la._check_host_worker(g, now + 2)                          # warm already: the resize starts at once
    assert g.stop_at is not None and la.pending_resize.warm_wait_s == 0
    assert la.spares.take(B, "worker") is started[0] and len(started) == 1
    g2 = Generation(2, [A, B, M], 9001, None)
    la.intake.take_warm_requests(g2, now + 3)                        # a member now: the request is done
    assert read_warm_requests(la.files) == {}


def test_warm_request_of_a_host_that_never_joins_expires(tmp_path):
    from dynatrain_runtime.contract.shared_volume import read_warm_requests, write_warm_request
    la, started = _launcher_with_fakes(tmp_path)
    g = Generation(1, [A, M], 9000, None)
    write_warm_request(la.files, B, ttl=5)
    now = time.time()
    la.intake.take_warm_requests(g, now)
    assert len(started) == 1 and started[0].alive()
    started[0].rc = 255                                        # its process died: not restarted for the request
    la.intake.take_warm_requests(g, now + 1)
    assert len(started) == 1
    started.append(FakeProc(B, "worker"))
    la.spares.pools[(B, "worker")] = [started[-1]]
    la.intake.take_warm_requests(g, now + 10)                        # expired: request deleted, process ended
    assert read_warm_requests(la.files) == {} and not started[-1].alive()
    assert any(e == "warm_request_expired" for e in _events(tmp_path))


def _events(efs):
    import json
    with open(os.path.join(str(efs), "events.jsonl")) as handle:
        return [json.loads(line)["event"] for line in handle if line.strip()]


def test_per_node_servers_one_next_to_each_worker(tmp_path):
    assert parse_args(["--script", "x", "--num-servers", "per-node"]).num_servers == "per-node"
    assert parse_args(["--script", "x", "--servers", "3"]).num_servers == 3
    la, started = _launcher_with_fakes(tmp_path, "--num-servers", "per-node")
    sent = []
    FakeProc.assign = lambda self, role, gen, env: sent.append((self.host, role, env))
    try:
        g = la.strategy.start([A, B, M])
    finally:
        del FakeProc.assign
    assert [(h, r) for h, r, _env in sent][:4] == [(M, "scheduler"), (A, "server"), (B, "server"), (M, "server")]
    assert all(env["DMLC_NUM_SERVER"] == "3" and env["DMLC_NODE_HOST"] == h for h, _r, env in sent)
    assert len(g.servers) == 4 and la.spares.want[(M, "serve")] == 2 and la.spares.want[(A, "serve")] == 1
    assert la.spares.joiner_keys("127.0.0.4") == [("127.0.0.4", "worker"), ("127.0.0.4", "serve")]
