"""The node roles' plans (tasks/plan.yml of node_base, efs, mxnet, launcher, spot_watch, prepare_data; issue 28,
item 1): on the controller, from the settings and a baked worker's gathered facts, what each role would apply
and whether that is all it would do. configure_nodes applies them in one module run only when every role is
ready; a role that is not (a stale venv, another runtime, bad training environment names) sends the
node the roles' own way, where their checks say what is wrong. Run with ansible-playbook against localhost;
the node's local facts are files in a facts directory (setup's fact_path), a small module says the node runs
systemd (this machine may not), the controller's wheelhouse holds small stand-in wheels."""
from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import zipfile

import pytest
import yaml

from ansible_collections.dynatrain.elastic.plugins.plugin_utils import wheel_lock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ME = pwd.getpwuid(os.getuid())
RUNTIME = "dynatrain_runtime-0.1.0-py3-none-any.whl"
ROLES = ["node_base", "efs", "mxnet", "launcher", "spot_watch", "prepare_data"]
SECRET = "value-that-must-not-show-7f3a"


def wheel(directory, filename, name, version):
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    with zipfile.ZipFile(os.path.join(directory, filename), "w") as zf:
        zf.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return os.path.join(directory, filename)


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    """The controller's wheelhouse (MXNet, numpy, the runtime) and the cluster key; the lock it pins for a CPU
    node with Python 3.11."""
    tmp = tmp_path_factory.mktemp("controller")
    wheels = tmp / "wheels"
    wheels.mkdir()
    paths = [wheel(wheels, "mxnet-1.9.1-py3-none-manylinux2014_x86_64.whl", "mxnet", "1.9.1"),
             wheel(wheels, "numpy-1.23.5-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "numpy", "1.23.5"),
             wheel(wheels, RUNTIME, "dynatrain-runtime", "0.1.0")]
    (tmp / "key").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot a real key\n")
    (tmp / "key.pub").write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTheTest dynatrain\n")
    (tmp / "known_hosts").write_text("")
    lock = wheel_lock.lock(paths, ["mxnet==1.9.1", "numpy==1.23.5"], "3.11")
    assert not lock["missing"], lock
    return {"dir": tmp, "lock": lock["lines"]}


def plans(tmp_path, controller, fact_node=None, fact_baked=None, **settings):
    """Each role's plan for a baked worker (with the node's local facts and the settings changed as given)."""
    facts = tmp_path / "facts.d"
    facts.mkdir()
    # the node user, and the job's two users with node_base's fixed uids (issue 40; a baked image holds them)
    node = {"users": {ME.pw_name: {"uid": ME.pw_uid, "gid": ME.pw_gid, "home": ME.pw_dir},
                      "dynatrain-train": {"uid": 2901, "gid": 2901, "home": "/home/dynatrain-train"},
                      "dynatrain-launcher": {"uid": 2902, "gid": 2902, "home": "/home/dynatrain-launcher"}},
            "nvidia_pci": [],
            "python": {"/usr/bin/python3": "3.11.2"},
            "paths": ["/opt/dynatrain/venv", "/opt/dynatrain/venv/bin/python", "/opt/dynatrain/venv/bin/dt-spot-watch"],
            "locks": {"/opt/dynatrain/mxnet-requirements.lock": controller["lock"]}}
    baked = {"node_base_packages": ["python3", "python3-venv", "openssh-client", "sudo", "rsync", "procps",
                                    "iproute2", "pciutils", "ca-certificates"],
             "engine": "mxnet", "mxnet": True, "torch": False, "runtime": RUNTIME, "cuda": False}
    (facts / "dynatrain_node.fact").write_text(json.dumps(dict(node, **(fact_node or {}))))
    (facts / "dynatrain_baked.fact").write_text(json.dumps(dict(baked, **(fact_baked or {}))))
    c = controller["dir"]
    play_vars = {
        "node_base_user": ME.pw_name, "node_base_cluster_key_file": str(c / "key"),
        "node_base_install_private_key": False, "node_base_authorized_key_from": "10.0.0.0/24",
        "node_base_known_hosts_file": str(c / "known_hosts"), "node_base_efs_mount": "/myEFSvolume",
        "node_base_workers_count": 2, "node_base_worker_gpu_count": 0,
        "efs_mount_type": "bind", "efs_mount_point": "/myEFSvolume", "efs_bind_source": "/localcloud/efs/fs-1",
        "efs_owner": ME.pw_name, "efs_set_owner": False,
        "mxnet_wheelhouse_dir": "/myEFSvolume/wheelhouse", "mxnet_wheelhouse_controller_dir": str(c / "wheels"),
        "mxnet_instance_type": "m5.large", "mxnet_baked": True, "mxnet_extra_packages": [],
        "launcher_runtime_controller_dir": str(c / "wheels"), "launcher_service_enabled": False,
        "launcher_runtime_baked": RUNTIME, "launcher_ssh_user": ME.pw_name, "launcher_efs_mount": "/myEFSvolume",
        "launcher_train_env": {"WANDB_API_KEY": SECRET},
        "spot_watch_user": ME.pw_name, "spot_watch_efs_mount": "/myEFSvolume",
        "prepare_data_node_ip": "10.0.0.5", "prepare_data_user": ME.pw_name,
    }
    play_vars.update(settings)
    out = tmp_path / "plans.json"
    library = tmp_path / "library"
    library.mkdir()
    (library / "systemd_node.py").write_text(
        "#!/usr/bin/python\nimport json\nprint(json.dumps({'changed': False, 'ansible_facts': {'service_mgr': 'systemd'}}))\n")
    setup = {"gather_subset": ["!all", "min"], "fact_path": str(facts)}
    tasks = [{"name": "Gather the node's facts", "ansible.builtin.setup": setup},
             {"name": "A node that runs systemd", "systemd_node": {}}]
    tasks += [{"name": f"Plan {role}",
               "ansible.builtin.import_role": {"name": f"dynatrain.elastic.{role}", "tasks_from": "plan.yml"}}
              for role in ROLES]
    tasks += [{"name": "Write the plans", "delegate_to": "localhost", "ansible.builtin.copy": {
        "dest": str(out), "mode": "0600",
        "content": "{{ {" + ", ".join(f"'{r}': {r}_node_plan" for r in ROLES) + "} | to_json }}"}}]
    play = [{"name": "Plans", "hosts": "localhost", "connection": "local", "gather_facts": False,
             "vars": play_vars, "tasks": tasks}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"), ANSIBLE_LIBRARY=str(library))
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
                           "-e", "ansible_python_interpreter=" + sys.executable, str(tmp_path / "play.yml")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert SECRET not in output                       # the training environment is never shown
    assert "not a real key" not in output             # nor the cluster's private key (the master's plan)
    return json.loads(out.read_text())


def not_ready(result):
    return sorted(role for role, plan in result.items() if plan["ready"] is not True)


def test_a_baked_worker_is_planned_whole(tmp_path, controller):
    result = plans(tmp_path, controller)
    assert not_ready(result) == []
    files = {f["path"]: f for plan in result.values() for f in plan.get("files", [])}
    # issue 40: the cluster key is authorised for the training user (no sudo), never for the login user
    key = files["/home/dynatrain-train/.ssh/authorized_keys"]
    assert key["state"] == "line" and key["line"].startswith('from="10.0.0.0/24" ssh-ed25519 AAAAC3')
    assert (key["owner"], key["group"], key["mode"]) == ("dynatrain-train", "2901", "0600")
    assert ME.pw_dir + "/.ssh/authorized_keys" not in files
    assert files[ME.pw_dir + "/.ssh/dynatrain_cluster"]["state"] == "absent"     # a worker holds no private key
    assert files["/home/dynatrain-launcher/.ssh/dynatrain_cluster"]["state"] == "absent"
    # the training processes' interpreter: the venv's python as the training user, root-owned
    wrapper = files["/opt/dynatrain/bin/dt-train-python"]
    assert (wrapper["owner"], wrapper["mode"]) == ("root", "0755") and "exec sudo -n -E -u " in wrapper["content"]
    assert SECRET in files["/etc/dynatrain/train.env"]["content"] and files["/etc/dynatrain/train.env"]["mode"] == "0600"
    assert "/etc/systemd/system/dynatrain-spot-watch.service" in files
    assert result["efs"]["mounts"] == [{"path": "/myEFSvolume", "src": "/localcloud/efs/fs-1", "fstype": "none",
                                        "opts": "bind"}]
    (service,) = result["spot_watch"]["services"]
    assert service["name"] == "dynatrain-spot-watch" and "/etc/default/dynatrain-spot-watch" in service["restart_when_changed"]
    data = result["prepare_data"]["prepare_data"]
    assert data["marker"] == "/myEFSvolume/prepare_data_success_10.0.0.5" and "ip=10.0.0.5" in data["marker_content"]


def test_a_node_without_the_job_users_is_configured_the_roles_way(tmp_path, controller):
    # an image baked before issue 40 (no training or launcher user), or one with another uid: node_base's tasks
    other = {"users": {ME.pw_name: {"uid": ME.pw_uid, "gid": ME.pw_gid, "home": ME.pw_dir},
                       "dynatrain-train": {"uid": 3000, "gid": 3000, "home": "/home/dynatrain-train"},
                       "dynatrain-launcher": {"uid": 2902, "gid": 2902, "home": "/home/dynatrain-launcher"}}}
    assert "node_base" in not_ready(plans(tmp_path, controller, fact_node=other))


@pytest.mark.parametrize("change, refused", [
    # the image's venv was installed from another lock than the one the controller pins now
    ({"fact_node": {"locks": {"/opt/dynatrain/mxnet-requirements.lock": ["mxnet==1.9.0 --hash=sha256:00"]}}}, ["mxnet"]),
    # the image holds another runtime wheel than the controller's (configure_nodes passes the marker's)
    ({"settings": {"launcher_runtime_baked": "dynatrain_runtime-0.0.9-py3-none-any.whl"}}, ["launcher"]),
    # names the runtime sets itself: train_env.yml refuses them, with the reason
    ({"settings": {"launcher_train_env": {"PATH": SECRET}}}, ["launcher"]),
    # the watcher's program is not in the image's venv
    ({"fact_node": {"paths": ["/opt/dynatrain/venv/bin/python"]}}, ["spot_watch"]),
    # an NFS mount whose client is not in the image (an image baked for the local cloud's bind mounts)
    ({"settings": {"efs_mount_type": "nfs4", "efs_file_system_id": "fs-0123abcd"}}, ["efs"]),
    # a script to copy from the controller first
    ({"settings": {"prepare_data_script_src": "/tmp/prepare.py"}}, ["prepare_data"]),
    # settings the roles' preflight refuses (the plan reads the same checks): that path then says what is wrong
    ({"settings": {"efs_mount_type": "nfs4", "efs_file_system_id": "fs-0123abcd", "efs_baked_packages": ["nfs-common"],
                   "efs_region": "Frankfurt"}}, ["efs"]),
    ({"settings": {"prepare_data_timeout": "long"}}, ["prepare_data"]),
    ({"settings": {"node_base_workers_count": "two"}}, ["node_base"]),
    ({"settings": {"node_base_known_hosts_file": "/nonexistent/known_hosts"}}, ["node_base"]),
])
def test_a_role_that_cannot_plan_the_node_sends_it_the_roles_way(tmp_path, controller, change, refused):
    result = plans(tmp_path, controller, change.get("fact_node"), change.get("fact_baked"), **change.get("settings", {}))
    assert not_ready(result) == refused


def test_the_master_is_planned_with_its_ssh_client_side_and_the_volumes_owner(tmp_path, controller):
    # the node that opens node-to-node SSH (the launcher's) and sets the shared root's owner: one module run too
    result = plans(tmp_path, controller, node_base_install_private_key=True, efs_set_owner=True,
                   node_base_ssh_config_hosts=["10.0.0.*"])
    assert not_ready(result) == []
    files = {f["path"]: f for plan in result.values() for f in plan.get("files", [])}
    # issue 40: the private key and known_hosts in the launcher user's home (0700), none left in the login
    # user's; the cluster key authorised for the training user alone, from the subnet only; ssh logs in as it
    ssh = "/home/dynatrain-launcher/.ssh/"
    assert (files[ssh[:-1]]["owner"], files[ssh[:-1]]["mode"]) == ("dynatrain-launcher", "0700")
    assert files[ME.pw_dir + "/.ssh/dynatrain_cluster"]["state"] == "absent"
    auth = files["/home/dynatrain-train/.ssh/authorized_keys"]
    assert (auth["owner"], auth["mode"], auth["state"]) == ("dynatrain-train", "0600", "line")
    assert auth["line"].startswith('from="') and "ssh-ed25519 AAAAC3" in auth["line"]
    assert not any(p.startswith(ME.pw_dir + "/.ssh/authorized_keys") for p in files)
    assert files[ssh + "known_hosts_dynatrain"]["owner"] == "dynatrain-launcher"
    assert files[ssh + "known_hosts_dynatrain"]["mode"] == "0600"
    key = files[ssh + "dynatrain_cluster"]
    assert key["owner"] == "dynatrain-launcher"
    assert key["content"] == (controller["dir"] / "key").read_text() and key["mode"] == "0600"
    assert key.get("state", "file") == "file"                                     # installed, not removed
    assert files[ssh + "dynatrain_cluster.pub"]["content"].startswith("ssh-ed25519 AAAAC3")
    assert files[ssh + "known_hosts_dynatrain"]["content"] == (controller["dir"] / "known_hosts").read_text()
    # merged into the master's under its lock, never replaced whole (issue 40: two adds dropped each other's)
    assert files[ssh + "known_hosts_dynatrain"]["state"] == "known_hosts"
    config = files[ssh + "config"]
    assert config["state"] == "block" and "{mark}" in config["marker"] and config["mode"] == "0600"
    assert "Host 10.0.0.*" in config["content"] and "StrictHostKeyChecking yes" in config["content"]
    assert "User dynatrain-train" in config["content"]
    (mount,) = result["efs"]["mounts"]
    assert (mount["owner"], mount["group"], mount["mode"]) == (ME.pw_name, ME.pw_name, "0775")


def test_an_nfs_client_baked_into_the_image_is_planned(tmp_path, controller):
    result = plans(tmp_path, controller, efs_mount_type="nfs4", efs_file_system_id="fs-0123abcd",
                   efs_baked_packages=["nfs-common"], efs_region="eu-west-1")
    assert not_ready(result) == []
    (mount,) = result["efs"]["mounts"]
    assert mount["src"] == "fs-0123abcd.efs.eu-west-1.amazonaws.com:/" and mount["fstype"] == "nfs4"
