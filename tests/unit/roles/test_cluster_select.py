"""cluster select after a refresh: a cluster the inventory does not see (another region) is a
clear failure naming the region and what to pass, not a run that configures nothing."""
import json
import os
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def run_play(tmp_path, play, inventory):
    """ansible-playbook of ``play`` (a list of plays) with the repository's config and ``inventory``."""
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump(play))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    return subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory),
                           str(path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


def run_select(tmp_path, refresh):
    play = [{
        "name": "Select",
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "tasks": [{
            "name": "Select the cluster's nodes",
            "ansible.builtin.include_role": {"name": "dynatrain.elastic.cluster", "tasks_from": "select"},
            "vars": {"cluster_name": "ghost", "cluster_region": "us-west-2", "cluster_select_refresh": refresh},
        }],
    }]
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("")
    proc = run_play(tmp_path, play, inventory)
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split())


def test_cluster_not_in_the_inventory_after_a_refresh_fails_clearly(tmp_path):
    rc, out = run_select(tmp_path, True)
    assert rc != 0, out[-2000:]
    assert "Cluster ghost was created in region us-west-2" in out, out[-2000:]
    assert "the inventory" in out and "sees no host of it" in out
    assert "-e dt_region" in out and "AWS_REGION=us-west-2" in out


def test_without_a_refresh_an_empty_selection_is_the_callers_business(tmp_path):
    rc, out = run_select(tmp_path, False)
    assert rc == 0, out[-2000:]


def test_the_warm_pool_and_stopped_workers_are_groups_of_their_own(tmp_path):
    """Pool workers (stopped, or being filled: the inventory's dt_pool) are in dt_this_pool, and a
    stopped worker outside the pool (an add interrupted between its claim of a pool worker and the
    start) in dt_this_stopped: neither is in a group a playbook configures or contacts as the
    cluster's nodes. A stopped master stays the master (whether it is lost is decided elsewhere)."""
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[dt_cluster_c]\n10.0.0.1 dt_state=stopped\n10.0.0.2 dt_state=running\n10.0.0.3\n"
                         "10.0.0.4 dt_state=stopped\n10.0.0.5 dt_state=stopping\n[dt_master]\n10.0.0.1\n"
                         "[dt_workers]\n10.0.0.1\n10.0.0.2\n10.0.0.4\n10.0.0.5\n[dt_pool]\n10.0.0.3\n")
    out_file = tmp_path / "groups.json"
    play = [{
        "name": "Select", "hosts": "localhost", "connection": "local", "gather_facts": False,
        "tasks": [
            {"name": "Select the cluster's nodes",
             "ansible.builtin.include_role": {"name": "dynatrain.elastic.cluster", "tasks_from": "select"},
             "vars": {"cluster_name": "c", "cluster_select_refresh": False}},
            {"name": "Write the groups", "ansible.builtin.copy": {
                "dest": str(out_file), "mode": "0644",
                "content": "{{ {'cluster': groups['dt_this_cluster'], 'workers': groups['dt_this_workers'],"
                           " 'master': groups['dt_this_master'], 'pool': groups['dt_this_pool'],"
                           " 'stopped': groups['dt_this_stopped']} | to_json }}"}},
        ],
    }]
    proc = run_play(tmp_path, play, inventory)
    assert proc.returncode == 0, proc.stdout[-2000:]
    groups = json.loads(out_file.read_text())
    assert groups == {"cluster": ["10.0.0.1", "10.0.0.2"], "workers": ["10.0.0.1", "10.0.0.2"],
                      "master": ["10.0.0.1"], "pool": ["10.0.0.3"], "stopped": ["10.0.0.4", "10.0.0.5"]}
