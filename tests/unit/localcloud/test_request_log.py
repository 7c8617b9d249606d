"""localcloud/request_log.py: the local cloud records each AWS call it serves (issue 12).

A moto server with the recording middleware on a free port; boto3 calls of the
query (EC2, STS, form body), REST (EFS) and JSON (Service Quotas) protocols each
land as one line with their IAM action; the User-Agent tells the product's calls
(Ansible's) from others.
"""
from __future__ import annotations

import socket

import boto3
import pytest
from botocore.config import Config

from localcloud import request_log


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("calls") / request_log.FILE_NAME
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = request_log.logging_server("127.0.0.1", port, str(path))
    srv.start()
    yield "http://127.0.0.1:%d" % port, path
    srv.stop()


def _client(endpoint, service, agent=None):
    return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="x",
                        aws_secret_access_key="x", config=Config(user_agent_extra=agent) if agent else None)


def _last(path, n=1):
    return request_log.read(str(path))[-n:]


def test_query_protocol_calls_are_recorded_with_their_iam_action(server):
    endpoint, path = server
    _client(endpoint, "ec2", "Ansible/2.19.0").describe_vpcs()
    (rec,) = _last(path)
    assert rec["iam_action"] == "ec2:DescribeVpcs" and rec["status"] == 200
    _client(endpoint, "sts").get_caller_identity()
    assert _last(path)[0]["iam_action"] == "sts:GetCallerIdentity"


def test_failed_calls_are_recorded_too(server):
    """AWS authorises before it looks: a call that fails still needs its permission."""
    endpoint, path = server
    with pytest.raises(Exception):
        _client(endpoint, "ec2").delete_security_group(GroupId="sg-00000000000000000")
    (rec,) = _last(path)
    assert rec["iam_action"] == "ec2:DeleteSecurityGroup" and rec["status"] >= 400


def test_rest_protocol_is_matched_against_the_service_model(server):
    endpoint, path = server
    efs = _client(endpoint, "efs")
    fs = efs.create_file_system(CreationToken="t1")["FileSystemId"]
    efs.describe_file_systems(FileSystemId=fs)
    efs.describe_mount_targets(FileSystemId=fs)
    efs.delete_file_system(FileSystemId=fs)
    assert [r["iam_action"] for r in _last(path, 4)] == [
        "elasticfilesystem:CreateFileSystem", "elasticfilesystem:DescribeFileSystems",
        "elasticfilesystem:DescribeMountTargets", "elasticfilesystem:DeleteFileSystem"]


def test_s3_calls_get_their_iam_action(server):
    """S3 REST calls: same path and method told apart by the literal query (x-id), and the
    operations whose IAM action has another name (HeadBucket and ListObjectsV2 need s3:ListBucket)."""
    endpoint, path = server
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="x",
                      aws_secret_access_key="x", config=Config(s3={"addressing_style": "path"}))
    s3.create_bucket(Bucket="dt-bucket-1")
    s3.head_bucket(Bucket="dt-bucket-1")
    s3.put_object(Bucket="dt-bucket-1", Key="k/1", Body=b"x")
    s3.list_objects_v2(Bucket="dt-bucket-1", Prefix="k/")
    with pytest.raises(s3.exceptions.ClientError):  # none set: still recorded with its action
        s3.get_bucket_encryption(Bucket="dt-bucket-1")
    s3.delete_object(Bucket="dt-bucket-1", Key="k/1")
    s3.delete_bucket(Bucket="dt-bucket-1")
    assert [r["iam_action"] for r in _last(path, 7)] == [
        "s3:CreateBucket", "s3:ListBucket", "s3:PutObject", "s3:ListBucket", "s3:GetEncryptionConfiguration",
        "s3:DeleteObject", "s3:DeleteBucket"]


def test_json_protocol_uses_the_target_header(server):
    endpoint, path = server
    try:
        _client(endpoint, "service-quotas").get_service_quota(ServiceCode="vpc", QuotaCode="L-F678F1CE")
    except Exception:  # noqa: BLE001 (what moto answers does not matter here, only the record)
        pass
    assert _last(path)[0]["iam_action"] == "servicequotas:GetServiceQuota"


def test_only_calls_marked_ansible_are_the_products(server):
    endpoint, path = server
    _client(endpoint, "ec2", "APN/1.0 Ansible/2.19.0").describe_subnets()
    _client(endpoint, "ec2", request_log.INTERNAL_MARK).describe_instances()
    _client(endpoint, "ec2").describe_regions()
    records = _last(path, 3)
    assert request_log.product_actions(records) == {"ec2:DescribeSubnets"}


def test_checkpoint_bucket_settings_calls_get_their_iam_action(server):
    """Issue 27: the bucket's versioning, TLS-only policy and lifecycle rule, and teardown's purge of every
    version (S3 names some of these actions differently from their operations)."""
    endpoint, path = server
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="x",
                      aws_secret_access_key="x", config=Config(s3={"addressing_style": "path"}))
    s3.create_bucket(Bucket="dt-bucket-2")
    s3.put_bucket_versioning(Bucket="dt-bucket-2", VersioningConfiguration={"Status": "Enabled"})
    s3.get_bucket_versioning(Bucket="dt-bucket-2")
    s3.put_bucket_policy(Bucket="dt-bucket-2", Policy='{"Version": "2012-10-17", "Statement": []}')
    s3.get_bucket_policy(Bucket="dt-bucket-2")
    with pytest.raises(s3.exceptions.ClientError):  # none set yet: still recorded with its action
        s3.get_bucket_lifecycle_configuration(Bucket="dt-bucket-2")
    s3.put_bucket_lifecycle_configuration(Bucket="dt-bucket-2", LifecycleConfiguration={"Rules": [
        {"ID": "r", "Filter": {"Prefix": ""}, "Status": "Enabled",
         "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}}]})
    version = s3.put_object(Bucket="dt-bucket-2", Key="k/1", Body=b"x")["VersionId"]
    s3.list_object_versions(Bucket="dt-bucket-2", Prefix="k/")
    s3.delete_objects(Bucket="dt-bucket-2", Delete={"Objects": [{"Key": "k/1", "VersionId": version}]})
    s3.delete_bucket_lifecycle(Bucket="dt-bucket-2")
    s3.delete_bucket_policy(Bucket="dt-bucket-2")
    s3.delete_bucket(Bucket="dt-bucket-2")
    assert [r["iam_action"] for r in _last(path, 13)] == [
        "s3:CreateBucket", "s3:PutBucketVersioning", "s3:GetBucketVersioning", "s3:PutBucketPolicy",
        "s3:GetBucketPolicy", "s3:GetLifecycleConfiguration", "s3:PutLifecycleConfiguration", "s3:PutObject",
        "s3:ListBucketVersions", "s3:DeleteObject", "s3:PutLifecycleConfiguration", "s3:DeleteBucketPolicy",
        "s3:DeleteBucket"]
