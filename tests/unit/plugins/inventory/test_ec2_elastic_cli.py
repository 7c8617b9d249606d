"""ansible-inventory / ansible-playbook with the plugin against a moto server on 127.0.0.1:
endpoint_url, AWS_ENDPOINT_URL, the local-cloud config, and `meta: refresh_inventory`."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request

import pytest
from moto.server import ThreadedMotoServer

from ec2_elastic_testlib import ROOT, ec2_client, free_port, launch

BIN = os.path.dirname(sys.executable)


@pytest.fixture
def server():
    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    endpoint = f"http://127.0.0.1:{port}"
    # moto's backends are process-wide: start from an empty cloud
    urllib.request.urlopen(urllib.request.Request(endpoint + "/moto-api/reset", method="POST")).read()
    yield endpoint
    moto.stop()


def plain(value):
    """--list output marks values from the cloud as unsafe: {'__ansible_unsafe': v} -> v"""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def ansible(tool, *args, env=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    full_env.update(ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), AWS_EC2_METADATA_DISABLED="true",
                    PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    full_env.update(env or {})
    return subprocess.run([os.path.join(BIN, tool), *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, check=False, timeout=300)


def localcloud_inventory(tmp_path, endpoint):
    """inventories/local with its endpoint pointed at this test's server."""
    target = tmp_path / "local"
    shutil.copytree(os.path.join(ROOT, "inventories", "local"), target)
    cfg = target / "localcloud.ec2_elastic.yml"
    cfg.write_text(cfg.read_text().replace("http://127.0.0.1:4599", endpoint))
    assert endpoint in cfg.read_text()
    return str(target)


def test_localcloud_config_endpoint_url(tmp_path, server):
    ec2 = ec2_client("us-east-1", endpoint_url=server)
    master = launch(ec2, cluster="demo", role="master", instance_type="c5.large")[0]
    launch(ec2, 2, cluster="demo", role="worker", instance_type="g4dn.xlarge")
    proc = ansible("ansible-inventory", "-i", localcloud_inventory(tmp_path, server), "--list")
    assert proc.returncode == 0, proc.stderr
    listing = plain(json.loads(proc.stdout))
    (name,) = listing["dt_master"]["hosts"]
    hostvars = listing["_meta"]["hostvars"][name]
    assert hostvars["dt_instance_id"] == master
    assert hostvars["dt_private_ip"] == name
    assert len(listing["dt_workers"]["hosts"]) == 3 and len(listing["dt_base"]["hosts"]) == 2


