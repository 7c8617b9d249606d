"""playbooks/workers_env.yml against a static inventory whose nodes are this machine (local connection):
DEEPLEARNING_WORKERS_COUNT is the number of hosts in host_worker, which '#' comments and blank lines are
not (they were counted as hosts once), and a malformed host_worker leaves the count as it was."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PLAYBOOK = os.path.join(ROOT, "playbooks", "workers_env.yml")
MASTER, WORKER = "127.0.0.1", "127.0.0.2"


@pytest.fixture
def cluster(tmp_path):
    efs = tmp_path / "efs"
    efs.mkdir()
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "ansible_become": False}
    nodes = {}
    for ip in (MASTER, WORKER):
        profile = tmp_path / ("profile-" + ip)
        profile.write_text("export DEEPLEARNING_WORKERS_PATH=/myEFSvolume/host_worker\n"
                           "export DEEPLEARNING_WORKERS_COUNT=1\n")
        nodes[ip] = dict(local, node_base_profile_path=str(profile))
    inventory = {"all": {"vars": {"dt_efs_mount": str(efs)},
                         "hosts": nodes,
                         "children": {"dt_this_master": {"hosts": {MASTER: {}}}}}}
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    return tmp_path


def run_playbook(cluster):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(cluster / "tmp"))
    proc = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(cluster / "inventory.json"),
         PLAYBOOK], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def count_on(cluster, ip):
    lines = (cluster / ("profile-" + ip)).read_text().splitlines()
    return [line.split("=", 1)[1] for line in lines if line.startswith("export DEEPLEARNING_WORKERS_COUNT=")]


def test_comments_and_blank_lines_are_not_counted(cluster):
    (cluster / "efs" / "host_worker").write_text(f"# added by hand\n{WORKER}\n\n{MASTER}  # the master\n")
    run_playbook(cluster)
    assert count_on(cluster, MASTER) == ["2"]
    assert count_on(cluster, WORKER) == ["2"]


def test_a_malformed_host_worker_leaves_the_count(cluster):
    (cluster / "efs" / "host_worker").write_text(f"{WORKER}\nnot-an-address\n{MASTER}\n")
    out = run_playbook(cluster)
    assert "host_worker could not be read" in out
    assert count_on(cluster, MASTER) == ["1"]
    assert count_on(cluster, WORKER) == ["1"]
