"""dynatrain.elastic.shared_volume_op: a fresh job's archive and the data markers' removal, the names from the
volume's contract (issue 42 item 3). The volume is hostile input: no link is followed; check mode changes
nothing; a second run changes nothing."""
from __future__ import annotations

import json
import os

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.dynatrain.elastic.plugins.module_utils import shared_volume as sv
from ansible_collections.dynatrain.elastic.plugins.modules import shared_volume_op


def run(capsys, check=False, **params):
    with patch_module_args(dict(params, _ansible_check_mode=check)):
        with pytest.raises(SystemExit):
            shared_volume_op.main()
    return json.loads(capsys.readouterr().out)


def a_job(efs):
    """A volume with a job: every archived name, and the membership files that stay."""
    (efs / "checkpoints" / "ckpt-10").mkdir(parents=True)
    (efs / "checkpoints" / "ckpt-10" / "meta.json").write_text('{"step": 10}')
    (efs / "results").mkdir()
    (efs / "results" / "final.json").write_text("{}")
    (efs / "status.json").write_text('{"state": "finished"}')
    (efs / "events.jsonl").write_text('{"event": "x"}\n')
    (efs / "control").mkdir()
    (efs / "host_worker").write_text("10.0.0.2\n10.0.0.1\n")
    (efs / "host_worker_log").write_text("0 ADDED 10.0.0.1 1\n")


def listing(root):
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, dirs, files in os.walk(root) for n in dirs + files)


def test_archive_moves_the_job_and_keeps_the_membership(tmp_path, capsys):
    a_job(tmp_path)
    out = run(capsys, path=str(tmp_path), op="archive_job")
    assert out["changed"] and out["moved"] == ["checkpoints", "results", "status.json", "events.jsonl", "control"]
    dest = out["archive"]
    assert os.path.dirname(dest) == str(tmp_path / "runs")
    assert sorted(os.listdir(dest)) == sorted(out["moved"])
    assert (tmp_path / "runs" / os.path.basename(dest) / "checkpoints" / "ckpt-10" / "meta.json").read_text() == '{"step": 10}'
    assert sorted(os.listdir(tmp_path)) == ["host_worker", "host_worker_log", "runs"]
    # idempotent: nothing left to move, nothing changes
    again = run(capsys, path=str(tmp_path), op="archive_job")
    assert not again["changed"] and again["archive"] is None and again["moved"] == []
    assert os.listdir(tmp_path / "runs") == [os.path.basename(dest)]


def test_archive_in_check_mode_changes_nothing(tmp_path, capsys):
    a_job(tmp_path)
    before = listing(tmp_path)
    out = run(capsys, check=True, path=str(tmp_path), op="archive_job")
    assert out["changed"] and len(out["moved"]) == 5 and out["archive"].startswith(str(tmp_path / "runs") + os.sep)
    assert listing(tmp_path) == before


def test_archive_of_the_same_second_gets_a_directory_of_its_own(tmp_path):
    a_job(tmp_path)
    first, _moved = sv.archive_job(str(tmp_path), now=1_700_000_000)
    (tmp_path / "status.json").write_text("{}")
    second, moved = sv.archive_job(str(tmp_path), now=1_700_000_000)
    assert moved == ["status.json"] and second == first + "-1"
    assert os.path.basename(first) == "20231114T221320Z"


def test_archive_moves_a_planted_link_as_the_link_never_its_target(tmp_path, capsys):
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "id_ed25519").write_text("KEY")
    efs = tmp_path / "efs"
    efs.mkdir()
    os.symlink(secret, efs / "checkpoints")
    os.symlink(secret / "id_ed25519", efs / "events.jsonl")
    out = run(capsys, path=str(efs), op="archive_job")
    assert out["moved"] == ["checkpoints", "events.jsonl"]
    assert os.path.islink(os.path.join(out["archive"], "checkpoints"))
    assert os.listdir(secret) == ["id_ed25519"] and (secret / "id_ed25519").read_text() == "KEY"


