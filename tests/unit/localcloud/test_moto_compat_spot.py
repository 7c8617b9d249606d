"""moto_compat's spot market: a launch template's InstanceMarketOptions make a
spot instance (as on EC2), and a spot capacity cap fails RunInstances with
EC2's error (InsufficientInstanceCapacity, HTTP 500)."""


import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from localcloud import moto_compat


@pytest.fixture(scope="module")
def endpoint(moto_endpoint):
    moto_compat.apply()
    return moto_endpoint


@pytest.fixture
def ec2(endpoint):
    moto_compat.set_spot_capacity(None)
    client = boto3.client(
        "ec2", region_name="us-east-1", endpoint_url=endpoint,
        aws_access_key_id="localcloud", aws_secret_access_key="localcloud",
        config=Config(retries={"total_max_attempts": 1}),
    )
    yield client
    moto_compat.set_spot_capacity(None)


def _ami(ec2):
    return ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]


@pytest.fixture
def templates(ec2, request):
    name = "t%d" % abs(hash(request.node.name))
    data = {"ImageId": _ami(ec2), "InstanceType": "t3.micro"}
    ec2.create_launch_template(LaunchTemplateName=name + "-od", LaunchTemplateData=data)
    ec2.create_launch_template(
        LaunchTemplateName=name + "-spot",
        LaunchTemplateData=dict(data, InstanceMarketOptions={
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
        }),
    )
    yield name
    ids = [i["InstanceId"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]
    if ids:
        ec2.terminate_instances(InstanceIds=ids)


def _launch(ec2, template):
    return ec2.run_instances(MinCount=1, MaxCount=1, LaunchTemplate={"LaunchTemplateName": template})["Instances"][0]


def _lifecycle(ec2, iid):
    inst = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
    return inst.get("InstanceLifecycle", "on-demand")


def test_spot_template_launches_a_spot_instance(ec2, templates):
    assert _lifecycle(ec2, _launch(ec2, templates + "-spot")["InstanceId"]) == "spot"
    assert _lifecycle(ec2, _launch(ec2, templates + "-od")["InstanceId"]) == "on-demand"


def test_request_market_options_still_work(ec2, templates):
    iid = ec2.run_instances(
        MinCount=1, MaxCount=1, LaunchTemplate={"LaunchTemplateName": templates + "-od"},
        InstanceMarketOptions={"MarketType": "spot"},
    )["Instances"][0]["InstanceId"]
    assert _lifecycle(ec2, iid) == "spot"


def test_spot_capacity_zero_fails_like_ec2(ec2, templates):
    moto_compat.set_spot_capacity(0)
    with pytest.raises(ClientError) as err:
        _launch(ec2, templates + "-spot")
    e = err.value.response
    assert e["Error"]["Code"] == "InsufficientInstanceCapacity"
    assert e["Error"]["Message"] == "There is no Spot capacity available that matches your request."
    assert e["ResponseMetadata"]["HTTPStatusCode"] == 500
    # No instance was started, and on-demand capacity is not affected.
    live = ec2.describe_instances(Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
    assert [i for r in live["Reservations"] for i in r["Instances"] if i.get("InstanceLifecycle") == "spot"] == []
    assert _lifecycle(ec2, _launch(ec2, templates + "-od")["InstanceId"]) == "on-demand"


def test_spot_capacity_counts_running_spot_instances(ec2, templates):
    moto_compat.set_spot_capacity(1)
    first = _launch(ec2, templates + "-spot")["InstanceId"]
    with pytest.raises(ClientError, match="InsufficientInstanceCapacity"):
        _launch(ec2, templates + "-spot")
    ec2.terminate_instances(InstanceIds=[first])  # capacity comes back
    assert _lifecycle(ec2, _launch(ec2, templates + "-spot")["InstanceId"]) == "spot"
    moto_compat.set_spot_capacity("unlimited")
    assert _lifecycle(ec2, _launch(ec2, templates + "-spot")["InstanceId"]) == "spot"


@pytest.mark.parametrize("value,expected", [(None, None), ("", None), ("unlimited", None), ("0", 0), (3, 3)])
def test_parse_spot_capacity(value, expected):
    assert moto_compat.parse_spot_capacity(value) == expected


@pytest.mark.parametrize("value", ["-1", "two", "1.5"])
def test_parse_spot_capacity_refuses(value):
    with pytest.raises(ValueError, match="whole number"):
        moto_compat.parse_spot_capacity(value)


def test_env_sets_the_capacity_at_start():
    assert moto_compat.spot_capacity_from_env({moto_compat.SPOT_CAPACITY_ENV: "2"}) == 2
    assert moto_compat.spot_capacity_from_env({}) is None


def test_spot_capacity_command_reaches_the_daemon(control, capsys):
    assert control.main(["spot-capacity", "0"]) == 0
    assert moto_compat.spot_capacity() == 0
    assert "spot capacity 0 instance(s)" in capsys.readouterr().out
    assert control.main(["spot-capacity"]) == 0
    assert "spot capacity 0 " in capsys.readouterr().out
    assert control.main(["spot-capacity", "unlimited"]) == 0
    assert moto_compat.spot_capacity() is None
    assert "spot capacity unlimited" in capsys.readouterr().out


def test_spot_capacity_command_refuses_bad_values(control, capsys):
    moto_compat.set_spot_capacity(2)
    assert control.main(["spot-capacity", "-1"]) == 1
    assert "whole number" in capsys.readouterr().err
    assert moto_compat.spot_capacity() == 2
    code, body = control._control("/spot-capacity", {"capacity": "lots"})
    assert code == 400 and "whole number" in body["error"]
    assert moto_compat.spot_capacity() == 2
