"""Several regions on the local cloud, as on AWS (issue 14): the node AMI exists in every region (an id of its
own in each, registered when moto first touches the region), vCPU quotas are per region (`quota --region`),
and the reconciler sees the instances and file systems of every region."""
from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from localcloud import cli, config, daemon, podman, quotas
from localcloud.reconciler import Reconciler, efs_for, plan

REGIONS = ("us-east-1", "us-west-2", "eu-west-1", "ap-northeast-1")
STANDARD = "L-1216C47A"


def client(service, region):
    return boto3.client(service, region_name=region, aws_access_key_id="x", aws_secret_access_key="x")


def node_amis(region):
    return client("ec2", region).describe_images(
        Owners=["self"], Filters=[{"Name": "name", "Values": [config.AMI_NAME]}])["Images"]


@pytest.fixture
def every_region():
    daemon.node_ami_in_every_region()
    daemon.node_ami_in_every_region()  # idempotent: one AMI per region, not two
    try:
        with mock_aws():
            yield
    finally:
        daemon.node_ami_in_every_region(False)


def test_the_node_ami_is_in_every_region_with_an_id_of_its_own(every_region):
    ids = {}
    for region in REGIONS:
        (image,) = node_amis(region)
        assert (image["State"], image["Architecture"], image["RootDeviceName"]) == ("available", "x86_64", "/dev/xvda")
        assert image["OwnerId"] == "123456789012"  # dt_ami_owner of the local inventory
        ids[region] = image["ImageId"]
    assert len(set(ids.values())) == len(REGIONS)
    # the daemon's ensure_ami finds it instead of registering a second one
    assert daemon.ensure_ami(client("ec2", "us-east-1")) == ids["us-east-1"]
    assert len(node_amis("us-east-1")) == 1


def test_without_the_patch_a_region_has_no_node_ami():
    daemon.node_ami_in_every_region(False)
    with mock_aws():
        assert node_amis("eu-west-1") == []


@pytest.fixture
def sq():
    quotas.apply()
    quotas.reset()
    with mock_aws():
        yield {region: client("service-quotas", region) for region in ("us-east-1", "us-west-2")}
    quotas.reset()


def value(sq, region):
    return sq[region].get_service_quota(ServiceCode="ec2", QuotaCode=STANDARD)["Quota"]["Value"]


def test_a_region_quota_leaves_the_other_regions(sq):
    assert quotas.handle_post({"service": "ec2", "code": STANDARD, "value": 0, "region": "us-west-2"})[0] == 200
    assert (value(sq, "us-west-2"), value(sq, "us-east-1")) == (0, quotas.DEFAULT_VCPUS)
    assert sq["us-west-2"].get_service_quota(ServiceCode="ec2", QuotaCode=STANDARD)["Quota"]["QuotaArn"].startswith(
        "arn:aws:servicequotas:us-west-2:")


def test_every_region_without_region_as_before_and_it_replaces_the_regions_values(sq):
    quotas.set_quota("ec2", STANDARD, 0, region="us-west-2")
    quotas.set_quota("ec2", STANDARD, 32)
    assert (value(sq, "us-west-2"), value(sq, "us-east-1")) == (32, 32)
    quotas.set_quota("ec2", STANDARD, 8, region="us-east-1")
    assert (value(sq, "us-west-2"), value(sq, "us-east-1")) == (32, 8)


def test_a_bad_region_is_refused():
    status, reply = quotas.handle_post({"service": "ec2", "code": STANDARD, "value": 1, "region": "Mars"})
    assert status == 400 and "not a region name: 'Mars'" in reply["error"]


def test_cli_quota_sends_the_region(monkeypatch, capsys):
    sent = []

    def control(path, body=None, timeout=10):
        sent.append((path, body))
        return quotas.handle_post(body)

    monkeypatch.setattr(cli, "_daemon_pid", lambda: 4242)
    monkeypatch.setattr(cli, "_control", control)
    try:
        assert cli.main(["quota", "--region", "us-west-2", "ec2", STANDARD, "0"]) == 0
        assert sent[-1] == ("/quota", {"service": "ec2", "code": STANDARD, "value": 0.0, "region": "us-west-2"})
        assert capsys.readouterr().out.strip().endswith("= 0 vCPUs in us-west-2")
        assert cli.main(["quota", "ec2", STANDARD, "16"]) == 0
        assert sent[-1][1]["region"] is None
        assert capsys.readouterr().out.strip().endswith("= 16 vCPUs in every region")
        assert quotas.value_in("ec2", STANDARD, "us-west-2") == 16
    finally:
        quotas.reset()


def _cluster(region, second_octet):
    """A VPC on a loopback CIDR, an instance in it and an EFS with a mount target there."""
    ec2, efs = client("ec2", region), client("efs", region)
    vpc = ec2.create_vpc(CidrBlock=f"127.{second_octet}.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=f"127.{second_octet}.1.0/24")["Subnet"]["SubnetId"]
    image = node_amis(region)[0]["ImageId"]
    instance = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, SubnetId=subnet,
                                 InstanceType="c5.xlarge")["Instances"][0]
    fs = efs.create_file_system(CreationToken=f"fs-{region}")["FileSystemId"]
    efs.create_mount_target(FileSystemId=fs, SubnetId=subnet)
    return instance["InstanceId"], instance["PrivateIpAddress"], vpc, fs


def test_the_reconciler_sees_instances_and_file_systems_of_every_region(every_region, monkeypatch, tmp_path):
    monkeypatch.setattr(podman, "list_containers", lambda home: {})
    east = _cluster("us-east-1", 121)
    west = _cluster("us-west-2", 122)
    assert {"us-east-1", "us-west-2"} <= set(daemon.moto_regions())
    reconciler = Reconciler(client, lambda: ["us-east-1", "us-west-2"], str(tmp_path))
    instances, containers, fs_vpcs = reconciler.gather()
    by_id = {i.id: i for i in instances}
    for region, (iid, ip, vpc, fs) in (("us-east-1", east), ("us-west-2", west)):
        assert (by_id[iid].region, by_id[iid].private_ip, by_id[iid].vpc_id) == (region, ip, vpc)
        assert fs_vpcs[fs] == {vpc}
        assert efs_for(by_id[iid], fs_vpcs) == [fs]  # its own region's file system only
    assert sorted(a.instance_id for a in plan(instances, containers, set(), set()) if a.kind == "create") == \
        sorted([east[0], west[0]])
