"""roles/fleet lost_master.yml (bootstrap's "replace a lost master"), run with ansible-playbook against a
moto server patched by localcloud.moto_compat (issue 24, defect 6). Nothing answers SSH here, so the master
is always silent to the controller; only EC2's status checks tell a lost machine from a controller that
cannot reach a healthy one: the first is terminated (and its pinned key forgotten), the second never."""
import os
import subprocess
import sys

import boto3
import pytest
import yaml
from botocore.config import Config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from localcloud import moto_compat  # noqa: E402


@pytest.fixture(scope="module")
def cloud(moto_endpoint):
    moto_compat.apply()
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_endpoint, aws_access_key_id="localcloud",
                       aws_secret_access_key="localcloud", config=Config(retries={"total_max_attempts": 1}))
    vpc = ec2.create_vpc(CidrBlock="127.93.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="127.93.1.0/24")["Subnet"]["SubnetId"]
    return moto_endpoint, ec2, subnet


def launch_master(ec2, subnet, cluster):
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    (inst,) = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, SubnetId=subnet, TagSpecifications=[{
        "ResourceType": "instance",
        "Tags": [{"Key": "dynatrain:cluster", "Value": cluster}, {"Key": "dynatrain:role", "Value": "master"}]}],
    )["Instances"]
    return inst["InstanceId"], inst["PrivateIpAddress"]


def run_lost_master(tmp_path, endpoint, cluster):
    play = [{
        "name": "Replace a lost master", "hosts": "localhost", "connection": "local", "gather_facts": False,
        "tasks": [{
            "name": "Lost master",
            "ansible.builtin.include_role": {"name": "dynatrain.elastic.fleet", "tasks_from": "lost_master"},
            "vars": {"fleet_cluster_name": cluster, "fleet_endpoint_url": endpoint, "fleet_access_key": "localcloud",
                     "fleet_secret_key": "localcloud", "fleet_state_dir": str(tmp_path),
                     "fleet_connect_private": True, "fleet_master_lost_timeout": 1},
        }],
    }]
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump(play))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), AWS_MAX_ATTEMPTS="1")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
                           "-e", "ansible_python_interpreter=" + sys.executable, str(path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split())


def state(ec2, iid):
    return ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["State"]["Name"]


def pin(tmp_path, cluster, *ips):
    (tmp_path / cluster).mkdir()
    known = tmp_path / cluster / "known_hosts"
    known.write_text("".join(f"{ip} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{n:040d}\n" for n, ip in enumerate(ips)))
    return known


def test_a_master_only_the_controller_cannot_reach_is_never_terminated(cloud, tmp_path):
    endpoint, ec2, subnet = cloud
    iid, ip = launch_master(ec2, subnet, "alive")
    known = pin(tmp_path, "alive", ip)
    rc, out = run_lost_master(tmp_path, endpoint, "alive")
    assert rc != 0, out[-3000:]
    assert state(ec2, iid) == "running"
    assert f"The master {iid} does not answer SSH from this controller" in out
    assert f"{iid}: instance ok, system ok" in out and "Nothing was terminated." in out
    assert ip in known.read_text()


def test_a_master_whose_machine_is_lost_is_terminated_and_forgotten(cloud, tmp_path):
    endpoint, ec2, subnet = cloud
    iid, ip = launch_master(ec2, subnet, "lost")
    known = pin(tmp_path, "lost", ip, "127.93.1.250")
    moto_compat.set_impaired(iid, "container exited")
    try:
        rc, out = run_lost_master(tmp_path, endpoint, "lost")
    finally:
        moto_compat.set_impaired(iid, None)
    assert rc == 0, out[-3000:]
    assert state(ec2, iid) == "terminated"
    assert f"The master {ip} did not answer SSH for 1 s and EC2" in out      # (YAML output doubles the ')
    assert "status checks of its machine failed: it was terminated" in out
    assert known.read_text().splitlines() == ["127.93.1.250 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI" + "1".zfill(40)]
