"""localcloud/quotas.py: Service Quotas answers EC2's vCPU quotas like AWS, at settable values."""
from __future__ import annotations

import boto3
import pytest

from localcloud import quotas


@pytest.fixture()
def sq(moto_endpoint):
    quotas.apply()  # the module's moto server runs in this process
    quotas.reset()
    yield boto3.client("service-quotas", endpoint_url=moto_endpoint, region_name="us-west-2",
                       aws_access_key_id="x", aws_secret_access_key="x")
    quotas.reset()


def test_ec2_quota_has_aws_code_name_and_a_default(sq):
    quota = sq.get_service_quota(ServiceCode="ec2", QuotaCode="L-1216C47A")["Quota"]
    assert quota["QuotaName"] == "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"
    assert quota["Value"] == quotas.DEFAULT_VCPUS
    assert quota["QuotaArn"].startswith("arn:aws:servicequotas:us-west-2:") and quota["QuotaArn"].endswith(":ec2/L-1216C47A")


def test_a_set_value_is_served_and_unknown_codes_are_refused(sq):
    assert quotas.handle_post({"service": "ec2", "code": "L-DB2E81BA", "value": 8})[0] == 200
    assert sq.get_service_quota(ServiceCode="ec2", QuotaCode="L-DB2E81BA")["Quota"]["Value"] == 8
    status, reply = quotas.handle_post({"service": "ec2", "code": "L-00000000", "value": 8})
    assert status == 400 and "no quota ec2/L-00000000" in reply["error"]
    assert quotas.handle_post({"service": "ec2", "code": "L-DB2E81BA", "value": -1})[0] == 400
    with pytest.raises(sq.exceptions.NoSuchResourceException):
        sq.get_service_quota(ServiceCode="ec2", QuotaCode="L-00000000")


def test_other_services_keep_motos_answers(sq):
    assert sq.get_service_quota(ServiceCode="vpc", QuotaCode="L-F678F1CE")["Quota"]["QuotaCode"] == "L-F678F1CE"
    codes = {q["QuotaCode"] for q in sq.list_aws_default_service_quotas(ServiceCode="ec2")["Quotas"]}
    assert codes == set(quotas.EC2_QUOTAS)