def test_archive_refuses_a_runs_directory_that_is_a_link(tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    efs = tmp_path / "efs"
    efs.mkdir()
    a_job(efs)
    os.symlink(elsewhere, efs / "runs")
    out = run(capsys, path=str(efs), op="archive_job")
    assert out.get("failed") and "archive_job on" in out["msg"]
    assert os.listdir(elsewhere) == [] and (efs / "status.json").exists()


def test_remove_markers_by_address(tmp_path, capsys):
    for ip in ("10.0.0.5", "10.0.0.6", "10.0.0.7"):
        (tmp_path / sv.prepare_data_marker(ip)).write_text("ip=%s\n" % ip)
    out = run(capsys, check=True, path=str(tmp_path), op="remove_markers", ips=["10.0.0.5", "10.0.0.9"])
    assert out["changed"] and out["removed"] == ["prepare_data_success_10.0.0.5"]
    assert (tmp_path / "prepare_data_success_10.0.0.5").exists()      # check mode
    out = run(capsys, path=str(tmp_path), op="remove_markers", ips=["10.0.0.5", "10.0.0.6", "10.0.0.9"])
    assert out["removed"] == ["prepare_data_success_10.0.0.5", "prepare_data_success_10.0.0.6"]
    assert sorted(os.listdir(tmp_path)) == ["prepare_data_success_10.0.0.7"]
    again = run(capsys, path=str(tmp_path), op="remove_markers", ips=["10.0.0.5", "10.0.0.6"])
    assert not again["changed"] and again["removed"] == []


def test_remove_markers_removes_a_link_not_its_target(tmp_path, capsys):
    target = tmp_path / "target"
    target.write_text("keep")
    efs = tmp_path / "efs"
    efs.mkdir()
    os.symlink(target, efs / "prepare_data_success_10.0.0.5")
    out = run(capsys, path=str(efs), op="remove_markers", ips=["10.0.0.5"])
    assert out["removed"] == ["prepare_data_success_10.0.0.5"] and os.listdir(efs) == []
    assert target.read_text() == "keep"


@pytest.mark.parametrize("ip", ["../etc/passwd", "10.0.0.5/x", "host"])
def test_remove_markers_refuses_what_is_not_an_address(tmp_path, capsys, ip):
    (tmp_path / "keep").write_text("x")
    out = run(capsys, path=str(tmp_path), op="remove_markers", ips=[ip])
    assert out.get("failed") and "invalid worker address" in out["msg"]
    assert os.listdir(tmp_path) == ["keep"]


def test_the_marker_name_is_the_contract_s():
    assert sv.prepare_data_marker(" 10.0.0.5 ") == sv.PREPARE_DATA_MARKER.format(ip="10.0.0.5")
    assert sv.JOB_ARCHIVE_NAMES == (sv.CHECKPOINT_DIR, "results", sv.STATUS_FILE, sv.EVENTS_FILE, sv.CONTROL_DIR)


ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))


def _yaml_files(*tops):
    for top in tops:
        for directory, _dirs, files in os.walk(os.path.join(ROOT, top)):
            yield from (os.path.join(directory, f) for f in files if f.endswith((".yml", ".j2")))


def test_the_playbooks_reach_the_volume_names_through_the_contract():
    """The marker's name only in the prepare_data role's documentation; no inline python in a playbook; the
    wheelhouse spelled by the filter."""
    spelled, inline = [], []
    for path in _yaml_files("playbooks", "roles"):
        text = open(path, encoding="utf-8").read()
        rel = os.path.relpath(path, ROOT)
        if "prepare_data_success" in text and not rel.startswith(("roles/prepare_data/meta/", "roles/prepare_data/README")):
            spelled.append(rel)
        if rel.startswith("playbooks/") and any(n in text for n in ("python3\n", "- python3", "- -c\n")):
            inline.append(rel)
    assert spelled == [] and inline == []
    configure = open(os.path.join(ROOT, "playbooks", "configure_nodes.yml"), encoding="utf-8").read()
    assert "/wheelhouse" not in configure
    # the node roles' mapping spells it once, by the filter; the engines' roles read the launcher's
    mapping = open(os.path.join(ROOT, "playbooks", "vars", "nodes.yml"), encoding="utf-8").read()
    assert "/wheelhouse" not in mapping and mapping.count("dynatrain.elastic.wheelhouse_dir") == 1
    assert mapping.count("_wheelhouse_dir: \"{{ launcher_wheelhouse_dir }}\"") == 2


def test_the_filters_give_the_contract_s_names():
    from ansible_collections.dynatrain.elastic.plugins.filter import shared_volume as filters
    from ansible.errors import AnsibleFilterError
    assert filters.prepare_data_marker("10.0.0.5", "/myEFSvolume") == "/myEFSvolume/" + sv.prepare_data_marker("10.0.0.5")
    assert filters.prepare_data_marker("10.0.0.5") == "prepare_data_success_10.0.0.5"
    assert filters.wheelhouse_dir("/myEFSvolume") == "/myEFSvolume/wheelhouse"
    with pytest.raises(AnsibleFilterError, match="invalid worker address"):
        filters.prepare_data_marker("a/b")
