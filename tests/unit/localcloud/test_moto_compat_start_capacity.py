"""moto_compat's start capacity: StartInstances of a stopped instance armed with set_no_start_capacity fails
as EC2's does when it cannot place it (InsufficientInstanceCapacity, HTTP 500) and the instance stays stopped;
other instances start, and the armed one starts once disarmed. The daemon's control endpoint and
`python -m localcloud no-start-capacity` arm and disarm it from outside."""

import pytest
from botocore.exceptions import ClientError

from localcloud import moto_compat


@pytest.fixture
def transitions():
    moto_compat.use_transitions(True)  # as the daemon runs it: stop is `stopping` until settled
    yield
    moto_compat.use_transitions(False)


@pytest.fixture
def stopped(ec2, transitions):
    """Launch stopped instances (settled as the daemon's reconciler would); disarm and terminate them after."""
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    launched = []

    def make(count):
        ids = [i["InstanceId"] for i in ec2.run_instances(ImageId=ami, MinCount=count, MaxCount=count,
                                                          InstanceType="t3.micro")["Instances"]]
        launched.extend(ids)
        for iid in ids:
            moto_compat.settle(iid, "pending", "running")
        ec2.stop_instances(InstanceIds=ids)
        for iid in ids:
            assert moto_compat.settle(iid, "stopping", "stopped") is True
        return ids

    yield make
    moto_compat.set_no_start_capacity([])
    ec2.terminate_instances(InstanceIds=launched)


def state(ec2, iid):
    return ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["State"]["Name"]


def test_armed_start_fails_like_ec2_until_disarmed(ec2, stopped):
    armed, other = stopped(2)
    assert moto_compat.set_no_start_capacity([armed]) == [armed]
    with pytest.raises(ClientError) as err:
        ec2.start_instances(InstanceIds=[armed])
    e = err.value.response
    assert e["Error"]["Code"] == "InsufficientInstanceCapacity"
    assert e["Error"]["Message"].startswith("We currently do not have sufficient t3.micro capacity in the "
                                            "Availability Zone you requested (us-east-1")
    assert e["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert state(ec2, armed) == "stopped"
    # a request with the armed one starts none of them, as EC2 refuses the call
    with pytest.raises(ClientError, match="InsufficientInstanceCapacity"):
        ec2.start_instances(InstanceIds=[other, armed])
    assert (state(ec2, other), state(ec2, armed)) == ("stopped", "stopped")
    # the others get capacity
    (starting,) = ec2.start_instances(InstanceIds=[other])["StartingInstances"]
    assert (starting["InstanceId"], starting["PreviousState"]["Name"]) == (other, "stopped")
    assert state(ec2, other) == "pending"
    # disarmed: it starts
    assert moto_compat.set_no_start_capacity([]) == []
    (starting,) = ec2.start_instances(InstanceIds=[armed])["StartingInstances"]
    assert (starting["InstanceId"], starting["PreviousState"]["Name"]) == (armed, "stopped")
    assert state(ec2, armed) == "pending"


def test_a_running_armed_instance_is_not_refused(ec2, stopped):
    """Only a stopped instance needs capacity: starting a pending/running one changes nothing, as on EC2."""
    (iid,) = stopped(1)
    ec2.start_instances(InstanceIds=[iid])
    moto_compat.set_no_start_capacity([iid])
    (starting,) = ec2.start_instances(InstanceIds=[iid])["StartingInstances"]
    assert starting["PreviousState"]["Name"] == "pending"


@pytest.mark.parametrize("value", ["i-abc", [3], ["sg-1"], None])
def test_set_refuses_what_is_not_a_list_of_instance_ids(value):
    moto_compat.set_no_start_capacity(["i-keep"])
    with pytest.raises(ValueError, match="instance ids"):
        moto_compat.set_no_start_capacity(value)
    assert moto_compat.no_start_capacity() == ["i-keep"]
    moto_compat.set_no_start_capacity([])


def test_command_arms_and_disarms_through_the_daemon(control, capsys):
    assert control.main(["no-start-capacity", "i-b", "i-a"]) == 0
    assert moto_compat.no_start_capacity() == ["i-a", "i-b"]
    assert "no start capacity for i-a, i-b" in capsys.readouterr().out
    assert control.main(["no-start-capacity"]) == 0
    assert "no start capacity for i-a, i-b" in capsys.readouterr().out
    assert control.main(["no-start-capacity", "--none"]) == 0
    assert moto_compat.no_start_capacity() == []
    assert "every start gets capacity" in capsys.readouterr().out


def test_command_refuses_bad_requests(control, capsys):
    moto_compat.set_no_start_capacity(["i-a"])
    assert control.main(["no-start-capacity", "--none", "i-b"]) == 1
    assert "not both" in capsys.readouterr().err
    code, body = control._control("/no-start-capacity", {"instance_ids": "i-b"})
    assert code == 400 and "instance ids" in body["error"]
    assert moto_compat.no_start_capacity() == ["i-a"]
