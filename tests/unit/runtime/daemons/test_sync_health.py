"""A checkpoint sync that fails is seen where the job's other news is (issue 40, "backups that cannot go
quiet"): its turn from success to failure and back is an event in ``events.jsonl`` (through the shared
volume's append), and the launcher's Prometheus endpoint says it (``dynatrain_checkpoint_sync_ok``, the
failed passes), read from ``control/s3sync.json`` -- against moto's in-process S3."""
import json
import os
import shutil

import pytest

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")
from conftest import mock_bucket, parse  # noqa: E402  pylint: disable=wrong-import-position

from dynatrain_runtime.contract.checkpoint import CheckpointStore  # noqa: E402
from dynatrain_runtime.contract.shared_volume import JobFiles, read_events  # noqa: E402
from dynatrain_runtime.daemons import s3sync  # noqa: E402
from dynatrain_runtime.launcher.metrics import Metrics  # noqa: E402

BUCKET = "dt-health-test"


@pytest.fixture
def s3(monkeypatch):
    with mock_bucket(monkeypatch, BUCKET) as client:
        yield client


def make_ckpt(efs, step):
    def payload(tmp):
        with open(os.path.join(tmp, "params"), "wb") as handle:
            handle.write(os.urandom(512))
    store = CheckpointStore(os.path.join(str(efs), "checkpoints"), keep=10)
    return store.write(step, {"step": step, "epoch": 0}, payload)


def sync_events(efs):
    records, bad = read_events(os.path.join(str(efs), "events.jsonl"))
    assert bad == []
    return [r for r in records if r.get("source") == s3sync.EVENT_SOURCE]


def scrape(efs):
    return parse(Metrics(sync_state=JobFiles(str(efs)).s3sync_state).render({"state": "running"}))


def test_a_failed_pass_and_its_recovery_are_events_and_metrics(s3, tmp_path):
    make_ckpt(tmp_path, 10)
    sync = s3sync.Sync(str(tmp_path), "s3://dt-health-later/c1/job1/", client=s3)   # no such bucket yet
    assert sync.run_pass() is False and sync.run_pass() is False
    events = sync_events(tmp_path)
    assert [e["event"] for e in events] == ["checkpoint_sync_failed"]      # the turn, not one per pass
    assert "NoSuchBucket" in events[0]["error"] and events[0]["url"] == "s3://dt-health-later/c1/job1/"
    got = scrape(tmp_path)
    assert got["dynatrain_checkpoint_sync_ok"] == 0
    assert got["dynatrain_checkpoint_sync_failed_passes_total"] == 2
    assert "dynatrain_checkpoint_sync_last_success_age_seconds" not in got

    s3.create_bucket(Bucket="dt-health-later")
    assert sync.run_pass() is True
    events = sync_events(tmp_path)
    assert [e["event"] for e in events] == ["checkpoint_sync_failed", "checkpoint_sync_recovered"]
    assert events[1]["last_step"] == 10
    got = scrape(tmp_path)
    assert got["dynatrain_checkpoint_sync_ok"] == 1
    assert got["dynatrain_checkpoint_sync_failed_passes_total"] == 2      # a counter: it never goes down
    assert 0 <= got["dynatrain_checkpoint_sync_last_success_age_seconds"] < 60
    assert got["dynatrain_checkpoint_sync_latest_step"] == 10
    assert sync.run_pass() is True and len(sync_events(tmp_path)) == 2    # success goes on quietly


def test_a_sync_restarted_in_a_failure_says_its_recovery_and_keeps_counting(s3, tmp_path):
    make_ckpt(tmp_path, 10)
    url = "s3://dt-health-later/c1/job1/"
    assert s3sync.Sync(str(tmp_path), url, client=s3).run_pass() is False
    s3.create_bucket(Bucket="dt-health-later")
    again = s3sync.Sync(str(tmp_path), url, client=s3)                     # systemd restarted the daemon
    assert again.run_pass() is True
    assert [e["event"] for e in sync_events(tmp_path)] == ["checkpoint_sync_failed", "checkpoint_sync_recovered"]
    assert json.load(open(JobFiles(str(tmp_path)).s3sync_state))["failed_passes"] == 1


def test_a_link_at_a_job_file_fails_the_pass_as_an_event(s3, tmp_path):
    """results/final.json pointing at the master's key: not uploaded, and the failure is in the events."""
    outside = tmp_path / "home"
    outside.mkdir()
    (outside / "id_ed25519").write_text("PRIVATE KEY\n")
    efs = tmp_path / "efs"
    make_ckpt(efs, 10)
    (efs / "results").mkdir()
    os.symlink(str(outside / "id_ed25519"), str(efs / "results" / "final.json"))
    sync = s3sync.Sync(str(efs), "s3://%s/c1/job1/" % BUCKET, client=s3)
    assert sync.run_pass() is False
    (event,) = sync_events(efs)
    assert event["event"] == "checkpoint_sync_failed" and "final.json" in event["error"]
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
    keys = [o["Key"] for p in pages for o in p.get("Contents", [])]
    assert keys and not [k for k in keys if k.endswith("final.json")]
    assert scrape(efs)["dynatrain_checkpoint_sync_ok"] == 0


def test_a_new_run_on_the_prefix_is_an_event(s3, tmp_path):
    url = "s3://%s/c1/job1/" % BUCKET
    for step in (10, 20, 30):
        make_ckpt(tmp_path, step)
    assert s3sync.Sync(str(tmp_path), url, client=s3).run_pass() is True
    shutil.move(str(tmp_path / "checkpoints"), str(tmp_path / "checkpoints.old"))    # NoValidCheckpoint's advice
    make_ckpt(tmp_path, 10)
    assert s3sync.Sync(str(tmp_path), url, client=s3).run_pass() is True
    (event,) = [e for e in sync_events(tmp_path) if e["event"] == "checkpoint_sync_new_run"]
    assert event["step"] == 10 and event["previous_latest"] == 30


def test_a_link_at_events_jsonl_is_not_written_through_and_the_pass_goes_on(s3, tmp_path):
    outside = tmp_path / "rc"
    os.symlink(str(outside), str(tmp_path / "events.jsonl"))
    make_ckpt(tmp_path, 10)
    sync = s3sync.Sync(str(tmp_path), "s3://dt-health-later/c1/job1/", client=s3)
    assert sync.run_pass() is False                  # the event cannot be appended: said, the sync goes on
    assert not outside.exists()
    assert json.load(open(JobFiles(str(tmp_path)).s3sync_state))["ok"] is False
