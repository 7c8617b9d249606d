"""What the product's own crashes leave behind must not stop or rewind training (issue 24, node side).

1. a torn or malformed host_worker_log line, a lock held too long, an unexpected error: never final;
2. a damaged newest checkpoint: the newest one that verifies is used, pruning keeps it, a job whose
   checkpoints all fail is refused (never a silent start from step 0); killed writers' leftovers go;
3. the events writer survives any error and ``flush`` is bounded;
7. a wall-clock step does not mark workers FAILED; a warm request's age is the launcher's own.

The launcher's decisions with fake processes (no MXNet).
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import threading
import time

import pytest

from dynatrain_runtime.contract import checkpoint as ck
from dynatrain_runtime.contract import shared_volume
from dynatrain_runtime.contract import shared_volume as hwf
from dynatrain_runtime.launcher import loop, membership, parse_args
from dynatrain_runtime.launcher.generation import Generation
from dynatrain_runtime.contract.protocol import EXIT_CRASHED, EXIT_GAVE_UP, EXIT_NO_HOST_WORKER

M, A, B = "127.0.0.1", "127.0.0.2", "127.0.0.3"
from conftest import ROOT  # the repository root (the runtime tests' conftest.py, one home for its depth)


def launcher(efs, *extra):
    return loop.Launcher(parse_args(["--efs-mount", str(efs), "--script", "/bin/true", "--transport", "local",
                                     "--master", M, *extra]))


def events(efs, name=None):
    try:
        with open(os.path.join(str(efs), "events.jsonl")) as handle:
            evs = [json.loads(line) for line in handle if line.strip()]
    except OSError:
        return []
    return [e for e in evs if name is None or e["event"] == name]


def status(efs):
    with open(os.path.join(str(efs), "status.json")) as handle:
        return json.load(handle)


def log_text(efs):
    with open(os.path.join(str(efs), "host_worker_log")) as handle:
        return handle.read()


class held_lock(object):
    """Another writer holding ``<path>.lock`` (flock is per open file: a second open conflicts)."""

    def __init__(self, path):
        self.fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def release(self):
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


# ---------------------------------------------------------------------- 1. host_worker_log, crashes
def test_torn_last_log_line_is_repaired_and_the_launcher_goes_on(tmp_path):
    la = launcher(tmp_path)
    la.members.confirm([A, B, M])
    with open(os.path.join(str(tmp_path), "host_worker_log"), "a") as handle:
        handle.write("3 REMOV")                                  # a writer killed mid-append
    assert la.members.logged_members() == [A, B, M]               # the torn line is no entry
    assert la.members.confirm([A, M]) == [B]                      # (raised HostWorkerError before)
    lines = [line.split()[:3] for line in log_text(tmp_path).splitlines()]
    assert lines == [["0", "ADDED", A], ["1", "ADDED", B], ["2", "ADDED", M], ["3", "REMOVED", B]]
    warned = events(tmp_path, "host_worker_log_warning")
    assert [(e["kind"], e["lines"]) for e in warned] == [("torn", ["3 REMOV"])]


def test_malformed_log_line_is_reported_once_and_skipped(tmp_path):
    la = launcher(tmp_path)
    la.members.confirm([A, M])
    with open(os.path.join(str(tmp_path), "host_worker_log"), "a") as handle:
        handle.write("2 ADDED 127.0.0.999 5\n")
    la.members.confirm([A, B, M])
    la.members.append_log("FAILED", B)
    # (by the address: a line's nanosecond timestamp may hold "999" too)
    seqs = [line.split()[0] for line in log_text(tmp_path).splitlines() if line.split()[2] != "127.0.0.999"]
    assert seqs == ["0", "1", "2", "3"]                         # next SEQ after the last good line
    warned = events(tmp_path, "host_worker_log_warning")
    assert len(warned) == 1 and warned[0]["kind"] == "malformed"


def test_log_lock_timeout_is_not_fatal_and_the_line_is_written_later(tmp_path, monkeypatch):
    monkeypatch.setattr(membership, "LOCK_TIMEOUT", 0.2)
    la = launcher(tmp_path)
    la.members.confirm([A, M])
    other = held_lock(os.path.join(str(tmp_path), "host_worker_log"))
    try:
        la.members.append_log("FAILED", A)                        # (raised HostWorkerError before)
        la.intake.confirm([M])
        assert la.members.behind() and "could not lock" in la.members.log_error
        assert len(log_text(tmp_path).splitlines()) == 2
    finally:
        other.release()
    la._retry_membership_writes()                                 # the loop's next poll
    assert not la.members.behind()
    assert [line.split()[1:3] for line in log_text(tmp_path).splitlines()] == [
        ["ADDED", A], ["ADDED", M], ["FAILED", A]]                # FAILED first, no REMOVED after it
    assert [e["event"] for e in events(tmp_path) if e["event"].startswith("host_worker_log_")] == [
        "host_worker_log_error", "host_worker_log_ok"]


def test_host_worker_drop_with_its_lock_held_is_retried(tmp_path, monkeypatch):
    monkeypatch.setattr(membership, "LOCK_TIMEOUT", 0.2)
    la = launcher(tmp_path)
    hw = os.path.join(str(tmp_path), "host_worker")
    with open(hw, "w") as handle:
        handle.write(f"{A}\n{B}\n{M}\n")
    assert la.members.read() == [A, B, M]
    other = held_lock(hw)
    try:
        la.members.drop([B])                                     # (raised HostWorkerError before)
        assert la.members.read() == [A, M]                       # gone for the launcher already
    finally:
        other.release()
    la._retry_membership_writes()
    assert open(hw).read() == f"{A}\n{M}\n" and not la.members.behind()


def test_unexpected_error_exits_with_a_status_systemd_restarts(tmp_path, monkeypatch, capsys):
    la = launcher(tmp_path)

    def boom():
        raise RuntimeError("something nobody foresaw")
    monkeypatch.setattr(la, "_start", boom)
    assert la.run() == EXIT_CRASHED
    st = status(tmp_path)
    assert st["state"] == "crashed" and st["exit"]["reason"] == "crashed"
    assert "something nobody foresaw" in st["exit"]["message"]
    assert "something nobody foresaw" in capsys.readouterr().err
    unit = open(os.path.join(ROOT, "roles", "launcher", "templates", "dynatrain-launcher.service.j2")).read()
    final = {int(c) for c in re.search(r"^RestartPreventExitStatus=(.*)$", unit, re.M).group(1).split()}
    assert EXIT_CRASHED not in final and {EXIT_GAVE_UP, EXIT_NO_HOST_WORKER} <= final
    assert "Restart=on-failure" in unit


def test_no_valid_host_worker_is_final_and_says_why(tmp_path, capsys):
    la = launcher(tmp_path, "--wait-host-worker", "0")
    with open(os.path.join(str(tmp_path), "host_worker"), "w") as handle:
        handle.write("not-an-ip\n")
    assert la.run() == EXIT_NO_HOST_WORKER
    st = status(tmp_path)
    assert st["exit"]["reason"] == "no_host_worker" and "not-an-ip" in st["exit"]["message"]
    assert "no valid host_worker" in capsys.readouterr().err


# ---------------------------------------------------------------------- 2. checkpoints
def payload(size=1000):
    def write(tmp):
        for name in ("params", "trainer.states"):
            with open(os.path.join(tmp, name), "wb") as handle:
                handle.write(os.urandom(size))
    return write


def damage(path, name="params"):
    with open(os.path.join(path, name), "r+b") as handle:
        first = handle.read(1)
        handle.seek(0)
        handle.write(bytes([first[0] ^ 0xFF]))                  # one flipped byte, same size


def test_meta_records_a_digest_of_every_file_and_load_verifies(tmp_path):
    store = ck.CheckpointStore(str(tmp_path / "ckpt"))
    path = store.write(10, {"step": 10}, payload())
    meta = json.load(open(os.path.join(path, "meta.json")))
    assert sorted(meta["files"]) == ["params", "trainer.states"]
    assert all(len(f["sha256"]) == 64 and f["bytes"] == 1000 for f in meta["files"].values())
    assert ck.load_meta(path) == meta
    damage(path)
    with pytest.raises(ck.CheckpointError, match="params does not match its digest"):
        ck.load_meta(path)                                       # what a worker's attach() calls
    os.unlink(os.path.join(path, "trainer.states"))
    with pytest.raises(ck.CheckpointError, match="missing|digest"):
        ck.verify(path, meta)


def test_damaged_newest_checkpoint_falls_back_to_the_newest_that_verifies(tmp_path):
    store = ck.CheckpointStore(str(tmp_path / "ckpt"), keep=3)
    for step in (10, 20, 30):
        store.write(step, {"step": step}, payload())
    damage(store.path_for(30))
    with open(os.path.join(store.path_for(20), "meta.json"), "w") as handle:
        handle.write('{"step": 2')                               # torn meta.json
    fresh = ck.CheckpointStore(store.directory)
    assert fresh.latest()[0] == store.path_for(10)               # (the damaged newest, or None, before)
    assert fresh.newest(store.path_for(30))[0] == store.path_for(10)      # a reported path verifies too
    assert sorted(fresh.damaged) == [store.path_for(20), store.path_for(30)]
    warned = []
    fresh.warn = lambda path, why: warned.append(path)
    assert fresh.resume_point()[1]["step"] == 10 and warned == []           # each reported once


def test_a_checkpoint_without_digests_never_verifies(tmp_path):
    """Issue 40: any node can write ``{"step": 9999999999}`` on the volume; accepted, it became the resume
    point (and S3's LATEST).  Without digests it is skipped for the newest one that verifies."""
    good = ck.CheckpointStore(str(tmp_path / "ckpt")).write(10, {"step": 10, "epoch": 0}, payload())
    path = tmp_path / "ckpt" / "ckpt-9999999999"
    path.mkdir(parents=True)
    (path / "params").write_bytes(b"x" * 10)
    (path / "meta.json").write_text('{"step": 9999999999, "epoch": 0}')
    store = ck.CheckpointStore(str(tmp_path / "ckpt"))
    assert store.resume_point()[0] == good
    assert "no 'files' digests" in store.damaged[str(path)]


def test_a_listing_error_is_an_error_not_no_checkpoints(tmp_path, monkeypatch):
    store = ck.CheckpointStore(str(tmp_path / "ckpt"))
    store.write(10, {"step": 10})
    real = os.listdir

    def failing(path="."):
        if str(path) == store.directory:
            raise OSError(5, "Input/output error")
        return real(path)
    monkeypatch.setattr(os, "listdir", failing)
    with pytest.raises(ck.CheckpointError, match="cannot list"):
        store.latest()                                           # (None, "fresh start", before)
    assert ck.CheckpointStore(str(tmp_path / "none-yet")).steps() == []


def test_pruning_never_removes_the_newest_checkpoint_that_verifies(tmp_path):
    ck.CheckpointStore(str(tmp_path / "ckpt"), keep=3).write(10, {"step": 10}, payload())
    first = ck.CheckpointStore(str(tmp_path / "ckpt"), keep=3)
    for step in (20, 30):
        first.write(step, {"step": step}, payload())
        damage(first.path_for(step))
    store = ck.CheckpointStore(str(tmp_path / "ckpt"), keep=2)   # resumed from 10, writes 15
    store.write(15, {"step": 15}, payload())
    assert store.steps() == [15, 20, 30]                          # (only 20 and 30 were kept before)
    assert store.latest()[1]["step"] == 15
    rewritten = store.write(30, {"step": 30, "again": True}, payload())   # the same step, written again
    assert ck.load_meta(rewritten)["again"] is True               # not the damaged one standing in for it


def test_launcher_refuses_to_start_when_no_checkpoint_verifies(tmp_path, capsys):
    store = ck.CheckpointStore(os.path.join(str(tmp_path), "checkpoints"))
    for step in (10, 20):
        damage(store.write(step, {"step": step}, payload()))
    la = launcher(tmp_path, "--wait-host-worker", "0")
    assert la.run() == EXIT_GAVE_UP                             # final: a person decides, never step 0
    st = status(tmp_path)
    assert st["exit"]["reason"] == "no_valid_checkpoint" and "none verifies" in st["exit"]["message"]
    assert "ckpt-0000000020" in st["exit"]["message"] and "refusing to start from step 0" in st["exit"]["message"]
    assert "none verifies" in capsys.readouterr().err
    assert [e["path"] for e in events(tmp_path, "checkpoint_damaged")] == [store.path_for(20), store.path_for(10)]


def test_launcher_resumes_from_the_newest_checkpoint_that_verifies(tmp_path):
    store = ck.CheckpointStore(os.path.join(str(tmp_path), "checkpoints"))
    for step in (10, 20):
        store.write(step, {"step": step}, payload())
    damage(store.path_for(20))
    la = launcher(tmp_path)
    assert la.resume_point()[0] == store.path_for(10)


def test_killed_writers_leftovers_are_cleaned_up(tmp_path):
    directory = tmp_path / "checkpoints"
    old, young = directory / ".tmp-ckpt-0000000040-dead", directory / ".tmp-ckpt-0000000050-live"
    for leftover in (old, young):
        leftover.mkdir(parents=True)
        (leftover / "params").write_bytes(b"half")
    os.utime(str(old), (time.time() - 600, time.time() - 600))
    la = launcher(tmp_path, "--wait-host-worker", "0")
    la.run()                                                      # no host_worker: it stops after its start
    assert sorted(os.listdir(str(directory))) == [young.name]     # a live writer's (young) one stays
    os.utime(str(young), (time.time() - 2 * ck.TMP_MAX_AGE, time.time() - 2 * ck.TMP_MAX_AGE))
    ck.CheckpointStore(str(directory)).write(1, {"step": 1})     # any writer's prune
    assert os.listdir(str(directory)) == ["ckpt-0000000001"]


# ---------------------------------------------------------------------- 3. the events writer
def run_bounded(fn, timeout=10):
    """Call ``fn`` on a thread; fail (rather than hang the test run) when it does not return."""
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("value", fn()), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{fn} did not return within {timeout} s"
    return box["value"]


def test_events_writer_survives_a_lock_timeout_and_reports_it(tmp_path, monkeypatch, capsys):
    path = str(tmp_path / "events.jsonl")
    real = shared_volume.append_jsonl
    calls = []

    def flaky(p, record):
        calls.append(record)
        if len(calls) == 1:
            raise hwf.HostWorkerError(f"could not lock {p}.lock within 30 s: another writer holds it")
        real(p, record)
    monkeypatch.setattr(shared_volume, "append_jsonl", flaky)
    appender = shared_volume.BackgroundAppender(path)
    appender.put({"event": "epoch", "epoch": 0})
    appender.put({"event": "epoch", "epoch": 1})
    assert run_bounded(appender.flush) is True                   # (hung forever before: the thread was dead)
    assert [json.loads(line)["epoch"] for line in open(path)] == [1]
    assert len(appender.errors) == 1 and "could not lock" in appender.errors[0][1]
    assert "could not lock" in capsys.readouterr().err


def test_events_record_is_checked_when_put(tmp_path):
    appender = shared_volume.BackgroundAppender(str(tmp_path / "events.jsonl"))
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        appender.put({"event": "epoch", "loss": object()})
    appender.put({"event": "epoch", "loss": 0.5})
    assert run_bounded(appender.flush) is True


def test_events_flush_is_bounded(tmp_path, monkeypatch, capsys):
    gate = threading.Event()
    monkeypatch.setattr(shared_volume, "append_jsonl", lambda p, record: gate.wait(10))   # a stalled volume
    appender = shared_volume.BackgroundAppender(str(tmp_path / "events.jsonl"))
    appender.put({"event": "train_end"})
    t0 = time.monotonic()
    assert run_bounded(lambda: appender.flush(timeout=0.3)) is False
    assert time.monotonic() - t0 < 5
    assert "not written" in capsys.readouterr().err
    gate.set()


# ---------------------------------------------------------------------- 7. clocks
class FakeWorker(object):
    """A worker process that is alive until ``until`` (monotonic) and then exits 0."""

    def __init__(self, host, until):
        self.host, self.until = host, until
        self.last_alive = self.last_hb = None
        self.stopped = self.ready = False

    def poll(self):
        return 0 if time.monotonic() >= self.until else None

    def alive(self):
        return self.poll() is None

    def send(self, msg):
        return True


def test_a_wall_clock_step_does_not_mark_workers_failed(tmp_path, monkeypatch):
    la = launcher(tmp_path)
    with open(os.path.join(str(tmp_path), "host_worker"), "w") as handle:
        handle.write(f"{A}\n{M}\n")
    g = Generation(1, [A, M], 9000, None)
    la.gen = g
    g.workers = {h: FakeWorker(h, time.monotonic() + 1.5) for h in (A, M)}
    for w in g.workers.values():
        la.handle_msg(w, {"kind": "alive"})
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 60.0)     # NTP steps the wall clock a minute ahead
    assert la.monitor(g) == ("done", {})                         # (both FAILED: "no sign of life", before)
    assert not events(tmp_path, "worker_failed")


