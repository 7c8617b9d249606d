"""Checkpoint atomicity, stop requests, host_worker_log SEQ continuity, malformed host_worker."""
import json
import os
import threading

import pytest

from dynatrain_runtime.contract import checkpoint as d
from dynatrain_runtime.contract import shared_volume
from dynatrain_runtime.launcher import loop, parse_args


def payload_writer(size):
    def write(tmp):
        for name in ("params", "trainer.states"):
            with open(os.path.join(tmp, name), "wb") as handle:
                handle.write(os.urandom(size))
    return write


def test_checkpoint_reader_never_sees_half_written(tmp_path):
    store = d.CheckpointStore(str(tmp_path / "ckpt"), keep=2)
    stop = threading.Event()
    errors, seen = [], set()

    def reader():
        while not stop.is_set():
            for step in store.steps():
                path = store.path_for(step)
                try:
                    names = set(os.listdir(path))
                    with open(os.path.join(path, "meta.json")) as handle:
                        meta = json.load(handle)
                    sizes = [os.path.getsize(os.path.join(path, n)) for n in ("params", "trainer.states")]
                except FileNotFoundError:
                    continue            # pruned (renamed away) between listdir and open: fine
                if names != {"meta.json", "params", "trainer.states"} or meta["step"] != step \
                        or sizes != [200000, 200000]:
                    errors.append((step, names, sizes))
                seen.add(step)

    threads = [threading.Thread(target=reader) for _reader in range(3)]
    for t in threads:
        t.start()
    for step in range(1, 41):
        store.write(step, {"step": step}, payload_writer(200000))
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    assert seen
    assert store.steps() == [39, 40]                              # keep the last 2
    assert not [n for n in os.listdir(store.directory) if n.startswith(".")]   # no temp/trash left
    path, meta = store.latest()
    assert meta["step"] == 40 and path.endswith("ckpt-0000000040")


def test_failed_checkpoint_write_leaves_nothing(tmp_path):
    store = d.CheckpointStore(str(tmp_path / "ckpt"))
    store.write(1, {"step": 1}, payload_writer(10))

    def broken(tmp):
        payload_writer(10)(tmp)
        raise IOError("disk full")
    with pytest.raises(IOError):
        store.write(2, {"step": 2}, broken)
    assert store.steps() == [1]
    assert os.listdir(store.directory) == ["ckpt-0000000001"]


def test_same_step_is_not_rewritten(tmp_path):
    store = d.CheckpointStore(str(tmp_path / "ckpt"))
    p1 = store.write(5, {"step": 5, "v": 1})
    p2 = store.write(5, {"step": 5, "v": 2})
    assert p1 == p2 and store.latest()[1]["v"] == 1


def test_stop_request_roundtrip(tmp_path):
    files = shared_volume.JobFiles(str(tmp_path))
    assert shared_volume.read_stop_request(files) is None
    shared_volume.write_stop_request(files, 7, "resize", at="epoch")
    req = shared_volume.read_stop_request(files)
    assert req["generation"] == 7 and req["at"] == "epoch"
    assert files.stop_request == os.path.join(str(tmp_path), "control", "stop.json")
    shared_volume.clear_stop_request(files)
    shared_volume.clear_stop_request(files)
    assert shared_volume.read_stop_request(files) is None


def make_launcher(efs, master="127.0.0.1"):
    args = parse_args(["--efs-mount", str(efs), "--script", "/bin/true", "--transport", "local",
                       "--master", master])
    return loop.Launcher(args)


def read_log(efs):
    with open(os.path.join(str(efs), "host_worker_log")) as handle:
        return [line.split()[:3] for line in handle]


def test_log_seq_continues_across_launcher_restarts(tmp_path):
    la = make_launcher(tmp_path)
    la.members.confirm(["127.0.0.2", "127.0.0.1"])
    la.members.confirm(["127.0.0.2", "127.0.0.1"])            # idempotent: nothing new
    la.members.confirm(["127.0.0.2", "127.0.0.3", "127.0.0.1"])
    la.members.append_log("FAILED", "127.0.0.3")
    lb = make_launcher(tmp_path)                                  # "restart": state only from the files
    lb.members.confirm(["127.0.0.1"])                          # .2 removed while we were down
    lb.members.confirm(["127.0.0.4", "127.0.0.1"])
    assert read_log(tmp_path) == [
        ["0", "ADDED", "127.0.0.2"], ["1", "ADDED", "127.0.0.1"], ["2", "ADDED", "127.0.0.3"],
        ["3", "FAILED", "127.0.0.3"], ["4", "REMOVED", "127.0.0.2"], ["5", "ADDED", "127.0.0.4"]]
    ns = [int(line.split()[3]) for line in open(os.path.join(str(tmp_path), "host_worker_log"))]
    assert ns == sorted(ns)


