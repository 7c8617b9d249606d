"""warm_pool main (the fill): a pool worker found running (a fill interrupted before park stopped it) is
configured again and parked by this fill, not counted as a parked worker and left running for good."""
import json

from test_cluster_select import run_play


def test_a_running_pool_worker_is_refilled_not_kept(tmp_path):
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(
        "[dt_cluster_c]\n10.0.0.1\n"
        "10.0.0.3 dt_pool=True dt_state=stopped dt_instance_id=i-3 dt_private_ip=10.0.0.3"
        " dt_launch_time=2026-01-01T00:00:01\n"
        "10.0.0.4 dt_pool=True dt_state=running dt_instance_id=i-4 dt_private_ip=10.0.0.4"
        " dt_launch_time=2026-01-01T00:00:02\n"
        "[dt_master]\n10.0.0.1\n[dt_pool]\n10.0.0.3\n10.0.0.4\n")
    out_file = tmp_path / "fill.json"
    play = [{
        "name": "Fill", "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"cluster_name": "c", "cluster_select_refresh": False, "warm_pool_cluster_name": "c", "warm_pool_size": 2},
        "tasks": [
            {"name": "Select the cluster's nodes",
             "ansible.builtin.include_role": {"name": "dynatrain.elastic.cluster", "tasks_from": "select"}},
            {"name": "Size the pool",
             "ansible.builtin.include_role": {"name": "dynatrain.elastic.warm_pool"}},
            {"name": "Write what it decided", "ansible.builtin.copy": {
                "dest": str(out_file), "mode": "0644",
                "content": "{{ {'filling': warm_pool_filling, 'kept': warm_pool_kept | int} | to_json }}"}},
        ],
    }]
    proc = run_play(tmp_path, play, inventory)
    assert proc.returncode == 0, proc.stdout[-3000:]
    decided = json.loads(out_file.read_text())
    assert decided == {"filling": [{"instance_id": "i-4", "private_ip_address": "10.0.0.4"}], "kept": 1}, decided
