"""The stop boundary the launcher chooses (protocol.stop_command / stop_at_command), without MXNet.

The workers' side is ``Elastic``'s channel handlers and its gate, driven here on a bare instance;
the real MXNet runs (test_local_runs, test_recovery) check that every worker stops at the same step.
"""
import json
import threading
import time

from dynatrain_runtime.contract import protocol
from dynatrain_runtime.script.elastic import Elastic
from dynatrain_runtime.launcher import loop, parse_args
from dynatrain_runtime.launcher.generation import Generation

M, A, B = "127.0.0.1", "127.0.0.2", "127.0.0.3"


class FakeWorker(object):
    def __init__(self, host):
        self.host, self.sent, self.last_hb = host, [], None

    def send(self, msg):
        self.sent.append(msg)
        return True

    def poll(self):
        return None


def test_boundary_is_one_past_the_furthest_worker():
    assert protocol.stop_at_command(4, [17, 18, 17], "step") == {"kind": "stop_at", "generation": 4, "step": 19,
                                                                 "at": "step"}
    cmd = protocol.stop_command(4, "epoch", "resize")
    assert cmd["kind"] == protocol.CMD_STOP and cmd["at"] == "epoch" and cmd["reason"] == "resize"


def test_launcher_sends_the_boundary_once_every_running_worker_answered(tmp_path):
    la = loop.Launcher(parse_args(["--efs-mount", str(tmp_path), "--script", "/bin/true", "--transport", "local",
                                   "--master", M]))
    g = Generation(2, [A, B, M], 9000, None)
    g.workers = {h: FakeWorker(h) for h in (A, B, M)}
    la.gen = g
    la.request_stop(g, "resize")
    assert [w.sent[0]["kind"] for w in g.workers.values()] == ["stop"] * 3
    la.handle_msg(g.workers[A], {"kind": "stop_ack", "generation": 2, "step": 40})
    la.handle_msg(g.workers[M], {"kind": "stop_ack", "generation": 1, "step": 99})    # another generation
    la.handle_msg(g.workers[M], {"kind": "stop_ack", "generation": 2, "step": 41})
    la.decide_stop(g)
    assert g.stop_boundary is None and all(len(w.sent) == 1 for w in g.workers.values())   # B has not answered
    g.exited[B] = 0                                                   # ... and never will: it finished
    la.decide_stop(g)
    la.decide_stop(g)                                                 # sent once
    assert g.stop_boundary == 42
    assert g.workers[A].sent[1:] == g.workers[M].sent[1:] == [{"kind": "stop_at", "generation": 2, "step": 42,
                                                               "at": "step"}]
    assert len(g.workers[B].sent) == 1


def bare_elastic(step, generation=3):
    el = Elastic.__new__(Elastic)
    el.generation, el.host, el.rank, el.step = generation, A, 1, step
    el._lock, el._stop_gate, el._stop_step, el._stop_mode = threading.Lock(), None, None, "step"
    el._stop_known = threading.Event()
    return el


def acks(capfd):
    out = capfd.readouterr().out
    return [json.loads(line[len(protocol.MSG_PREFIX):]) for line in out.splitlines()
            if line.startswith(protocol.MSG_PREFIX)]


def test_worker_answers_at_once_and_waits_at_most_one_step_for_the_boundary(capfd):
    el = bare_elastic(step=10)
    assert not el._stop_here(epoch_done=False)                        # no stop requested: never waits
    el._on_stop({"kind": "stop", "generation": 2})                    # an old generation's: ignored
    assert acks(capfd) == [] and el._stop_gate is None
    el._on_stop({"kind": "stop", "generation": 3, "at": "step"})
    el._on_stop({"kind": "stop", "generation": 3, "at": "step"})      # a repeat keeps the first answer
    got = acks(capfd)
    assert [(m["kind"], m["step"]) for m in got] == [("stop_ack", 10)] * 2
    el.step = 11                                                      # the one step it may still complete
    later = threading.Timer(0.3, el._on_stop_at, ({"kind": "stop_at", "generation": 3, "step": 12, "at": "step"},))
    t0 = time.time()
    later.start()
    assert not el._stop_here(epoch_done=False)                        # waited for the boundary: 12, go on
    assert time.time() - t0 >= 0.25
    el.step = 12
    assert el._stop_here(epoch_done=False)