def test_malformed_host_worker_keeps_last_good_membership(tmp_path):
    la = make_launcher(tmp_path, master="127.0.0.1")
    hw = os.path.join(str(tmp_path), "host_worker")
    with open(hw, "w") as handle:
        handle.write("127.0.0.2\n127.0.0.1\n")
    assert la.members.read() == ["127.0.0.2", "127.0.0.1"]
    for bad in ("127.0.0.2\nnot-an-ip\n127.0.0.1\n", "127.0.0.2\n", "127.0.0.1\n127.0.0.2\n", "", "1.2.3.4\n1.2.3.4\n"):
        with open(hw, "w") as handle:
            handle.write(bad)
        assert la.members.read() is None, bad
        assert la.members.error
    errors = [e for e in (json.loads(l) for l in open(os.path.join(str(tmp_path), "events.jsonl")))
              if e["event"] == "host_worker_error"]
    assert len(errors) == 5 and "not-an-ip" in errors[0]["error"] and "master" in errors[1]["error"]
    assert la.members.last_good == ["127.0.0.2", "127.0.0.1"]
    with open(hw, "w") as handle:
        handle.write("# comment\n127.0.0.3\n\n127.0.0.1\n")
    assert la.members.read() == ["127.0.0.3", "127.0.0.1"] and la.members.error is None


def test_drop_from_host_worker_is_atomic_and_keeps_master_last(tmp_path):
    la = make_launcher(tmp_path, master="127.0.0.1")
    hw = os.path.join(str(tmp_path), "host_worker")
    with open(hw, "w") as handle:
        handle.write("127.0.0.2\n127.0.0.3\n127.0.0.1\n")
    la.members.drop(["127.0.0.3"])
    assert open(hw).read() == "127.0.0.2\n127.0.0.1\n"
    assert os.path.exists(hw + ".lock")


def test_ssh_command_is_strict_and_has_no_secrets(tmp_path):
    args = parse_args(["--efs-mount", str(tmp_path), "--script", "/opt/dynatrain/venv/bin/dt-train-digits",
                       "--master", "10.0.0.1", "--python", "/opt/dynatrain/venv/bin/python",
                       "--", "--epochs", "3"])
    la = loop.Launcher(args)
    cmd = la.transport.command("10.0.0.7", ["/opt/dynatrain/venv/bin/python", args.script], {"A": "b c"})
    assert cmd[0] == "ssh" and "StrictHostKeyChecking=yes" in cmd and "BatchMode=yes" in cmd
    assert "StrictHostKeyChecking=no" not in " ".join(cmd)
    assert "admin@10.0.0.7" in cmd and "ServerAliveInterval=2" in cmd
    assert "child" in cmd[-1] and "'A=b c'" in cmd[-1]
    assert la.transport.command("10.0.0.1", ["x"], {})[0] != "ssh"      # the master runs locally
    assert args.script_args == ["--epochs", "3"]


def test_background_appender_keeps_the_order_and_flush_waits(tmp_path, monkeypatch):
    path = str(tmp_path / "events.jsonl")
    gate = threading.Event()
    real = shared_volume.append_jsonl

    def slow_append(p, record):          # the shared volume's lock + fsync, held until the test lets go
        gate.wait(5)
        real(p, record)

    monkeypatch.setattr(shared_volume, "append_jsonl", slow_append)
    appender = shared_volume.BackgroundAppender(path)
    for i in range(50):
        appender.put({"event": "epoch", "epoch": i})      # returns at once: the writer waits on the gate
    assert not os.path.exists(path)
    gate.set()
    appender.flush()
    with open(path) as handle:
        assert [json.loads(line)["epoch"] for line in handle] == list(range(50))


def test_background_appender_reports_a_failed_append(tmp_path, capsys):
    appender = shared_volume.BackgroundAppender(str(tmp_path / "missing-dir" / "events.jsonl"))
    appender.put({"event": "epoch"})
    appender.flush()                     # an error does not hang flush
    assert "cannot append to" in capsys.readouterr().err
    appender.put({"event": "epoch", "epoch": 2})     # the writer thread goes on after an error
    appender.flush()
