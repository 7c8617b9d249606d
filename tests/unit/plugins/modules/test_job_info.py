"""Unit tests for the dynatrain.elastic.job_info module and module_utils/job_status.py (no network)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.dynatrain.elastic.plugins.module_utils import shared_volume as hwf
from ansible_collections.dynatrain.elastic.plugins.module_utils import job_status
from ansible_collections.dynatrain.elastic.plugins.modules import job_info

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
NOW = 1_700_000_000.0


def status(**kw):
    out = dict(state="running", pid=42, updated=NOW - 1, master="10.0.0.1", membership=["10.0.0.2", "10.0.0.1"],
               world_size=2, generation=1, epoch=3, step=120, samples_per_s=850.5, last_checkpoint=100,
               host_worker_error=None, resize_at="step", spares_ready=1, spares_wanted=1)
    out.update(kw)
    return out


@pytest.fixture
def efs(tmp_path):
    """A shared volume as the launcher leaves it: host_worker with comments, a log, status.json."""
    (tmp_path / "host_worker").write_text("# base workers\n10.0.0.2   # the first base worker\n\n1.2.3.4 # master\n")
    for event, ip in (("ADDED", "10.0.0.2"), ("ADDED", "1.2.3.4"), ("ADDED", "10.0.0.3"), ("REMOVED", "10.0.0.3")):
        hwf.append_log(str(tmp_path / "host_worker_log"), event, ip)
    (tmp_path / "status.json").write_text(json.dumps(status()))
    return tmp_path


def params(efs, **kw):
    return dict(dict(path=str(efs), log_entries=10, stale_after=60.0), **kw)


def run(p, now=NOW):
    return job_info.run(p, now=now)


# --- host_worker ------------------------------------------------------------------------


def test_host_worker_with_inline_comments(efs):
    res = run(params(efs))
    assert res["changed"] is False
    assert res["hosts"] == ["10.0.0.2", "1.2.3.4"]
    assert res["master"] == "1.2.3.4"
    assert res["host_worker_error"] is None


def test_master_comment_line_is_not_split_into_words(tmp_path):
    (tmp_path / "host_worker").write_text("1.2.3.4 # master\n")
    res = run(params(tmp_path))
    assert res["hosts"] == ["1.2.3.4"] and res["master"] == "1.2.3.4"
    assert "#" not in res["hosts"] and "master" not in res["hosts"]


def test_missing_files_are_an_empty_job(tmp_path):
    res = run(params(tmp_path))
    assert res["hosts"] == [] and res["master"] is None and res["host_worker_error"] is None
    assert res["log"] == [] and res["log_lines"] == [] and res["log_error"] is None
    assert res["status"] == {} and res["status_error"] is None
    assert res["state"] is None and res["age_s"] is None
    assert res["running"] is False and res["finished"] is False


def test_malformed_host_worker_is_reported_not_raised(tmp_path):
    (tmp_path / "host_worker").write_text("10.0.0.2\nnot-an-ip\n10.0.0.1\n")
    res = run(params(tmp_path))
    assert res["hosts"] == [] and res["master"] is None
    assert "line 2" in res["host_worker_error"] and "not-an-ip" in res["host_worker_error"]


# --- host_worker_log --------------------------------------------------------------------


def test_log_tail_is_parsed_and_rendered(efs):
    res = run(params(efs, log_entries=2))
    assert [(e["seq"], e["event"], e["ip"]) for e in res["log"]] == [(2, "ADDED", "10.0.0.3"), (3, "REMOVED", "10.0.0.3")]
    assert all(isinstance(e["ns"], int) and e["ns"] > 0 for e in res["log"])
    assert res["log_lines"] == [hwf.format_log_line(e["seq"], e["event"], e["ip"], e["ns"]) for e in res["log"]]
    assert res["log_lines"][0].startswith("2 ADDED 10.0.0.3 ")
    assert res["log_error"] is None


def test_log_entries_zero_returns_none(efs):
    res = run(params(efs, log_entries=0))
    assert res["log"] == [] and res["log_lines"] == []


def test_malformed_log_line_keeps_the_good_ones(tmp_path):
    (tmp_path / "host_worker_log").write_text("0 ADDED 10.0.0.2 1\ngarbage here\n1 FAILED 10.0.0.2 2\n")
    res = run(params(tmp_path))
    assert res["log_lines"] == ["0 ADDED 10.0.0.2 1", "1 FAILED 10.0.0.2 2"]
    assert "garbage here" in res["log_error"]


# --- status.json ------------------------------------------------------------------------


def test_running_job(efs):
    res = run(params(efs))
    assert res["status"] == status()
    assert res["state"] == "running" and res["age_s"] == 1.0
    assert res["running"] is True and res["finished"] is False


def test_engine_of_the_job(efs):
    # a launcher older than the engine seam says none: the job's engine is not known
    assert run(params(efs))["engine"] is None
    (efs / "status.json").write_text(json.dumps(status(engine="torch")))
    assert run(params(efs))["engine"] == "torch"
    (efs / "status.json").write_text(json.dumps(status(engine=7)))
    assert run(params(efs))["engine"] is None
    assert run(params(efs))["status"]["engine"] == 7


def test_no_job_has_no_engine(tmp_path):
    assert run(params(tmp_path))["engine"] is None


@pytest.mark.parametrize("state", ["starting", "resizing"])
def test_other_active_states_are_running(efs, state):
    (efs / "status.json").write_text(json.dumps(status(state=state)))
    assert run(params(efs))["running"] is True


@pytest.mark.parametrize("state", ["stopped", "failed", "finished"])
def test_inactive_states_are_not_running(efs, state):
    (efs / "status.json").write_text(json.dumps(status(state=state)))
    res = run(params(efs))
    assert res["running"] is False
    assert res["finished"] is (state == "finished")


def test_stale_status_is_not_running(efs):
    (efs / "status.json").write_text(json.dumps(status(updated=NOW - 61)))
    res = run(params(efs))
    assert res["state"] == "running" and res["age_s"] == 61.0 and res["running"] is False
    assert run(params(efs, stale_after=120))["running"] is True


def test_status_without_updated_is_not_running(efs):
    (efs / "status.json").write_text(json.dumps({"state": "running"}))
    res = run(params(efs))
    assert res["age_s"] is None and res["running"] is False


@pytest.mark.parametrize("content, what", [("{not json", "not valid JSON"), ("[1, 2]", "JSON list")])
def test_malformed_status_is_reported(efs, content, what):
    (efs / "status.json").write_text(content)
    res = run(params(efs))
    assert res["status"] == {} and what in res["status_error"]
    assert res["running"] is False and res["finished"] is False


def test_job_status_helpers():
    assert hwf.parse_status("") == {}
    assert job_status.status_age({"updated": "12.5"}, now=20) == 7.5
    assert job_status.status_age({"updated": None}, now=20) is None
    assert job_status.summarize(status(state="finished"), now=NOW) == dict(
        state="finished", age_s=1.0, running=False, finished=True)
    assert set(hwf.ACTIVE_STATES) < set(hwf.STATES)


# --- per-node last event, checkpoint age, events.jsonl ------------------------------------


def test_last_log_is_each_nodes_last_entry_of_the_whole_log(efs):
    res = run(params(efs, log_entries=1), now=NOW)
    assert set(res["last_log"]) == {"10.0.0.2", "1.2.3.4", "10.0.0.3"}
    assert res["last_log"]["10.0.0.3"]["event"] == "REMOVED" and res["last_log"]["10.0.0.3"]["seq"] == 3
    assert res["last_log"]["10.0.0.2"]["event"] == "ADDED" and res["last_log"]["10.0.0.2"]["seq"] == 0
    ns = res["last_log"]["1.2.3.4"]["ns"]
    assert res["last_log"]["1.2.3.4"]["age_s"] == round(NOW - ns / 1e9, 1)


def test_checkpoint_age_from_the_launchers_last_checkpoint(efs):
    ckpt = efs / "checkpoints" / "ckpt-0000000100"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text("{}")
    os.utime(ckpt / "meta.json", (NOW - 30, NOW - 30))
    (efs / "status.json").write_text(json.dumps(status(last_checkpoint=str(ckpt))))
    res = run(params(efs))
    assert res["last_checkpoint"] == str(ckpt) and res["checkpoint_age_s"] == 30.0


def test_checkpoint_age_falls_back_to_the_newest_checkpoint_dir(efs):
    for step, age in ((40, 90), (100, 12)):
        ckpt = efs / "checkpoints" / f"ckpt-{step:010d}"
        ckpt.mkdir(parents=True)
        (ckpt / "meta.json").write_text("{}")
        os.utime(ckpt / "meta.json", (NOW - age, NOW - age))
    (efs / "checkpoints" / ".tmp-ckpt-0000000200-x").mkdir()  # half-written: never counted
    (efs / "status.json").write_text(json.dumps(status(last_checkpoint=None)))
    res = run(params(efs))
    assert res["last_checkpoint"].endswith("ckpt-0000000100") and res["checkpoint_age_s"] == 12.0


def test_no_checkpoint_is_null(efs):
    res = run(params(efs))
    assert res["last_checkpoint"] is None and res["checkpoint_age_s"] is None


def test_events_only_when_asked(efs):
    lines = [json.dumps({"event": "generation_start", "time": NOW - 5, "world": 2, "source": "launcher"}),
             "{half a line", json.dumps({"event": "epoch", "time": NOW - 1, "val_acc": 0.9, "source": "train"})]
    (efs / "events.jsonl").write_text("\n".join(lines) + "\n")
    assert run(params(efs))["events"] == []
    res = run(params(efs, events=True))
    assert [e["event"] for e in res["events"]] == ["generation_start", "epoch"]
    assert res["events_bad_lines"] == [2]


def test_missing_volume_fails(tmp_path):
    with pytest.raises(FileNotFoundError, match="shared volume"):
        run(params(tmp_path / "nope"))


# --- through AnsibleModule and ansible ---------------------------------------------------


def run_module(args, capsys):
    with patch_module_args(args):
        with pytest.raises(SystemExit) as info:
            job_info.main()
    return info.value.code, json.loads(capsys.readouterr().out)


def test_main_in_check_mode_reads_and_changes_nothing(efs, capsys):
    before = {p.name: p.read_bytes() for p in efs.iterdir()}
    code, out = run_module(dict(path=str(efs), log_entries=1, _ansible_check_mode=True), capsys)
    assert code == 0 and out["changed"] is False
    assert out["hosts"] == ["10.0.0.2", "1.2.3.4"] and len(out["log"]) == 1
    assert out["status"]["world_size"] == 2
    assert {p.name: p.read_bytes() for p in efs.iterdir()} == before


def test_main_missing_volume(tmp_path, capsys):
    code, out = run_module(dict(path=str(tmp_path / "nope")), capsys)
    assert code == 1 and out["failed"] is True and "shared volume" in out["msg"]


def test_module_runs_under_ansible(efs, tmp_path):
    ansible = os.path.join(os.path.dirname(sys.executable), "ansible")
    if not os.path.exists(ansible):
        pytest.skip("ansible not found (run `make setup`)")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_LOCAL_TEMP=str(tmp_path / "t"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    proc = subprocess.run([ansible, "localhost", "-i", "localhost,", "-c", "local", "--check",
                           "-e", f"ansible_python_interpreter={sys.executable}",
                           "-m", "dynatrain.elastic.job_info", "-a", f"path={efs}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert result["hosts"] == ["10.0.0.2", "1.2.3.4"] and result["changed"] is False
    assert result["state"] == "running"


# --- the checkpoint copy to S3 (control/s3sync.json) --------------------------------------

def test_s3_copy_is_read_with_its_age(efs):
    (efs / "control").mkdir()
    (efs / "control" / "s3sync.json").write_text(json.dumps(
        {"url": "s3://b/c/job/", "last_step": 120, "last_ok_time": NOW - 4, "error": None}))
    out = run(params(efs))
    assert out["s3_copy"]["last_step"] == 120 and out["s3_copy_age_s"] == pytest.approx(4)


def test_no_s3_copy_and_a_broken_one_read_as_none(efs):
    out = run(params(efs))
    assert out["s3_copy"] is None and out["s3_copy_age_s"] is None
    (efs / "control").mkdir()
    (efs / "control" / "s3sync.json").write_text("{half")
    assert run(params(efs))["s3_copy"] is None
