"""localcloud/moto_compat.py: every instance launched from a template gets the template's
instance profile, as on EC2 (moto only associates a profile named in the request, and only
to the first instance), so the local IMDS serves the master's credentials."""
from __future__ import annotations

import boto3
import pytest
from botocore.config import Config

from localcloud import moto_compat


@pytest.fixture(scope="module")
def clients(moto_endpoint):
    moto_compat.apply()
    kw = dict(region_name="us-east-1", endpoint_url=moto_endpoint, aws_access_key_id="localcloud",
              aws_secret_access_key="localcloud", config=Config(retries={"total_max_attempts": 1}))
    return boto3.client("ec2", **kw), boto3.client("iam", **kw)


def test_every_instance_of_a_template_gets_its_profile(clients):
    ec2, iam = clients
    iam.create_role(RoleName="dt-profile-test", AssumeRolePolicyDocument="{}")
    arn = iam.create_instance_profile(InstanceProfileName="dt-profile-test")["InstanceProfile"]["Arn"]
    iam.add_role_to_instance_profile(InstanceProfileName="dt-profile-test", RoleName="dt-profile-test")
    vpc = ec2.create_vpc(CidrBlock="127.92.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="127.92.1.0/24")["Subnet"]["SubnetId"]
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ec2.create_launch_template(LaunchTemplateName="dt-with-profile", LaunchTemplateData={
        "ImageId": ami, "IamInstanceProfile": {"Name": "dt-profile-test"},
        "NetworkInterfaces": [{"DeviceIndex": 0, "SubnetId": subnet}]})
    ec2.create_launch_template(LaunchTemplateName="dt-without-profile", LaunchTemplateData={
        "ImageId": ami, "NetworkInterfaces": [{"DeviceIndex": 0, "SubnetId": subnet}]})
    launched = []
    for name, extra in (("dt-with-profile", {}), ("dt-with-profile", {"SubnetId": subnet}),
                        ("dt-without-profile", {})):
        ids = [i["InstanceId"] for i in ec2.run_instances(
            MinCount=2, MaxCount=2, LaunchTemplate={"LaunchTemplateName": name}, **extra)["Instances"]]
        described = [i for r in ec2.describe_instances(InstanceIds=ids)["Reservations"] for i in r["Instances"]]
        launched.append([(i.get("IamInstanceProfile") or {}).get("Arn") for i in described])
    assert launched == [[arn, arn], [arn, arn], [None, None]]
