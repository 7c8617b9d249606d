"""moto_compat's public addresses: an instance whose launch template's interface
says AssociatePublicIpAddress gets a public IP from the loopback pool
127.254.0.0/16 (reachable here), distinct from its private one and from every
other live instance's; without it, none (as on EC2)."""

import ipaddress

import pytest

from localcloud import moto_compat

POOL = ipaddress.ip_network("127.254.0.0/16")


@pytest.fixture(scope="module")
def templates(ec2):
    """Two templates in a loopback subnet: one with public addresses, one without."""
    vpc = ec2.create_vpc(CidrBlock="127.91.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="127.91.1.0/24")["Subnet"]["SubnetId"]
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    for name, public in (("pub", True), ("priv", False)):
        ec2.create_launch_template(
            LaunchTemplateName="public-ip-" + name,
            LaunchTemplateData={
                "ImageId": ami, "InstanceType": "t3.micro",
                "NetworkInterfaces": [{"DeviceIndex": 0, "SubnetId": subnet, "AssociatePublicIpAddress": public}],
            },
        )
    yield {"pub": "public-ip-pub", "priv": "public-ip-priv"}
    ids = [i["InstanceId"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]
    if ids:
        ec2.terminate_instances(InstanceIds=ids)


def _launch(ec2, template, count=1):
    ids = [i["InstanceId"] for i in ec2.run_instances(
        MinCount=count, MaxCount=count, LaunchTemplate={"LaunchTemplateName": template})["Instances"]]
    return _describe(ec2, ids)


def _describe(ec2, ids):
    return [i for r in ec2.describe_instances(InstanceIds=ids)["Reservations"] for i in r["Instances"]]


def test_public_addresses_come_from_the_loopback_pool(ec2, templates):
    instances = _launch(ec2, templates["pub"], count=6) + _launch(ec2, templates["pub"], count=2)
    public = [i["PublicIpAddress"] for i in instances]
    assert len(set(public)) == len(public) == 8  # no two instances share one
    for i in instances:
        ip = ipaddress.ip_address(i["PublicIpAddress"])
        assert ip in POOL and str(ip).rsplit(".", 1)[1] not in ("0", "255")
        assert ipaddress.ip_address(i["PrivateIpAddress"]) in ipaddress.ip_network("127.91.1.0/24")
        assert i["PublicIpAddress"] != i["PrivateIpAddress"]
        assert i["PublicDnsName"] == "ec2-%s.compute-1.amazonaws.com" % i["PublicIpAddress"].replace(".", "-")


def test_no_public_address_without_associate_public_ip(ec2, templates):
    for i in _launch(ec2, templates["priv"], count=2):
        assert not i.get("PublicIpAddress")
        assert i["PrivateIpAddress"].startswith("127.91.1.")


def test_stop_and_terminate_release_the_public_address(ec2, templates):
    a, b = _launch(ec2, templates["pub"], count=2)
    ec2.stop_instances(InstanceIds=[a["InstanceId"]])
    ec2.terminate_instances(InstanceIds=[b["InstanceId"]])
    for i in _describe(ec2, [a["InstanceId"], b["InstanceId"]]):
        assert not i.get("PublicIpAddress")
    assert a["PublicIpAddress"] not in moto_compat._public_ips_in_use()
    # Started again, it gets a (new) address from the pool, as on EC2.
    ec2.start_instances(InstanceIds=[a["InstanceId"]])
    (again,) = _describe(ec2, [a["InstanceId"]])
    assert ipaddress.ip_address(again["PublicIpAddress"]) in POOL


class _Seq:
    def __init__(self, values):
        self.values = list(values)

    def randrange(self, n):
        assert n == POOL.num_addresses
        return self.values.pop(0)


def test_free_public_ip_skips_network_broadcast_and_taken_addresses():
    # .0 and .255 never; 127.254.0.1 is taken; 127.254.1.2 is the first free one.
    rng = _Seq([0, 255, 1, 256 + 2])
    assert moto_compat.free_public_ip({"127.254.0.1"}, rng=rng) == "127.254.1.2"
    assert rng.values == []


def test_free_public_ip_skips_an_address_someone_answers_on(monkeypatch):
    monkeypatch.setattr(moto_compat, "_answers_ssh", lambda ip: ip == "127.254.0.7")
    assert moto_compat.free_public_ip((), rng=_Seq([7, 8])) == "127.254.0.8"
