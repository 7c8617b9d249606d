"""localcloud/moto_compat.py: a bucket policy's conditional Deny applies only when its condition holds
(issue 27). The checkpoint bucket denies every request without TLS (aws:SecureTransport false); moto
ignored the condition and refused every object call, the master's checkpoint copy included. The local
cloud's loopback endpoint stands for S3's HTTPS one: its requests count as TLS, unless
set_secure_transport(False) makes them plain ones, which the policy then refuses."""
from __future__ import annotations

import json

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from localcloud import moto_compat

BUCKET = "dt-tls-only"
DENY_WITHOUT_TLS = {"Version": "2012-10-17", "Statement": [{
    "Sid": "DenyRequestsWithoutTLS", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
    "Resource": ["arn:aws:s3:::" + BUCKET, "arn:aws:s3:::%s/*" % BUCKET],
    "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]}


@pytest.fixture(scope="module")
def s3(moto_endpoint):
    moto_compat.apply()
    client = boto3.client("s3", region_name="us-east-1", endpoint_url=moto_endpoint, aws_access_key_id="localcloud",
                          aws_secret_access_key="localcloud", config=Config(retries={"total_max_attempts": 1},
                                                                            s3={"addressing_style": "path"}))
    client.create_bucket(Bucket=BUCKET)
    client.put_bucket_policy(Bucket=BUCKET, Policy=json.dumps(DENY_WITHOUT_TLS))
    yield client
    moto_compat.set_secure_transport(True)


def test_requests_of_the_local_cloud_count_as_tls(s3):
    s3.put_object(Bucket=BUCKET, Key="ckpt/a", Body=b"1")
    assert s3.get_object(Bucket=BUCKET, Key="ckpt/a")["Body"].read() == b"1"
    s3.delete_object(Bucket=BUCKET, Key="ckpt/a")


def test_plain_requests_are_refused_by_the_policy(s3):
    moto_compat.set_secure_transport(False)
    try:
        for call in (lambda: s3.put_object(Bucket=BUCKET, Key="ckpt/b", Body=b"1"),
                     lambda: s3.get_object(Bucket=BUCKET, Key="ckpt/a")):
            with pytest.raises(ClientError) as err:
                call()
            assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    finally:
        moto_compat.set_secure_transport(True)


def test_an_unconditional_deny_still_denies(s3):
    s3.put_bucket_policy(Bucket=BUCKET, Policy=json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Deny", "Principal": "*", "Action": "s3:PutObject", "Resource": "arn:aws:s3:::%s/*" % BUCKET}]}))
    try:
        with pytest.raises(ClientError):
            s3.put_object(Bucket=BUCKET, Key="ckpt/c", Body=b"1")
    finally:
        s3.put_bucket_policy(Bucket=BUCKET, Policy=json.dumps(DENY_WITHOUT_TLS))