def test_warm_request_age_is_judged_by_the_launcher_not_the_controllers_clock(tmp_path):
    la = launcher(tmp_path)
    expected = []
    la.spares.expect = lambda hosts: expected.append(list(hosts)) or []
    g = Generation(1, [A, M], 9000, None)
    path = os.path.join(shared_volume.warm_dir(la.files), f"{B}.json")
    shared_volume.write_json(path, {"ip": B, "ttl": 900, "time": time.time() - 3600})   # controller an hour behind
    t0 = time.monotonic()
    la.intake.take_warm_requests(g, t0)
    la.intake.take_warm_requests(g, t0 + 899)
    assert expected == [[B], [B]] and B in shared_volume.read_warm_requests(la.files)
    la.intake.take_warm_requests(g, t0 + 901)                          # ttl after the launcher first saw it
    assert shared_volume.read_warm_requests(la.files) == {}
    assert [e["ip"] for e in events(tmp_path, "warm_request_expired")] == [B]


def test_a_killed_writers_leftover_is_removed_when_the_job_ends(tmp_path):
    """Found by the fault campaign: systemd restarts a killed launcher after 2 s, so the start's age rule
    kept a killed writer's temp directory (a whole copy of the model) for good."""
    directory = tmp_path / "checkpoints"
    leftover = directory / ".tmp-ckpt-0000000060-killed"
    leftover.mkdir(parents=True)
    (leftover / "params").write_bytes(b"half")
    la = launcher(tmp_path)
    la.gen = Generation(1, [A, M], 9000, None)                   # this launcher ran a generation
    la.kill_everything()
    assert not leftover.exists()


def test_a_frozen_launcher_does_not_blame_its_workers(tmp_path):
    """Found by the fault campaign: after SIGSTOP/CONT of the launcher its readers' backlog is not queued
    yet, so every worker looked silent for the length of the freeze and healthy ones were logged FAILED."""
    la = launcher(tmp_path)
    g = Generation(1, [A, M], 9000, None)
    now = time.monotonic()
    g.workers = {h: FakeWorker(h, now + 60) for h in (A, M)}
    for w in g.workers.values():
        w.last_alive = now - 10.0                                 # as seen right after a 10 s freeze
    la._note_own_stall(10.0, now)
    assert la._failures(g, now) == {}
    assert la._failures(g, now + la.config.dead_timeout + 0.1)    # a real silence is still caught later
