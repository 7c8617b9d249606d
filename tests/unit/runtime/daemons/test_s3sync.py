"""dt-checkpoint-sync / dt-checkpoint-restore against moto's in-process S3 (no server, no network)."""
import json
import os
import shutil
import signal
import stat
import threading
import time

import pytest

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")
from conftest import mock_bucket  # noqa: E402  pylint: disable=wrong-import-position

from dynatrain_runtime.daemons import s3sync  # noqa: E402
from dynatrain_runtime.contract.checkpoint import CheckpointStore  # noqa: E402

BUCKET = "dt-ckpt-test"
URL = "s3://%s/c1/job1/" % BUCKET
PREFIX = "c1/job1/"


@pytest.fixture
def s3(monkeypatch):
    with mock_bucket(monkeypatch, BUCKET) as client:
        yield client


def put_calls(client):
    """Every PutObject (key, SSE) in call order (small uploads are single PutObjects)."""
    calls = []
    client.meta.events.register(
        "before-parameter-build.s3.PutObject",
        lambda params, **_: calls.append((params["Key"][len(PREFIX):], params.get("ServerSideEncryption"))))
    return calls


def keys(client, under=""):
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=PREFIX + under)
    return sorted(o["Key"][len(PREFIX):] for p in pages for o in p.get("Contents", []))


def body(client, key):
    return client.get_object(Bucket=BUCKET, Key=PREFIX + key)["Body"].read()


def make_ckpt(efs, step, epoch=0, keep=10):
    def payload(tmp):
        for name in ("params", "trainer.states"):
            with open(os.path.join(tmp, name), "wb") as handle:
                handle.write(os.urandom(2048) + name.encode())
    return CheckpointStore(os.path.join(str(efs), "checkpoints"), keep=keep).write(
        step, {"step": step, "epoch": epoch, "pos": 0}, payload)


def write(path, text):
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(str(path), "w") as handle:
        handle.write(text)


def state(efs):
    with open(os.path.join(str(efs), "control", "s3sync.json")) as handle:
        return json.load(handle)


def test_pass_uploads_meta_last_and_latest_after(s3, tmp_path):
    make_ckpt(tmp_path, 10, epoch=0)
    make_ckpt(tmp_path, 20, epoch=1)
    write(tmp_path / "host_worker_log", "0 ADDED 10.0.0.1 1\n")
    calls = put_calls(s3)
    sync = s3sync.Sync(str(tmp_path), URL, keep=2, client=s3)
    assert sync.run_pass()
    order = [k for k, _sse in calls]
    for step in (10, 20):
        ckpt = "checkpoints/ckpt-%010d/" % step
        mine = [i for i, k in enumerate(order) if k.startswith(ckpt)]
        assert order[mine[-1]] == ckpt + "meta.json"                 # meta.json after its payload
        assert len(mine) == 3
        latest_after = [i for i, k in enumerate(order) if k == "LATEST.json" and i > mine[-1]]
        assert latest_after                                          # LATEST.json only after it
    assert order.index("LATEST.json") > max(i for i, k in enumerate(order) if "ckpt-0000000010" in k)
    assert all(sse == "AES256" for _k, sse in calls)
    assert s3.head_object(Bucket=BUCKET, Key=PREFIX + "LATEST.json")["ServerSideEncryption"] == "AES256"
    latest = json.loads(body(s3, "LATEST.json"))
    assert latest["checkpoint"] == "checkpoints/ckpt-0000000020/" and latest["step"] == 20 and latest["epoch"] == 1
    local = CheckpointStore(str(tmp_path / "checkpoints")).path_for(20)
    for name in ("params", "trainer.states", "meta.json"):
        with open(os.path.join(local, name), "rb") as handle:
            assert body(s3, "checkpoints/ckpt-0000000020/" + name) == handle.read()
    st = state(tmp_path)
    assert st["error"] is None and st["last_step"] == 20 and st["url"] == URL and st["uploaded_bytes"] > 4 * 2048


