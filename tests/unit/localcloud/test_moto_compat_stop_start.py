"""moto_compat's stop/start as on EC2: with transitions (the daemon), StopInstances leaves the
instance `stopping` and StartInstances `pending` until the reconciler settles them (once the
container stopped / the node answers); the private IP stays, the public one is released on stop
and a new one given on start. Requests that EC2 ignores or refuses are ignored or refused."""

import ipaddress

import pytest
from botocore.exceptions import ClientError

from localcloud import moto_compat

POOL = ipaddress.ip_network("127.254.0.0/16")


@pytest.fixture
def transitions():
    moto_compat.use_transitions(True)
    yield
    moto_compat.use_transitions(False)  # process-wide: other modules' moto keeps its immediate states


@pytest.fixture(scope="module")
def launch(ec2):
    vpc = ec2.create_vpc(CidrBlock="127.92.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="127.92.1.0/24")["Subnet"]["SubnetId"]
    ec2.modify_subnet_attribute(SubnetId=subnet, MapPublicIpOnLaunch={"Value": True})
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    launched = []

    def run():
        (i,) = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, SubnetId=subnet)["Instances"]
        launched.append(i["InstanceId"])
        return describe(ec2, i["InstanceId"])

    yield run
    ec2.terminate_instances(InstanceIds=launched)


def describe(ec2, iid):
    (i,) = [i for r in ec2.describe_instances(InstanceIds=[iid])["Reservations"] for i in r["Instances"]]
    return i


def state(ec2, iid):
    return describe(ec2, iid)["State"]["Name"]


def test_stop_is_stopping_until_settled_then_start_is_pending_until_settled(ec2, launch, transitions):
    first = launch()
    iid, private, public = first["InstanceId"], first["PrivateIpAddress"], first["PublicIpAddress"]
    assert ipaddress.ip_address(public) in POOL

    (stopping,) = ec2.stop_instances(InstanceIds=[iid])["StoppingInstances"]
    assert (stopping["PreviousState"]["Name"], stopping["CurrentState"]["Name"]) == ("running", "stopping")
    i = describe(ec2, iid)
    assert i["State"] == {"Code": 64, "Name": "stopping"}
    assert i["PrivateIpAddress"] == private and not i.get("PublicIpAddress")  # EC2 releases it on stop
    assert moto_compat.settle(iid, "pending", "running") is False  # not in that state: nothing moves
    assert moto_compat.settle(iid, "stopping", "stopped") is True
    i = describe(ec2, iid)
    assert i["State"] == {"Code": 80, "Name": "stopped"}
    assert i["StateReason"]["Code"] == "Client.UserInitiatedShutdown"

    ec2.start_instances(InstanceIds=[iid])
    i = describe(ec2, iid)
    assert i["State"] == {"Code": 0, "Name": "pending"}
    assert i["PrivateIpAddress"] == private
    again = i["PublicIpAddress"]  # a new one from the pool, as EC2 gives one at each start
    assert ipaddress.ip_address(again) in POOL
    assert moto_compat.settle(iid, "pending", "running") is True
    assert state(ec2, iid) == "running"

    # Starting a running instance changes nothing (moto drew yet another public IP).
    ec2.start_instances(InstanceIds=[iid])
    assert describe(ec2, iid)["PublicIpAddress"] == again and state(ec2, iid) == "running"


def test_a_start_the_machine_cannot_make_returns_the_instance_to_stopped(ec2, launch, transitions):
    iid = launch()["InstanceId"]
    assert moto_compat.start_failed(iid) is False                       # running: not a start in flight
    ec2.stop_instances(InstanceIds=[iid])
    assert moto_compat.settle(iid, "stopping", "stopped") is True
    ec2.start_instances(InstanceIds=[iid])
    assert describe(ec2, iid).get("PublicIpAddress")                    # pending, with a new public IP
    assert moto_compat.start_failed(iid) is True
    i = describe(ec2, iid)
    assert i["State"] == {"Code": 80, "Name": "stopped"} and not i.get("PublicIpAddress")
    assert i["StateReason"]["Code"] == "Server.InternalError"
    ec2.start_instances(InstanceIds=[iid])                              # and it can be started again
    assert state(ec2, iid) == "pending" and moto_compat.settle(iid, "pending", "running") is True


def test_requests_ec2_ignores_or_refuses(ec2, launch, transitions):
    iid = launch()["InstanceId"]
    ec2.stop_instances(InstanceIds=[iid])
    ec2.stop_instances(InstanceIds=[iid])  # again while stopping: nothing changes
    assert state(ec2, iid) == "stopping"
    with pytest.raises(ClientError) as e:
        ec2.start_instances(InstanceIds=[iid])  # EC2: not while it is stopping
    assert e.value.response["Error"]["Code"] == "IncorrectInstanceState"
    # Terminated while stopping: the reconciler's settle comes too late and changes nothing.
    ec2.terminate_instances(InstanceIds=[iid])
    assert moto_compat.settle(iid, "stopping", "stopped") is False
    assert state(ec2, iid) == "terminated"
    for call in (ec2.stop_instances, ec2.start_instances):
        with pytest.raises(ClientError) as e:
            call(InstanceIds=[iid])
        assert e.value.response["Error"]["Code"] == "IncorrectInstanceState"


def test_without_transitions_moto_stops_and_starts_at_once(ec2, launch):
    # An in-process moto with no reconciler (the playbook tests): nobody would settle them.
    iid = launch()["InstanceId"]
    ec2.stop_instances(InstanceIds=[iid])
    assert state(ec2, iid) == "stopped"
    ec2.start_instances(InstanceIds=[iid])
    assert state(ec2, iid) == "running"


def test_settle_of_an_unknown_instance_is_false():
    assert moto_compat.settle("i-00000000000000000", "stopping", "stopped") is False


def test_a_launch_a_stop_a_start_and_a_terminate_each_wake_the_reconciler(ec2, launch, transitions):
    moto_compat.wait_for_change(0)                        # whatever an earlier test left
    assert moto_compat.wait_for_change(0.01) is False     # nothing asked: the daemon waits its tick out
    iid = launch()["InstanceId"]
    assert moto_compat.wait_for_change(0) is True         # RunInstances
    ec2.describe_instances(InstanceIds=[iid])
    assert moto_compat.wait_for_change(0.01) is False     # a read changes nothing
    ec2.stop_instances(InstanceIds=[iid])
    assert moto_compat.wait_for_change(0) is True
    moto_compat.settle(iid, "stopping", "stopped")
    ec2.start_instances(InstanceIds=[iid])
    assert moto_compat.wait_for_change(0) is True
    ec2.terminate_instances(InstanceIds=[iid])
    assert moto_compat.wait_for_change(0) is True
