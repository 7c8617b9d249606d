"""playbooks/preflight.yml against an in-process moto server: each failure names what to change,
nothing is created, and the zone chosen is one that offers every instance type."""
from __future__ import annotations

import json
import os

import boto3
import pytest

from playbook_run import CREDENTIALS, ROOT, flat_output, playbook_env, run_playbook

PLAYBOOK = os.path.join(ROOT, "playbooks", "preflight.yml")


@pytest.fixture(scope="module")
def cloud(moto_endpoint):
    url = moto_endpoint
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=url, **{k.lower(): v for k, v in CREDENTIALS.items()})
    # an image of our own (moto's stock AMIs carry the same ids in every region)
    stock = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    instance = ec2.run_instances(ImageId=stock, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    image_id = ec2.create_image(InstanceId=instance, Name="debian-12-amd64-pftest")["ImageId"]
    ec2.terminate_instances(InstanceIds=[instance])
    image = ec2.describe_images(ImageIds=[image_id])["Images"][0]
    yield {"url": url, "ec2": ec2, "image": image}


def settings(cloud, **overrides):
    base = {
        "dt_cluster_name": "pftest",
        "dt_region": "us-east-1",
        "dt_aws_endpoint_url": cloud["url"],
        "dt_admin_cidr": "203.0.113.7/32",
        "dt_ami_name": cloud["image"]["Name"],
        "dt_ami_owner": cloud["image"]["OwnerId"],
        "dt_master_instance_type": "c5.xlarge",
        "dt_worker_instance_type": "c5.xlarge",
    }
    base.update(overrides)
    return base


def run_preflight(tmp_path, variables, env_extra=None, credentials=True, extra=()):
    path = tmp_path / "vars.json"
    path.write_text(json.dumps(variables))
    inventory = tmp_path / "empty.ini"  # localhost stays implicit: the controller's Python (boto3)
    inventory.write_text("")
    proc = run_playbook(inventory, PLAYBOOK, "-e", "@" + str(path), *extra,
                        env=playbook_env(tmp_path, credentials=credentials, **(env_extra or {})))
    return proc.returncode, flat_output(proc)


def vpc_count(cloud):
    return len(cloud["ec2"].describe_vpcs()["Vpcs"]) + len(cloud["ec2"].describe_subnets()["Subnets"])


def test_passes_and_picks_a_zone_offering_every_type(tmp_path, cloud):
    before = vpc_count(cloud)
    rc, out = run_preflight(tmp_path, settings(cloud))
    assert rc == 0, out[-3000:]
    # moto offers c5.xlarge in us-east-1a first
    assert "Preflight passed: account 123456789012, region us-east-1, availability zone us-east-1a" in out
    assert "changed=0" in out
    assert vpc_count(cloud) == before  # nothing created


@pytest.mark.parametrize(
    "overrides, needles",
    [
        ({"dt_admin_cidr": "203.0.113.7/0"}, ["dt_admin_cidr=203.0.113.7/0 would open SSH", "whole internet",
                                              "-e dt_admin_cidr=203.0.113.7/32"]),
        ({"dt_admin_cidr": "0.0.0.0/1"}, ["dt_admin_cidr=0.0.0.0/1 would open SSH", "at least /16"]),
        ({"dt_admin_cidr": "10.0.0.5/24"}, ["has host bits set", "pass -e dt_admin_cidr=10.0.0.0/24"]),
        ({"dt_admin_cidr": ""}, ["dt_admin_cidr is not set"]),
        ({"dt_ami_id": "ami-0123456789abcdef0"},
         ["AMI ami-0123456789abcdef0 (dt_ami_id) is not available in region us-east-1", "-e dt_ami_id=ami-"]),
        ({"dt_ami_name": "no-such-image-*"}, ["No AMI named no-such-image-* owned by", "is not available in region us-east-1"]),
        ({"dt_worker_instance_type": "m9.huge"}, ["m9.huge not offered in any availability zone in us-east-1",
                                                  "dt_worker_instance_type"]),
        ({"dt_availability_zone": "us-east-1e"}, ["c5.xlarge not offered in us-east-1e",
                                                  "use -e dt_availability_zone=us-east-1a"]),
        ({"dt_region": "us-west-2", "dt_ami_id": "IMAGE"}, ["(dt_ami_id) is not available in region us-west-2",
                                                            "AMI ids differ per region"]),
        ({"dt_region": "mars"}, ["dt_region=mars is not a region name"]),
    ],
    ids=["cidr-slash0", "cidr-slash1", "cidr-host-bits", "cidr-unset", "ami-id", "ami-name", "type-nowhere",
         "az-lacks-type", "ami-other-region", "bad-region"],
)
def test_each_failure_says_what_to_change(tmp_path, cloud, overrides, needles):
    overrides = {k: (cloud["image"]["ImageId"] if v == "IMAGE" else v) for k, v in overrides.items()}
    before = vpc_count(cloud)
    rc, out = run_preflight(tmp_path, settings(cloud, **overrides))
    assert rc != 0, out[-3000:]
    for needle in needles:
        assert needle in out, out[-3000:]
    assert "Nothing was created" in out or "not offered" in out, out[-3000:]
    assert vpc_count(cloud) == before


def test_no_credentials(tmp_path, cloud):
    rc, out = run_preflight(tmp_path, settings(cloud), credentials=False)
    assert rc != 0
    assert "No usable AWS credentials for region us-east-1" in out, out[-3000:]
    assert "Set AWS_PROFILE" in out


def test_add_workers_skips_the_admin_cidr(tmp_path, cloud):
    rc, out = run_preflight(tmp_path, settings(cloud, dt_admin_cidr="", dt_preflight_admin_cidr=False))
    assert rc == 0, out[-3000:]


def test_add_workers_leaves_the_ami_and_the_zone_to_the_launch_template(tmp_path, cloud):
    # add_workers launches from the cluster's launch template (its AMI may be the baked image, not
    # dt_ami_name's): the base AMI and the zone are bootstrap's checks; the account is checked again.
    extra = dict(dt_admin_cidr="", dt_preflight_admin_cidr=False, dt_preflight_launch="add", count=1,
                 dt_ami_name="no-such-image-*")
    rc, out = run_preflight(tmp_path, settings(cloud, **extra))
    assert rc == 0, out[-3000:]
    assert "Preflight passed: account 123456789012, region us-east-1 (the AMI and the zone: the launch template)" in out
    rc, out = run_preflight(tmp_path, settings(cloud, **extra), credentials=False)
    assert rc != 0 and "No usable AWS credentials" in out, out[-3000:]


def test_keeps_the_zone_of_the_existing_subnet(tmp_path, cloud):
    ec2 = cloud["ec2"]
    vpc = ec2.create_vpc(CidrBlock="10.99.0.0/16")["Vpc"]["VpcId"]
    ec2.create_subnet(
        VpcId=vpc, CidrBlock="10.99.1.0/24", AvailabilityZone="us-east-1c",
        TagSpecifications=[{"ResourceType": "subnet", "Tags": [
            {"Key": "Name", "Value": "pfkeep-subnet"}, {"Key": "dynatrain:cluster", "Value": "pfkeep"}]}],
    )
    rc, out = run_preflight(tmp_path, settings(cloud, dt_cluster_name="pfkeep"))
    assert rc == 0, out[-3000:]
    assert "availability zone us-east-1c offers c5.xlarge" in out


# dt_train_script_args in each form a user types passes (the refusals: test_settings_refused.py)
@pytest.mark.parametrize("extra", [
    ["-e", json.dumps({"dt_train_script_args": ["--epochs", "20"]})],
    ["-e", 'dt_train_script_args=["--epochs","20"]'],
    ["-e", "dt_train_script_args=--epochs 20 --lr 0.1"],
], ids=["json-list", "kv-json-list", "kv-line"])
def test_passes_with_each_form_of_the_script_args(tmp_path, cloud, extra):
    rc, out = run_preflight(tmp_path, settings(cloud, dt_engine="mxnet"), extra=extra)
    assert rc == 0, out[-3000:]
    assert "Preflight passed" in out


def test_a_bad_setting_is_refused_before_any_cloud_call(tmp_path, cloud):
    rc, out = run_preflight(tmp_path, settings(cloud), credentials=False, extra=["-e", "dt_join_timeout=abc"])
    assert rc != 0
    assert "dt_join_timeout=abc is not valid" in out and "Nothing was created or changed" in out
    assert "No usable AWS credentials" not in out  # the credentials were not even asked for
