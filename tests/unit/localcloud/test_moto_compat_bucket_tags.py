"""localcloud/moto_compat.py: a deleted bucket loses its tags, as on AWS. Moto kept them, so a
bucket re-created under the same name (molecule, then the e2e) came back tagged and the product
skipped PutBucketTagging, which the IAM proof then found allowed but never called."""
from __future__ import annotations

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from localcloud import moto_compat


@pytest.fixture(scope="module")
def s3(moto_endpoint):
    moto_compat.apply()
    return boto3.client("s3", region_name="us-east-1", endpoint_url=moto_endpoint, aws_access_key_id="localcloud",
                        aws_secret_access_key="localcloud", config=Config(retries={"total_max_attempts": 1}))


def test_a_bucket_made_again_under_a_deleted_ones_name_has_no_tags(s3):
    s3.create_bucket(Bucket="dt-tags-test")
    s3.put_bucket_tagging(Bucket="dt-tags-test", Tagging={"TagSet": [{"Key": "dynatrain:purpose", "Value": "x"}]})
    assert s3.get_bucket_tagging(Bucket="dt-tags-test")["TagSet"]
    s3.delete_bucket(Bucket="dt-tags-test")
    s3.create_bucket(Bucket="dt-tags-test")
    with pytest.raises(ClientError) as err:
        s3.get_bucket_tagging(Bucket="dt-tags-test")
    assert err.value.response["Error"]["Code"] == "NoSuchTagSet"
    s3.delete_bucket(Bucket="dt-tags-test")


def test_a_bucket_that_still_holds_objects_keeps_its_tags(s3):
    s3.create_bucket(Bucket="dt-tags-full")
    s3.put_bucket_tagging(Bucket="dt-tags-full", Tagging={"TagSet": [{"Key": "k", "Value": "v"}]})
    s3.put_object(Bucket="dt-tags-full", Key="a", Body=b"1")
    with pytest.raises(ClientError):
        s3.delete_bucket(Bucket="dt-tags-full")
    assert s3.get_bucket_tagging(Bucket="dt-tags-full")["TagSet"] == [{"Key": "k", "Value": "v"}]
