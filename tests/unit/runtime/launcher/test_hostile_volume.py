"""Issue 40: the shared volume is untrusted input.  Each test reproduces one finding of the issue on the
node runtime's own functions (a compromised worker, as the node user, writing on the volume) and
failed before the change."""
from __future__ import annotations

import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from dynatrain_runtime.contract import shared_volume as sv
from dynatrain_runtime.contract.checkpoint import CheckpointStore
from dynatrain_runtime.launcher import loop, parse_args
from dynatrain_runtime.launcher.generation import Generation
from dynatrain_runtime.launcher.proc import Proc
from dynatrain_runtime.launcher.records import Records

from conftest import ROOT  # the repository root (the runtime tests' conftest.py, one home for its depth)
M, A = "10.0.0.1", "10.0.0.2"


def planted_link(tmp_path, link, name="victim"):
    """``link`` made a symlink to a file outside the volume (the master's ~/.ssh/rc, say)."""
    victim = tmp_path / "home" / name
    victim.parent.mkdir(exist_ok=True)
    victim.write_bytes(b"ORIGINAL\n")
    os.makedirs(os.path.dirname(str(link)), exist_ok=True)
    os.symlink(str(victim), str(link))
    return victim


# ------------------------------------------------------------------ 1. nothing follows a link on the volume
def test_events_appends_never_follow_a_link(tmp_path):
    efs = tmp_path / "efs"
    files = sv.JobFiles(str(efs))
    victim = planted_link(tmp_path, files.events)
    with pytest.raises(OSError):
        sv.append_jsonl(files.events, {"event": "x", "reason": "$(id)"})
    assert victim.read_bytes() == b"ORIGINAL\n"
    os.unlink(files.events)
    os.unlink(files.events + ".lock")
    lock_victim = tmp_path / "home" / "rc"                     # the lock file too: never created through
    os.symlink(str(lock_victim), files.events + ".lock")
    with pytest.raises(OSError):
        sv.append_jsonl(files.events, {"event": "x"})
    assert not lock_victim.exists()
    # the launcher's records say so and go on
    os.unlink(files.events + ".lock")
    said = []
    records = Records(files)
    records.out = said.append
    os.symlink(str(victim), files.events)
    records.event("drain_requested", reason="x")
    assert victim.read_bytes() == b"ORIGINAL\n" and said


def test_a_linked_directory_on_the_volume_is_not_followed(tmp_path):
    efs = tmp_path / "efs"
    files = sv.JobFiles(str(efs))
    elsewhere = tmp_path / "home"
    elsewhere.mkdir()
    efs.mkdir()
    os.symlink(str(elsewhere), files.control)                  # control/ -> the master's home
    with pytest.raises(sv.HostWorkerError):
        sv.write_json(files.launcher_state, {"generation": 1})
    assert sv.read_json(files.launcher_state, "none") == "none"
    assert os.listdir(str(elsewhere)) == []


def test_atomic_write_replaces_a_planted_link_and_creates_its_temp_exclusively(tmp_path):
    efs = tmp_path / "efs"
    files = sv.JobFiles(str(efs))
    victim = planted_link(tmp_path, files.status)
    sv.write_json(files.status, {"state": "running"})
    assert victim.read_bytes() == b"ORIGINAL\n"
    assert not os.path.islink(files.status) and sv.read_status(files.status) == {"state": "running"}
    assert oct(os.stat(files.status).st_mode & 0o777) == oct(0o644)


def test_reads_refuse_a_fifo_instead_of_blocking(tmp_path):
    files = sv.JobFiles(str(tmp_path / "efs"))
    os.makedirs(files.control)
    os.mkfifo(files.launcher_state)
    done = []
    t = threading.Thread(target=lambda: done.append(sv.read_json(files.launcher_state, "skipped")), daemon=True)
    t.start()
    t.join(5)
    assert done == ["skipped"]


