"""The dynatrain.elastic.job_array_state module: array.json written, changed row by row, ended, read; check mode
writes nothing; a missing file or row fails with a message that says so."""
from __future__ import annotations

import json

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.dynatrain.elastic.plugins.modules import job_array_state

ROWS = [{"name": "first", "region": "us-east-1", "cluster": "jobs-first", "workers": 1, "args_text": "--epochs 2"},
        {"name": "second", "region": "us-west-2", "cluster": "jobs-second", "workers": 0, "args_text": ""}]


def run_module(args, capsys):
    with patch_module_args(args):
        with pytest.raises(SystemExit) as info:
            job_array_state.main()
    return info.value.code, json.loads(capsys.readouterr().out)


@pytest.fixture
def array(tmp_path, capsys):
    path = tmp_path / "array.json"
    code, out = run_module(dict(path=str(path), action="init", array="jobs", manifest="/m/jobs.csv", rows=ROWS), capsys)
    assert code == 0 and out["changed"] is True
    return path


def test_init_writes_every_row_queued_with_its_log_beside_the_file(array):
    doc = json.loads(array.read_text())
    assert doc["array"] == "jobs" and doc["manifest"] == "/m/jobs.csv"
    assert [(r["name"], r["state"], r["args"], r["log"]) for r in doc["rows"]] == [
        ("first", "queued", "--epochs 2", str(array.parent / "first.log")),
        ("second", "queued", "", str(array.parent / "second.log"))]


def test_row_changes_are_written_and_returned(array, capsys):
    code, out = run_module(dict(path=str(array), action="row", name="second", row_state="running"), capsys)
    assert code == 0 and out["changed"] is True
    code, out = run_module(dict(path=str(array), action="row", name="second", row_state="failed",
                                error="bootstrap failed: no vCPUs"), capsys)
    row = json.loads(array.read_text())["rows"][1]
    assert row["state"] == "failed" and row["error"] == "bootstrap failed: no vCPUs" and row["ended"]
    assert out["summary"]["failed"] == ["second"]
    assert out["lines"][2].endswith("ERROR: bootstrap failed: no vCPUs")


def test_end_fails_the_rows_left_and_read_changes_nothing(array, capsys):
    code, out = run_module(dict(path=str(array), action="end"), capsys)
    assert code == 0 and out["array"]["ended"]
    assert out["summary"]["counts"]["failed"] == 2
    before = array.read_bytes()
    code, out = run_module(dict(path=str(array)), capsys)
    assert code == 0 and out["changed"] is False and array.read_bytes() == before


def test_check_mode_writes_nothing(array, capsys):
    before = array.read_bytes()
    code, out = run_module(dict(path=str(array), action="row", name="first", row_state="running",
                                _ansible_check_mode=True), capsys)
    assert code == 0 and out["changed"] is True and out["array"]["rows"][0]["state"] == "running"
    assert array.read_bytes() == before


def test_missing_file_and_unknown_row_fail_clearly(tmp_path, array, capsys):
    code, out = run_module(dict(path=str(tmp_path / "nope" / "array.json")), capsys)
    assert code == 1 and "does not exist: no job array was run under that name" in out["msg"]
    code, out = run_module(dict(path=str(array), action="row", name="third", row_state="running"), capsys)
    assert code == 1 and "has no row named third" in out["msg"]
    code, out = run_module(dict(path=str(array), action="row", row_state="running"), capsys)
    assert code == 1 and "name" in out["msg"]