def test_half_written_and_trash_dirs_never_uploaded(s3, tmp_path):
    make_ckpt(tmp_path, 10)
    for hidden in (".tmp-ckpt-0000000030-abc", ".trash-ckpt-0000000005-1"):
        write(tmp_path / "checkpoints" / hidden / "params", "half")
        write(tmp_path / "checkpoints" / hidden / "meta.json", json.dumps({"step": 30}))
    assert s3sync.Sync(str(tmp_path), URL, client=s3).run_pass()
    assert not [k for k in keys(s3) if ".tmp" in k or ".trash" in k or "0000000030" in k]
    assert json.loads(body(s3, "LATEST.json"))["step"] == 10


def test_prune_keeps_newest_and_latest_only_moves_forward(s3, tmp_path):
    sync = s3sync.Sync(str(tmp_path), URL, keep=2, client=s3)
    for step in (10, 20):
        make_ckpt(tmp_path, step)
    assert sync.run_pass()
    make_ckpt(tmp_path, 30)
    assert sync.run_pass()
    assert {k.split("/")[1] for k in keys(s3, "checkpoints/")} == {"ckpt-0000000020", "ckpt-0000000030"}
    assert len(keys(s3, "checkpoints/")) == 6
    # A volume behind S3 whose newest checkpoint S3 holds (the same run, an older copy): never moved back.
    shutil.rmtree(CheckpointStore(str(tmp_path / "checkpoints")).path_for(30))
    assert sync.run_pass()
    assert json.loads(body(s3, "LATEST.json"))["step"] == 30
    # A new run on the prefix (checkpoints/ moved away, started over): backed up, LATEST moves back to it
    # (issue 40: it was skipped, and the pass said success); the old run's newer copy is left alone.
    shutil.rmtree(str(tmp_path / "checkpoints"))
    make_ckpt(tmp_path, 25)
    assert sync.run_pass()
    assert json.loads(body(s3, "LATEST.json"))["step"] == 25
    assert len(keys(s3, "checkpoints/ckpt-0000000025/")) == 3
    assert len(keys(s3, "checkpoints/ckpt-0000000030/")) == 3
    assert state(tmp_path)["restarted"]["previous_latest"] == 30


def test_checkpoint_pruned_mid_pass_is_skipped(s3, tmp_path):
    make_ckpt(tmp_path, 10)
    make_ckpt(tmp_path, 20)
    sync = s3sync.Sync(str(tmp_path), URL, keep=2, client=s3)
    real_upload = sync._upload
    doomed = CheckpointStore(str(tmp_path / "checkpoints")).path_for(10)

    def upload_then_prune(fileobj, key, size):
        real_upload(fileobj, key, size)
        if "ckpt-0000000010" in key and os.path.isdir(doomed):   # the launcher prunes it meanwhile
            trash = os.path.join(str(tmp_path / "checkpoints"), ".trash-ckpt-0000000010-1")
            os.rename(doomed, trash)
            shutil.rmtree(trash)
    sync._upload = upload_then_prune
    assert sync.run_pass(), state(tmp_path)["error"]
    assert state(tmp_path)["error"] is None
    assert json.loads(body(s3, "LATEST.json"))["step"] == 20
    # Its partial upload (no meta.json) is older than LATEST and incomplete: pruned with the rest.
    assert not keys(s3, "checkpoints/ckpt-0000000010/")
    assert len(keys(s3, "checkpoints/ckpt-0000000020/")) == 3


def test_changed_files_reuploaded_unchanged_not(s3, tmp_path):
    log = tmp_path / "host_worker_log"
    write(log, "0 ADDED 10.0.0.1 1\n")
    write(tmp_path / "events.jsonl", '{"event": "start"}\n')
    write(tmp_path / "status.json", '{"state": "running"}')
    calls = put_calls(s3)
    sync = s3sync.Sync(str(tmp_path), URL, client=s3)
    assert sync.run_pass()
    assert sorted(call[0] for call in calls) == ["events.jsonl", "host_worker_log", "status.json"]
    del calls[:]
    assert sync.run_pass()
    assert calls == []                                       # nothing changed: nothing sent
    with open(str(log), "a") as handle:                      # a complete line and a half-written one
        handle.write("1 ADDED 10.0.0.2 2\n2 REMO")
    write(tmp_path / "results" / "final.json", '{"acc": 0.9}')
    assert sync.run_pass()
    assert sorted(call[0] for call in calls) == ["host_worker_log", "results/final.json"]
    assert body(s3, "host_worker_log") == b"0 ADDED 10.0.0.1 1\n1 ADDED 10.0.0.2 2\n"   # complete lines only
    assert json.loads(body(s3, "results/final.json")) == {"acc": 0.9}


