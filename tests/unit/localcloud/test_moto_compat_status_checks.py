"""moto_compat's status checks: a node the reconciler found lost (its container died) answers
DescribeInstanceStatus as a dead machine does on EC2 (InstanceStatus impaired, reachability failed,
the instance still running), so that bootstrap has a second signal before it replaces a silent
master (issue 24, defect 6); a healthy node answers ok, as moto does."""

import boto3
import pytest

from localcloud import moto_compat, reconciler
from localcloud.reconciler import Action, Reconciler


@pytest.fixture(scope="module")
def ec2(moto_endpoint):
    moto_compat.apply()
    return boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_endpoint,
                        aws_access_key_id="localcloud", aws_secret_access_key="localcloud")


def status(ec2, iid):
    (found,) = ec2.describe_instance_status(InstanceIds=[iid], IncludeAllInstances=True)["InstanceStatuses"]
    return found["InstanceState"]["Name"], found["InstanceStatus"], found["SystemStatus"]["Status"]


def test_a_lost_node_fails_its_instance_status_check_until_it_is_removed(ec2, tmp_path, monkeypatch):
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    lost, healthy = (i["InstanceId"] for i in ec2.run_instances(ImageId=ami, MinCount=2, MaxCount=2)["Instances"])
    assert status(ec2, lost)[1]["Status"] == "ok"

    monkeypatch.setenv("DT_LOCALCLOUD_HOME", str(tmp_path))
    r = Reconciler(None, None, str(tmp_path))
    r._do_lost(Action("lost", lost, "container exited"), None, {})
    state, checks, system = status(ec2, lost)
    assert (state, checks["Status"], system) == ("running", "impaired", "ok")
    assert checks["Details"][0]["Name"] == "reachability" and checks["Details"][0]["Status"] == "failed"
    assert "ImpairedSince" in checks["Details"][0]
    assert status(ec2, healthy)[1]["Status"] == "ok"

    # the container is removed (the instance was terminated): the mark goes with it
    monkeypatch.setattr(reconciler.podman, "remove", lambda name: None)
    r._do_remove(Action("remove", lost, "instance terminated"), None, {})
    assert moto_compat.impaired(lost) is None
    assert status(ec2, lost)[1]["Status"] == "ok"
    ec2.terminate_instances(InstanceIds=[lost, healthy])