def render_runner(tmp_path, log):
    """The launcher role's runner, rendered for a local run of a program that prints a line."""
    import jinja2
    with open(os.path.join(ROOT, "roles", "launcher", "templates", "dynatrain-launcher-run.sh.j2")) as handle:
        text = jinja2.Template(handle.read()).render(ansible_managed="test", _launcher_defaults_file=str(
            tmp_path / "defaults"), _launcher_unit_file="unit")
    program = tmp_path / "program.py"
    program.write_text("print('launcher output')\n")
    settings = {"EFS_MOUNT": tmp_path / "efs", "DT_LAUNCHER_HOME": tmp_path, "DT_LAUNCHER_USER": "u",
                "DT_LAUNCHER_LOG": log, "DT_LAUNCHER_PYTHON": sys.executable, "DT_LAUNCHER_PROGRAM": program,
                "DT_LAUNCHER_RUN_DIR": tmp_path, "DT_LAUNCHER_SCRIPT": "s", "DT_LAUNCHER_ENGINE": "mxnet",
                "DT_LAUNCHER_TRANSPORT": "local", "DT_LAUNCHER_RESIZE_AT": "step", "DT_LAUNCHER_SERVERS": "1",
                "DT_LAUNCHER_EXTRA_ARGS": "", "DT_LAUNCHER_SCRIPT_ARGS": ""}
    (tmp_path / "defaults").write_text("".join(f"{k}='{v}'\n" for k, v in settings.items()))
    runner = tmp_path / "run.sh"
    runner.write_text(text)
    return runner


def test_the_runner_never_appends_through_a_link(tmp_path):
    log = tmp_path / "efs" / "logs" / "launcher.log"
    runner = render_runner(tmp_path, log)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    assert subprocess.run(["/bin/sh", str(runner)], env=env, timeout=60, capture_output=True, check=False).returncode == 0
    assert "launcher output" in log.read_text()                    # the log as before
    log.unlink()
    victim = planted_link(tmp_path, log)
    result = subprocess.run(["/bin/sh", str(runner)], env=env, timeout=60, capture_output=True, check=False)
    assert result.returncode == 0 and (tmp_path / "exit").read_text().strip() == "0"   # the job goes on
    assert victim.read_bytes() == b"ORIGINAL\n"
    assert b"not logging to the launcher log" in result.stderr and b"launcher output" in result.stdout


# ------------------------------------------------------------------ 3. backups that cannot go quiet
boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")
from conftest import mock_bucket  # noqa: E402  pylint: disable=wrong-import-position
from dynatrain_runtime.daemons import s3sync  # noqa: E402  pylint: disable=wrong-import-position

BUCKET, PREFIX = "dt-hostile", "c/j/"
URL = f"s3://{BUCKET}/{PREFIX}"


@pytest.fixture
def s3(monkeypatch):
    with mock_bucket(monkeypatch, BUCKET) as client:
        yield client


def keys(client):
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=PREFIX)
    return sorted(o["Key"][len(PREFIX):] for p in pages for o in p.get("Contents", []))


def bodies(client):
    return [client.get_object(Bucket=BUCKET, Key=PREFIX + k)["Body"].read() for k in keys(client)]


def latest(client):
    return json.loads(client.get_object(Bucket=BUCKET, Key=PREFIX + "LATEST.json")["Body"].read())


def make_ckpt(efs, step, nested=False):
    def payload(tmp):
        with open(os.path.join(tmp, "params"), "wb") as handle:
            handle.write(os.urandom(512))
        if nested:
            os.makedirs(os.path.join(tmp, "shards"))
            with open(os.path.join(tmp, "shards", "0.bin"), "wb") as handle:
                handle.write(os.urandom(256))
    return CheckpointStore(os.path.join(str(efs), "checkpoints"), keep=10).write(step, {"step": step}, payload)