def _ansible_hosts(inventory, *extra, env=None):
    """{host: ansible_host} as a play sees them (group_vars templated), implicit localhost included."""
    proc = ansible("ansible", "-i", inventory, "all,localhost", "-m", "ansible.builtin.debug", "-a", "var=ansible_host",
                   *extra, env=dict(env or {}, ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
                                    ANSIBLE_LOAD_CALLBACK_PLUGINS="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hosts = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]
    return {name: result["ansible_host"] for name, result in hosts.items()}


def _shipped_inventory(tmp_path, server, which):
    """inventories/local or inventories/aws (group_vars and all) against this test's moto."""
    if which == "local":
        return localcloud_inventory(tmp_path, server), {}
    target = tmp_path / "aws"
    shutil.copytree(os.path.join(ROOT, "inventories", "aws"), target)
    return str(target), {"AWS_ENDPOINT_URL": server, "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}


@pytest.mark.parametrize("which", ["local", "aws"])
def test_shipped_inventories_choose_the_address_by_dt_connect_private(tmp_path, server, which):
    """Both inventories alike: dt_connect_private (default: not dt_create_internet_gateway) picks
    the private or the public address; the implicit localhost of the provisioning plays (which
    group_vars/all reaches too) keeps its own name instead of failing on dt_private_ip."""
    ec2 = ec2_client("us-east-1", endpoint_url=server)
    ids = launch(ec2, 2, cluster="demo", role="worker")
    nodes = {i["PrivateIpAddress"]: i.get("PublicIpAddress")
             for r in ec2.describe_instances(InstanceIds=ids)["Reservations"] for i in r["Instances"]}
    assert all(nodes.values()), nodes  # moto's default subnets map public IPs
    inventory, env = _shipped_inventory(tmp_path, server, which)
    private = dict({ip: ip for ip in nodes}, localhost="localhost")
    public = dict(nodes, localhost="localhost")
    # local: no internet gateway by default; aws: a gateway, dt_connect_private: false
    assert _ansible_hosts(inventory, env=env) == (private if which == "local" else public)
    assert _ansible_hosts(inventory, "-e", "dt_create_internet_gateway=true", "-e", "dt_connect_private=false",
                          env=env) == public
    assert _ansible_hosts(inventory, "-e", "dt_create_internet_gateway=true", "-e", "dt_connect_private=true",
                          env=env) == private
    if which == "local":
        assert _ansible_hosts(inventory, "-e", "dt_create_internet_gateway=true", env=env) == public


def test_aws_endpoint_url_env(tmp_path, server):
    launch(ec2_client("us-east-1", endpoint_url=server), cluster="demo", role="master")
    cfg = tmp_path / "env.ec2_elastic.yml"
    cfg.write_text("plugin: dynatrain.elastic.ec2_elastic\nregions: [us-east-1]\n")
    proc = ansible("ansible-inventory", "-i", str(cfg), "--list",
                   env={"AWS_ENDPOINT_URL": server, "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"})
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["dt_master"]["hosts"]) == 1


def test_errors_reach_the_user(tmp_path):
    bad = tmp_path / "typo.ec2_elastic.yml"
    bad.write_text("plugin: dynatrain.elastic.ec2_elastic\nregions: [us-east-1]\ncluster: demo\n")
    proc = ansible("ansible-inventory", "-i", str(bad), "--list", env={"ANSIBLE_INVENTORY_UNPARSED_FAILED": "true"})
    assert proc.returncode != 0
    assert "did you mean 'clusters'" in proc.stderr
    wrong = tmp_path / "cluster.yml"
    wrong.write_text("plugin: dynatrain.elastic.ec2_elastic\nregions: [us-east-1]\n")
    proc = ansible("ansible-inventory", "-i", str(wrong), "--list")
    assert "must end in 'ec2_elastic.yml' or 'ec2_elastic.yaml'" in proc.stderr


def test_refresh_inventory_in_a_playbook(tmp_path, server):
    ec2 = ec2_client("us-east-1", endpoint_url=server)
    launch(ec2, cluster="demo", role="master")
    script = tmp_path / "launch.py"
    script.write_text(
        "import boto3\n"
        f"ec2 = boto3.client('ec2', region_name='us-east-1', endpoint_url='{server}',"
        " aws_access_key_id='a', aws_secret_access_key='b')\n"
        "ec2.run_instances(ImageId='ami-12c6146b', MinCount=2, MaxCount=2, TagSpecifications=[{'ResourceType': 'instance',"
        " 'Tags': [{'Key': 'dynatrain:cluster', 'Value': 'demo'}, {'Key': 'demo-aws-dl-cfn-elastic-worker', 'Value': ''},"
        " {'Key': 'elastic_worker_status', 'Value': 'ADD_QUEUED'}]}])\n"
    )
    playbook = tmp_path / "refresh.yml"
    playbook.write_text(f"""---
- name: Launch and re-read
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Before
      ansible.builtin.assert:
        that: groups['dt_status_add_queued'] | length == 0 and groups['dt_workers'] | length == 1
    - name: Launch two elastic workers
      ansible.builtin.command: {sys.executable} {script}
      changed_when: true
    - name: Refresh
      ansible.builtin.meta: refresh_inventory
    - name: After
      ansible.builtin.assert:
        that: groups['dt_status_add_queued'] | length == 2 and groups['dt_workers'] | length == 3
""")
    proc = ansible("ansible-playbook", "-i", localcloud_inventory(tmp_path, server), str(playbook))
    assert proc.returncode == 0, proc.stdout + proc.stderr
