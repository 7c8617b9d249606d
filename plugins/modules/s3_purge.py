#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: s3_purge
short_description: Delete every version of the objects under an S3 prefix, and the bucket once it is empty
version_added: "0.1.0"
description:
  - Lists every object version and delete marker under O(prefix) in O(bucket) (C(ListObjectVersions)) and deletes
    them, 1000 per C(DeleteObjects) call. In a versioned bucket a plain delete only hides an object behind a
    delete marker; this removes the data itself (the checkpoint bucket is versioned).
  - Nothing outside O(prefix) is touched. With O(delete_bucket=true) the bucket is deleted when nothing is left in
    it, not a version of any key (another cluster's checkpoints keep it).
  - A bucket that does not exist is no error (nothing to do).
author:
  - dynatrain maintainers (@dynatrain)
options:
  bucket:
    description: The bucket.
    type: str
    required: true
  prefix:
    description: The key prefix whose versions are deleted; it must end with C(/) (a whole "directory", never a
      partial name, never the whole bucket).
    type: str
    required: true
  delete_bucket:
    description: Also delete the bucket when nothing is left in it.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - amazon.aws.common.modules
  - amazon.aws.region.modules
  - amazon.aws.boto3
"""

EXAMPLES = r"""
- name: Delete the cluster's checkpoints, every version, and the bucket once empty
  dynatrain.elastic.s3_purge:
    bucket: dynatrain-checkpoints-123456789012
    prefix: prod/
    delete_bucket: true
"""

RETURN = r"""
deleted:
  description: How many object versions and delete markers were deleted (or would be, in check mode).
  returned: always
  type: int
  sample: 42
keys:
  description: The keys under O(prefix) that had versions, sorted.
  returned: always
  type: list
  elements: str
  sample: ["prod/job/LATEST.json"]
bucket_deleted:
  description: Whether the bucket was deleted (or would be, in check mode).
  returned: always
  type: bool
bucket_left:
  description: Whether the bucket is kept because something outside O(prefix) is still in it.
  returned: always
  type: bool
"""

try:
    import botocore
except ImportError:
    pass  # handled by AnsibleAWSModule

from ansible_collections.amazon.aws.plugins.module_utils.botocore import is_boto3_error_code
from ansible_collections.amazon.aws.plugins.module_utils.modules import AnsibleAWSModule
from ansible_collections.amazon.aws.plugins.module_utils.retries import AWSRetry

from ansible_collections.dynatrain.elastic.plugins.module_utils.aws_task import TaskFailed, run_module

BATCH = 1000  # DeleteObjects takes at most 1000 keys


def versions(client, bucket, prefix):
    """[(key, version id)] of every version and delete marker under prefix."""
    found = []
    paginator = client.get_paginator("list_object_versions")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Versions", []) + page.get("DeleteMarkers", []):
            found.append((item["Key"], item["VersionId"]))
    return found


def anything_left(client, bucket, outside=None):
    """Whether the bucket holds a version or delete marker (outside that prefix: check mode, nothing deleted)."""
    if outside is None:
        page = client.list_object_versions(Bucket=bucket, MaxKeys=1, aws_retry=True)
        return bool(page.get("Versions") or page.get("DeleteMarkers"))
    for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket):
        for item in page.get("Versions", []) + page.get("DeleteMarkers", []):
            if not item["Key"].startswith(outside):
                return True
    return False


def delete(client, bucket, found):
    errors = []
    for start in range(0, len(found), BATCH):
        objects = [{"Key": key, "VersionId": version} for key, version in found[start:start + BATCH]]
        answer = client.delete_objects(Bucket=bucket, Delete={"Objects": objects, "Quiet": True}, aws_retry=True)
        errors += answer.get("Errors", [])
    return errors


ARGUMENT_SPEC = dict(
    bucket=dict(type="str", required=True),
    prefix=dict(type="str", required=True),
    delete_bucket=dict(type="bool", default=False),
)


def run(api, params, check_mode):
    """The module's work (module_utils/aws_task.py): api is the module or its action plugin."""
    bucket, prefix = params["bucket"], params["prefix"]
    if not prefix.endswith("/") or prefix.strip("/") == "":
        raise TaskFailed("prefix=%r must name a directory ending with '/', not the whole bucket" % prefix)
    client = api.client("s3", retry_decorator=AWSRetry.jittered_backoff())
    result = dict(changed=False, deleted=0, keys=[], bucket_deleted=False, bucket_left=False)
    try:
        found = versions(client, bucket, prefix)
    except is_boto3_error_code("NoSuchBucket"):
        return result
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:  # pylint: disable=duplicate-except
        raise TaskFailed("Could not list the versions under s3://%s/%s" % (bucket, prefix), exception=e) from e
    result.update(changed=bool(found), deleted=len(found), keys=sorted({key for key, _version in found}))
    if found and not check_mode:
        try:
            errors = delete(client, bucket, found)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            raise TaskFailed("Could not delete the versions under s3://%s/%s" % (bucket, prefix), exception=e) from e
        if errors:
            raise TaskFailed("Could not delete %d of the %d versions under s3://%s/%s, e.g. %s: %s"
                             % (len(errors), len(found), bucket, prefix, errors[0].get("Key"),
                                errors[0].get("Message") or errors[0].get("Code")), **result)
    if not params["delete_bucket"]:
        return result
    try:
        left = anything_left(client, bucket, prefix if check_mode else None)
        if not left and not check_mode:
            client.delete_bucket(Bucket=bucket, aws_retry=True)
    except is_boto3_error_code("BucketNotEmpty"):  # written to since we looked: it stays
        left = True
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:  # pylint: disable=duplicate-except
        raise TaskFailed("Could not delete the bucket %s" % bucket, exception=e, **result) from e
    result.update(bucket_left=left, bucket_deleted=not left, changed=result["changed"] or not left)
    return result


def main():
    run_module(AnsibleAWSModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True), run)


if __name__ == "__main__":
    main()