def test_a_linked_job_file_is_never_uploaded_and_the_pass_is_an_error(s3, tmp_path):
    efs = tmp_path / "efs"
    make_ckpt(efs, 10)
    key = tmp_path / "home" / "id_ed25519"
    planted_link(tmp_path, efs / "results" / "final.json", name="id_ed25519")
    key.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (efs / "host_worker_log").write_text("0 ADDED 10.0.0.1 1\n")
    sync = s3sync.Sync(str(efs), URL, client=s3)
    assert sync.run_pass() is False
    assert not any(b"PRIVATE KEY" in body for body in bodies(s3))
    assert "results/final.json" not in keys(s3) and "host_worker_log" in keys(s3)   # the others still go
    state = json.loads((efs / "control" / "s3sync.json").read_text())
    assert "not uploaded" in state["error"]


def test_a_linked_checkpoint_file_is_never_uploaded(s3, tmp_path):
    efs = tmp_path / "efs"
    make_ckpt(efs, 10)
    path = make_ckpt(efs, 20)
    secret = tmp_path / "home" / "secret"
    secret.parent.mkdir()
    secret.write_bytes(b"SECRET")
    os.unlink(os.path.join(path, "params"))
    os.symlink(str(secret), os.path.join(path, "params"))
    assert s3sync.Sync(str(efs), URL, client=s3).run_pass()
    assert latest(s3)["step"] == 10 and not any(b"SECRET" in body for body in bodies(s3))


def test_a_forged_meta_without_digests_never_becomes_latest_nor_prunes_good_ones(s3, tmp_path):
    efs = tmp_path / "efs"
    for step in (10, 20):
        make_ckpt(efs, step)
    sync = s3sync.Sync(str(efs), URL, keep=2, client=s3)
    assert sync.run_pass()
    forged = efs / "checkpoints" / "ckpt-9999999999"
    forged.mkdir()
    (forged / "meta.json").write_text('{"step": 9999999999}')
    assert sync.run_pass()
    assert latest(s3)["step"] == 20
    assert not [k for k in keys(s3) if "9999999999" in k]
    uploaded = {k.split("/")[1] for k in keys(s3) if k.startswith("checkpoints/")}
    assert uploaded == {"ckpt-0000000010", "ckpt-0000000020"}
    state = json.loads((efs / "control" / "s3sync.json").read_text())
    assert "ckpt-9999999999" in state["skipped"]
    assert CheckpointStore(str(efs / "checkpoints")).resume_point()[1]["step"] == 20


def test_a_nested_checkpoint_is_uploaded_and_restored_and_later_passes_work(s3, tmp_path):
    efs = tmp_path / "efs"
    make_ckpt(efs, 10, nested=True)
    sync = s3sync.Sync(str(efs), URL, client=s3)
    assert sync.run_pass()
    assert "checkpoints/ckpt-0000000010/shards/0.bin" in keys(s3)
    make_ckpt(efs, 20, nested=True)
    assert sync.run_pass() and latest(s3)["step"] == 20
    dst = tmp_path / "dst"
    dst.mkdir()
    assert s3sync.restore(str(dst), URL, client=s3)["step"] == 20
    assert CheckpointStore(str(dst / "checkpoints")).latest()[1]["step"] == 20


def test_a_new_run_on_the_prefix_is_backed_up(s3, tmp_path):
    """The NoValidCheckpoint advice (move checkpoints/ away, start over) left every new checkpoint below
    S3's LATEST: none was uploaded and each pass said success; a teardown then lost the new run."""
    efs = tmp_path / "efs"
    for step in (10, 20, 30):
        make_ckpt(efs, step)
    sync = s3sync.Sync(str(efs), URL, keep=2, client=s3)
    assert sync.run_pass() and latest(s3)["step"] == 30
    shutil.move(str(efs / "checkpoints"), str(efs / "checkpoints.old"))
    new = make_ckpt(efs, 5)
    assert sync.run_pass()
    assert latest(s3)["step"] == 5
    with open(os.path.join(new, "meta.json"), "rb") as handle:
        assert s3.get_object(Bucket=BUCKET, Key=PREFIX + "checkpoints/ckpt-0000000005/meta.json")[
            "Body"].read() == handle.read()
    # the new run reaches a step the old one had in S3: its objects replace the old ones, whole
    path30 = make_ckpt(efs, 30)
    assert sync.run_pass() and latest(s3)["step"] == 30
    with open(os.path.join(path30, "params"), "rb") as handle:
        assert s3.get_object(Bucket=BUCKET, Key=PREFIX + "checkpoints/ckpt-0000000030/params")[
            "Body"].read() == handle.read()


