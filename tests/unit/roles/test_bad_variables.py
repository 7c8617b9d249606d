"""A bad role variable (wrong type, unknown choice, missing required, or a
value the preflight refuses) fails before the role changes anything, with a
message naming the variable. Runs in check mode against localhost."""
import os
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

CASES = [
    # (role, tasks_from, vars, text the failure must contain)
    ("cluster", "main", {"cluster_max_workers": "many"}, "cluster_max_workers"),
    ("cluster", "main", {"cluster_worker_count": "-1", "cluster_admin_cidr": "10.0.0.0/8"}, "worker_count=-1"),
    ("cluster", "main", {"cluster_admin_cidr": "0.0.0.0/0"}, "dt_admin_cidr"),
    ("fleet", "launch", {}, "fleet_launch_count"),
    ("fleet", "launch", {"fleet_launch_count": 1, "fleet_worker_market": "reserved"}, "fleet_worker_market"),
    ("fleet", "launch", {"fleet_launch_count": 1, "fleet_spot_fallback": "wait"}, "fleet_spot_fallback"),
    ("cuda", "main", {"cuda_reboot_timeout": "soon"}, "cuda_reboot_timeout"),
    ("efs", "main", {"efs_mount_type": "smb"}, "efs_mount_type"),
    # issue 27: the efs-utils mount is the encrypted one; it cannot lose TLS
    ("efs", "main", {"efs_mount_type": "efs", "efs_file_system_id": "fs-0123abcd", "efs_efs_options": "_netdev"},
     "must keep tls"),
    ("launcher", "main", {"launcher_state": "paused"}, "launcher_state"),
    ("launcher", "main", {"launcher_stop_timeout": "later"}, "launcher_stop_timeout"),
    ("mxnet", "main", {"mxnet_install_source": "conda"}, "mxnet_install_source"),
    ("torch", "main", {"torch_install_source": "conda"}, "torch_install_source"),
    ("torch", "main", {"torch_variant": "tpu"}, "torch_variant"),
    ("launcher", "main", {"launcher_engine": "jax"}, "launcher_engine"),
    ("cuda", "main", {"cuda_engine": "jax"}, "cuda_engine"),
    ("node_base", "main", {"node_base_workers_count": "two"}, "node_base_workers_count"),
    ("prepare_data", "main", {"prepare_data_state": "gone"}, "prepare_data_state"),
    ("prepare_data", "main", {"prepare_data_timeout": "long"}, "prepare_data_timeout"),
    ("reconcile_timer", "main", {"reconcile_timer_interval": "5"}, "reconcile_timer_interval"),
    ("spot_watch", "main", {"spot_watch_state": "paused"}, "spot_watch_state"),
]


@pytest.mark.parametrize("role,entry,variables,needle", CASES,
                         ids=["%s-%s-%s" % (c[0], c[1], "-".join(c[2]) or "missing") for c in CASES])
def test_bad_variable_is_named(tmp_path, role, entry, variables, needle):
    play = [{
        "name": "Bad variable",
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "tasks": [{
            "name": "Include the role",
            "ansible.builtin.include_role": {"name": "dynatrain.elastic." + role, "tasks_from": entry},
            "vars": variables,
        }],
    }]
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump(play))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "--check",
                           "-i", "localhost,", str(path)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    assert needle in out, out[-2000:]
    assert "changed=0" in out, out[-2000:]
