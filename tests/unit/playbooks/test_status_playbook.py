"""playbooks/status.yml against a static inventory whose master is this machine (local connection) and
whose shared volume is a temporary directory: the table it prints, the timeline it draws with
-e plot=true, and the clear failure when there are no events."""
from __future__ import annotations

import json
import os
import shutil
import sys
import time

import pytest

from ansible_collections.dynatrain.elastic.plugins.module_utils import shared_volume as hwf
from playbook_run import ROOT, playbook_env, run_playbook

PLAYBOOK = os.path.join(ROOT, "playbooks", "status.yml")
FIXTURE = os.path.join(ROOT, "tests", "unit", "fixtures", "events_elastic_run.jsonl")
MASTER, WORKER, GONE = "127.0.0.1", "172.31.65.62", "172.31.70.5"


def host(ip, role, status=None, lifecycle="on-demand"):
    return {"dt_private_ip": ip, "dt_role": role, "dt_state": "running", "dt_status": status,
            "dt_lifecycle": lifecycle, "dt_instance_id": "i-" + ip.replace(".", "")}


@pytest.fixture
def cluster(tmp_path):
    efs = tmp_path / "efs"
    efs.mkdir()
    (efs / "host_worker").write_text(f"{WORKER}\n{MASTER}\n")
    for event, ip in (("ADDED", WORKER), ("ADDED", MASTER), ("ADDED", GONE), ("REMOVED", GONE)):
        hwf.append_log(str(efs / "host_worker_log"), event, ip)
    (efs / "status.json").write_text(json.dumps({
        "state": "running", "updated": time.time(), "epoch": 4, "step": 115, "world_size": 2,
        "samples_per_s": 391.25, "last_checkpoint": None}))
    inventory = {
        "all": {
            "vars": {"dt_cluster_name": "tc", "dt_region": "us-east-1", "dt_state_dir": str(tmp_path / "state"),
                     "dt_efs_mount": str(efs)},
            "children": {
                "dt_cluster_tc": {"hosts": {"m": host(MASTER, "master"), "w": host(WORKER, "worker", "ADDED"),
                                            "s": host(GONE, "worker", "REMOVED", "spot")}},
                "dt_master": {"hosts": {"m": {"ansible_connection": "local",
                                              "ansible_python_interpreter": sys.executable}}},
                "dt_workers": {"hosts": {"m": {}, "w": {}}},
            },
        }
    }
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    return tmp_path


def run_status(cluster, *extra):
    proc = run_playbook(cluster / "inventory.json", PLAYBOOK, *extra,
                        env=playbook_env(cluster, ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json"))
    try:
        tasks = {t["task"]["name"]: t["hosts"].get("localhost") for t in json.loads(proc.stdout)["plays"][0]["tasks"]}
    except (ValueError, KeyError, IndexError):
        pytest.fail(proc.stdout[-3000:] + proc.stderr[-3000:])
    return proc, tasks


def test_status_prints_the_table_and_the_job_line(cluster):
    proc, tasks = run_status(cluster)
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = tasks["Show the nodes and the job"]["msg"].splitlines()
    assert lines[0].split()[:2] == ["NODE", "ROLE"]
    rows = [line.split() for line in lines[1:4]]
    assert [r[:6] for r in rows] == [
        [MASTER, "master", "running", "-", "on-demand", "yes"],
        [WORKER, "worker", "running", "ADDED", "on-demand", "yes"],
        [GONE, "worker", "running", "REMOVED", "spot", "no"],
    ]
    assert rows[2][6:8] == ["REMOVED", "#3"]
    assert lines[4].startswith("job: running  epoch 4 step 115  world 2  391.2 samples/s  no checkpoint")
    assert "Draw the timeline from events.jsonl" in tasks and tasks["Draw the timeline from events.jsonl"].get("skipped")
    assert not (cluster / "state" / "tc" / "timeline.png").exists()


def test_plot_true_draws_the_timeline_at_the_default_path(cluster):
    shutil.copy(FIXTURE, cluster / "efs" / "events.jsonl")
    proc, tasks = run_status(cluster, "-e", "plot=true")
    assert proc.returncode == 0, proc.stdout[-3000:]
    png = cluster / "state" / "tc" / "timeline.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    shown = tasks["Show where the timeline is"]["msg"]
    assert f"Timeline written to {png}" in shown and "4 resizes, 1 lost workers, 1 spot drains" in shown


def test_plot_path_and_missing_events_fail_clearly(cluster):
    proc, tasks = run_status(cluster, "-e", "plot=true", "-e", f"plot_path={cluster / 'run.png'}")
    assert proc.returncode != 0
    failed = tasks["Draw the timeline from events.jsonl"]
    assert failed["failed"] is True and "no timeline to draw" in failed["msg"] and "Traceback" not in failed["msg"]
    assert failed["dest"] == str(cluster / "run.png") and not (cluster / "run.png").exists()
    # the table was still shown before
    assert tasks["Show the nodes and the job"]["msg"].splitlines()[1].startswith(MASTER)