# ------------------------------------------------------------------ 4. engine edge cases
def test_the_metrics_server_caps_idle_connections(tmp_path):
    from dynatrain_runtime.launcher.metrics import serve
    server = serve("127.0.0.1", 0, lambda: "dynatrain_up 1\n", lambda text: None, timeout=1.0, max_connections=8)
    port = server.server_address[1]
    before = threading.active_count()
    conns = []
    try:
        for _conn in range(300):
            conns.append(socket.create_connection(("127.0.0.1", port)))
        time.sleep(0.5)
        assert threading.active_count() <= before + 8
    finally:
        for c in conns:
            c.close()
    time.sleep(1.5)                                 # idle ones timed out: slots free again
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert b"dynatrain_up 1" in resp.read()
    server.shutdown()


def test_the_give_up_counter_counts_failures_in_a_row_without_progress(tmp_path):
    la = loop.Launcher(parse_args(["--efs-mount", str(tmp_path), "--script", "/bin/true", "--transport", "local",
                                   "--master", M, "--script-api", "torchrun", "--engine", "torch"]))
    for _try in range(3):                              # each failed within seconds of its start: no progress
        g = Generation(1, [A, M], 9000, None, plain=True)
        g.first_step_at = g.failed_at = time.monotonic()
        la.failures.count(g)
    assert la.failures.without_progress == 3
    g = Generation(2, [A, M], 9000, None, plain=True)   # trained an hour, then its script failed
    g.first_step_at = time.monotonic() - 3600
    g.failed_at = time.monotonic()
    la.failures.count(g)
    assert la.failures.without_progress == 1
    g = Generation(3, [A, M], 9000, None)           # the helper API: steps past its resume point
    g.max_step = 5
    la.failures.count(g)
    assert la.failures.without_progress == 1


def test_a_remote_plain_worker_is_ended_through_its_wrapper(tmp_path):
    """A torchrun script's stop SIGTERMed the ssh client, which exits at once while the remote command is
    still ending: the new generation started beside the old processes.  Here a process in a session of
    its own stands for the remote wrapper behind "ssh" (sh, which dies on SIGTERM without waiting)."""
    marker = tmp_path / "ended"
    script = tmp_path / "script.py"
    script.write_text("import signal, sys, time\n"
                      "def end(*_):\n"
                      f"    time.sleep(1.0); open({str(marker)!r}, 'w').write('x'); sys.exit(0)\n"
                      "signal.signal(signal.SIGTERM, end)\n"
                      "print('started', flush=True)\n"
                      "time.sleep(60)\n")
    wrapper = [sys.executable, "-m", "dynatrain_runtime.launcher", "child", "--alive", "0.5", "--",
               sys.executable, str(script)]
    # (an asynchronous list's stdin is /dev/null: fd 3 carries the real one to it)
    ssh = ["/bin/sh", "-c", 'exec 3<&0; setsid -w "$@" <&3 3<&- & wait $!', "ssh"] + wrapper
    msgq = queue.Queue()
    proc = Proc(A, "worker", ssh, msgq, lambda text: None)
    proc.remote = True
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(m.get("kind") == "alive" for _p, m in list(msgq.queue)):
        time.sleep(0.1)
    time.sleep(0.5)
    proc.end()
    deadline = time.monotonic() + 20
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is not None
    assert marker.exists()                          # the remote command had ended when "ssh" exited
    kinds = [m.get("kind") for _p, m in list(msgq.queue)]
    assert "exited" in kinds