def test_epoch_mode_stops_at_the_first_epoch_end_at_or_after_the_boundary():
    el = bare_elastic(step=5)
    el._on_stop({"kind": "stop", "generation": 3, "at": "epoch"})
    el._on_stop_at({"kind": "stop_at", "generation": 3, "step": 6, "at": "epoch"})
    el.step = 6
    assert not el._stop_here(epoch_done=False)
    el.step = 9
    assert el._stop_here(epoch_done=True)


def test_channel_holds_stop_commands_until_a_handler_is_registered():
    chan = protocol.StdinChannel()
    chan.held[protocol.CMD_STOP] = {"kind": "stop", "generation": 1}
    got = []
    chan.on(protocol.CMD_STOP, got.append)
    assert got == [{"kind": "stop", "generation": 1}] and chan.held == {}


# ---------------------------------------------------------------------- issue 12: limits and the resume path
def test_limits_scale_with_the_observed_step_time_over_floors(tmp_path):
    la = loop.Launcher(parse_args(["--efs-mount", str(tmp_path), "--script", "/bin/true", "--transport", "local",
                                   "--master", M, "--timeout-steps", "20"]))
    g = Generation(1, [A, M], 9000, None)
    assert la.limits(g) == (60.0, 12.0)                       # nothing observed: the floors (old defaults)
    g.first_step_at = time.time()
    w = FakeWorker(A)
    g.on_heartbeat(w, {"step": 10, "rank": 0})
    g._rate_ref = (g._rate_ref[0] - 30.0, g._rate_ref[1])     # 10 steps took 30 s: a slow model
    g.on_heartbeat(w, {"step": 20, "rank": 0})
    assert abs(g.step_time - 3.0) < 0.05
    start, stall = la.limits(g)
    assert abs(stall - 60.0) < 1.0 and abs(start - 60.0) < 1.0
    la.last_start_s = 40.0                                    # the last generation took 40 s to its first step
    assert la.limits(g)[0] > 2 * 40.0
    fresh = Generation(2, [A, M], 9001, None)                 # a new generation starts from the last one's rate
    la.step_time = g.step_time
    assert abs(la.limits(fresh)[1] - 60.0) < 1.0


def test_resume_prefers_the_path_its_writer_reported_over_a_lagging_listing(tmp_path):
    from dynatrain_runtime.contract.checkpoint import CheckpointStore
    store = CheckpointStore(str(tmp_path / "checkpoints"))
    store.write(5, {"step": 5})
    # a checkpoint the listing does not show yet (NFS attribute caching): here, outside the directory
    hidden = CheckpointStore(str(tmp_path / "elsewhere")).write(9, {"step": 9})
    assert store.latest()[1]["step"] == 5
    assert store.newest(hidden) == (hidden, {"step": 9, "files": {}})      # meta.json carries the digests
    older = CheckpointStore(str(tmp_path / "older")).write(3, {"step": 3})
    assert store.newest(older)[1]["step"] == 5                 # an older report does not win
    assert store.newest(str(tmp_path / "gone"))[1]["step"] == 5
    la = loop.Launcher(parse_args(["--efs-mount", str(tmp_path), "--script", "/bin/true", "--transport", "local",
                                   "--master", M]))
    g = Generation(1, [A, M], 9000, None)
    la.gen = g
    la.handle_msg(FakeWorker(M), {"kind": "checkpoint", "generation": 1, "step": 9, "path": hidden})
    assert la.resume_point() == (hidden, {"step": 9, "files": {}})


def test_resize_events_say_when_in_wall_clock_time():
    """detected_at in events.jsonl is wall-clock time, like every event's time (the launcher measures
    its intervals on the monotonic clock, which means nothing outside the process)."""
    import time as _time
    from dynatrain_runtime.launcher.resize import wall_clock_resize
    mono = _time.monotonic() - 2.0
    out = wall_clock_resize({"detected_at": mono, "reason": "add"})
    assert abs(out["detected_at"] - (_time.time() - 2.0)) < 0.5 and out["reason"] == "add"
    assert wall_clock_resize({"reason": "x"}) == {"reason": "x"}
