"""playbooks/join_workers.yml when every new worker fails its preparation (issue 24, defect 4): Ansible ends a
run whose play has no host left, which skipped "Record the outcome" (no ADD_FAILED, nothing terminated: orphans).
Against an in-process moto server (patched by localcloud.moto_compat) holding the cluster's subnet, security
group and EFS; the two new workers are hosts whose Python does not exist, so their configuration fails at once."""
from __future__ import annotations

import os

import boto3
import pytest

from localcloud import moto_compat
from playbook_run import LOCALHOST, ROOT, flat_output, local_inventory, playbook_env, run_playbook

CLUSTER = "jwtest"
MASTER, NEW = "127.94.1.10", ["127.94.1.11", "127.94.1.12"]


@pytest.fixture
def cloud(moto_endpoint):
    """The cluster's network and file system, and two instances an add_workers launched (ADD_QUEUED)."""
    moto_compat.apply()
    kw = dict(region_name="us-east-1", endpoint_url=moto_endpoint, aws_access_key_id="localcloud",
              aws_secret_access_key="localcloud")
    ec2, efs = boto3.client("ec2", **kw), boto3.client("efs", **kw)
    tag = [{"Key": "dynatrain:cluster", "Value": CLUSTER}]
    vpc = ec2.create_vpc(CidrBlock="127.94.0.0/16", TagSpecifications=[{"ResourceType": "vpc", "Tags": tag}])["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="127.94.1.0/24",
                               TagSpecifications=[{"ResourceType": "subnet", "Tags": tag}])["Subnet"]["SubnetId"]
    ec2.create_security_group(GroupName=f"{CLUSTER}-nodes", Description="nodes", VpcId=vpc)
    efs.create_file_system(CreationToken=f"{CLUSTER}-efs", Tags=tag + [{"Key": "Name", "Value": f"{CLUSTER}-efs"}])
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    tags = tag + [{"Key": "dynatrain:role", "Value": "worker"}, {"Key": "elastic_worker_status", "Value": "ADD_QUEUED"},
                  {"Key": "dynatrain:launch-token", "Value": "t0k3n"}]
    ids = []
    for ip in NEW:
        ids += [i["InstanceId"] for i in ec2.run_instances(
            ImageId=ami, MinCount=1, MaxCount=1, SubnetId=subnet, PrivateIpAddress=ip,
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])["Instances"]]
    yield moto_endpoint, ec2, ids
    ec2.terminate_instances(InstanceIds=ids)


def inventory(tmp_path, endpoint, ids):
    broken = {"ansible_connection": "local", "ansible_become": False, "dt_role": "worker",
              "ansible_python_interpreter": str(tmp_path / "no-python")}
    groups = {
        "dt_this_master": {"hosts": {MASTER: dict(LOCALHOST, dt_private_ip=MASTER)}},
        "dt_new_workers": {"hosts": {ip: dict(broken, dt_private_ip=ip, new_instance_id=iid) for ip, iid in zip(NEW, ids)}},
    }
    path = local_inventory(tmp_path / "inventory.yml", children=groups, dt_aws_endpoint_url=endpoint,
                           dt_cluster_name=CLUSTER, dt_state_dir=str(tmp_path / "state"))
    (tmp_path / "state" / CLUSTER).mkdir(parents=True)
    known = tmp_path / "state" / CLUSTER / "known_hosts"
    known.write_text("".join(f"{ip} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{n:040d}\n" for n, ip in enumerate([MASTER] + NEW)))
    return path, known


def test_every_new_worker_failing_is_still_tagged_add_failed_and_terminated(tmp_path, cloud):
    endpoint, ec2, ids = cloud
    path, known = inventory(tmp_path, endpoint, ids)
    proc = run_playbook(path, os.path.join(ROOT, "playbooks", "join_workers.yml"), env=playbook_env(tmp_path),
                        cwd=tmp_path, timeout=600)
    out = flat_output(proc)
    assert proc.returncode != 0, out[-3000:]
    assert "PLAY [Record the outcome]" in out, out[-3000:]
    assert "2 of 2 new workers did not join (failed: 127.94.1.11, 127.94.1.12)" in out, out[-3000:]
    assert "127.94.1.11 (Gather the node" in out       # the failed task, per node
    found = ec2.describe_instances(InstanceIds=ids)["Reservations"]
    instances = [i for r in found for i in r["Instances"]]
    assert sorted(i["State"]["Name"] for i in instances) == ["terminated", "terminated"]
    for inst in instances:
        tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
        assert tags["elastic_worker_status"] == "ADD_FAILED"
        assert tags["dynatrain:status-time"].isdigit()   # reconcile's dt_queued_timeout reads it
    # their pinned keys were forgotten, the master's kept
    assert [line.split()[0] for line in known.read_text().splitlines()] == [MASTER]