def test_missing_bucket_is_recorded_not_raised(s3, tmp_path, capsys):
    make_ckpt(tmp_path, 10)
    sync = s3sync.Sync(str(tmp_path), "s3://no-such-bucket-dt/c1/job1", client=s3)
    assert sync.run_pass() is False
    st = state(tmp_path)
    assert "NoSuchBucket" in st["error"] and "s3://no-such-bucket-dt/c1/job1/" in st["error"]
    assert st["last_step"] is None
    assert "NoSuchBucket" in capsys.readouterr().err
    assert sync.run(once=True) == 1                       # --once: a failed pass exits non-zero


def test_sigterm_does_a_final_pass_and_exits_0(s3, tmp_path):
    make_ckpt(tmp_path, 10)
    sync = s3sync.Sync(str(tmp_path), URL, client=s3)

    def later():
        make_ckpt(tmp_path, 20)                             # written after the first pass
        os.kill(os.getpid(), signal.SIGTERM)
    timer = threading.Timer(1.0, later)
    timer.start()
    t0 = time.time()
    assert sync.run(interval=60) == 0
    timer.join()
    assert time.time() - t0 < 15
    assert json.loads(body(s3, "LATEST.json"))["step"] == 20


def test_restore_into_empty_volume_then_noop(s3, tmp_path, capsys):
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_ckpt(src, 10)
    path20 = make_ckpt(src, 20, epoch=3)
    write(src / "host_worker_log", "0 ADDED 10.0.0.1 1\n1 ADDED 10.0.0.2 2\n")
    write(src / "events.jsonl", '{"event": "start"}\n')
    assert s3sync.Sync(str(src), URL, client=s3).run_pass()
    os.makedirs(str(dst))
    result = s3sync.restore(str(dst), URL.rstrip("/"), client=s3)
    assert result["changed"] is True and result["step"] == 20 and result["url"] == URL
    path, meta = CheckpointStore(str(dst / "checkpoints")).latest()
    assert result["checkpoint"] == path and os.path.basename(path) == "ckpt-0000000020"
    assert meta == json.load(open(os.path.join(path20, "meta.json"))) and meta["epoch"] == 3
    for name in ("params", "trainer.states", "meta.json"):
        assert open(os.path.join(path, name), "rb").read() == open(os.path.join(path20, name), "rb").read()
        assert stat.S_IMODE(os.stat(os.path.join(path, name)).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o755
    assert not [n for n in os.listdir(str(dst / "checkpoints")) if n.startswith(".")]   # no temp dir left
    assert (dst / "host_worker_log").read_text() == (src / "host_worker_log").read_text()
    assert (dst / "events.jsonl").read_text() == '{"event": "start"}\n'
    # Twice: nothing to do.
    again = s3sync.restore(str(dst), URL, client=s3)
    assert again == {"changed": False, "step": 20, "checkpoint": path, "url": URL}


def test_restore_refuses_to_mix_jobs_unless_forced(s3, tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_ckpt(src, 20)
    write(src / "host_worker_log", "0 ADDED 10.0.0.1 1\n")
    assert s3sync.Sync(str(src), URL, client=s3).run_pass()
    write(dst / "host_worker_log", "0 ADDED 10.9.9.9 7\n")          # another job's log, no checkpoint
    with pytest.raises(s3sync.UserError, match="would mix two jobs"):
        s3sync.restore(str(dst), URL, client=s3)
    assert not os.path.exists(str(dst / "checkpoints" / "ckpt-0000000020"))
    assert s3sync.restore(str(dst), URL, force=True, client=s3)["changed"] is True
    assert (dst / "host_worker_log").read_text() == "0 ADDED 10.0.0.1 1\n"   # --force: the S3 job wins


def test_restore_cli_exit_codes(s3, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(s3sync, "make_client", lambda: s3)
    os.makedirs(str(tmp_path / "efs"))
    efs = str(tmp_path / "efs")
    assert s3sync.restore_main(["--efs", efs, "--url", URL]) == 2
    err = capsys.readouterr().err.strip()
    assert "no checkpoint under %s: LATEST.json not found" % URL in err and "resume_from" in err
    assert len(err.splitlines()) == 1
    assert s3sync.restore_main(["--efs", efs, "--url", "http://example.com/x"]) == 2
    assert "not an S3 URL" in capsys.readouterr().err
    # A LATEST.json naming a checkpoint without meta.json: refused, exit 1, nothing left behind.
    s3.put_object(Bucket=BUCKET, Key=PREFIX + "checkpoints/ckpt-0000000005/params", Body=b"x")
    s3.put_object(Bucket=BUCKET, Key=PREFIX + "LATEST.json", Body=json.dumps(
        {"checkpoint": "checkpoints/ckpt-0000000005/", "step": 5}).encode())
    assert s3sync.restore_main(["--efs", efs, "--url", URL]) == 1
    assert "no meta.json" in capsys.readouterr().err
    assert os.listdir(os.path.join(efs, "checkpoints")) == []
    # a meta.json without digests is no checkpoint (issue 40: anyone can write one): refused, exit 1
    s3.put_object(Bucket=BUCKET, Key=PREFIX + "checkpoints/ckpt-0000000005/meta.json", Body=b'{"step": 5}')
    assert s3sync.restore_main(["--efs", efs, "--url", URL]) == 1
    assert "no 'files' digests" in capsys.readouterr().err
    import hashlib
    meta = {"step": 5, "files": {"params": {"sha256": hashlib.sha256(b"x").hexdigest(), "bytes": 1}}}
    s3.put_object(Bucket=BUCKET, Key=PREFIX + "checkpoints/ckpt-0000000005/meta.json", Body=json.dumps(meta).encode())
    assert s3sync.restore_main(["--efs", efs, "--url", URL]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["changed"] is True and out["step"] == 5


@pytest.mark.parametrize("url, expected", [
    ("s3://b-1/c/j/", ("b-1", "c/j/")),
    ("s3://b-1/c/j", ("b-1", "c/j/")),
    ("s3://b-1/c/j//", ("b-1", "c/j/")),
    ("s3://b-1", ("b-1", "")),
])
def test_parse_url_normalises(url, expected):
    assert s3sync.parse_url(url) == expected


@pytest.mark.parametrize("url", ["http://b/c/", "s3:/b/c", "s3://", "s3://B_ad/c/", "s3://b1/a//c/",
                                 "s3://b1/a/../c", "/efs/x", "", "s3://b1/a b/"])
def test_parse_url_rejects(url):
    with pytest.raises(s3sync.UserError):
        s3sync.parse_url(url)


def test_importing_the_runtime_does_not_import_boto3():
    import subprocess
    import sys
    code = ("import sys, dynatrain_runtime, dynatrain_runtime.daemons.s3sync; "
            "print(sorted(m for m in sys.modules if 'boto' in m))")
    assert subprocess.check_output([sys.executable, "-c", code], text=True).strip() == "[]"


def test_a_damaged_checkpoint_is_neither_uploaded_nor_restored(s3, tmp_path):
    """The sync verifies a checkpoint against meta.json's digests before it uploads it (LATEST.json never
    names a damaged one) and after it downloads it (a damaged copy in S3 is never resumed from)."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_ckpt(src, 10)
    path20 = make_ckpt(src, 20, epoch=1)
    with open(os.path.join(path20, "params"), "r+b") as handle:     # a flipped byte after the commit
        handle.write(b"\x00")
    assert s3sync.Sync(str(src), URL, client=s3).run_pass()
    assert json.loads(body(s3, "LATEST.json"))["step"] == 10
    assert not [k for k in keys(s3) if "0000000020" in k]
    # a copy damaged in S3 itself (written by another hand)
    s3.put_object(Bucket=BUCKET, Key=PREFIX + "checkpoints/ckpt-0000000010/params", Body=b"tampered")
    os.makedirs(str(dst))
    with pytest.raises(RuntimeError, match="is damaged"):
        s3sync.restore(str(dst), URL, client=s3)
    assert not os.listdir(str(dst / "checkpoints"))                                  # nothing half restored
