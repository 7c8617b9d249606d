#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: ec2_tags
short_description: Set the same tags on many EC2 resources in one CreateTags call
version_added: "0.1.0"
description:
  - Adds or overwrites O(tags) on every resource of O(resources) with one C(CreateTags) request (EC2 takes up to
    1000 resources per call), where M(amazon.aws.ec2_tag) tags one resource per task. Other tags are kept.
  - Reads the resources' tags first (C(DescribeTags)) and calls C(CreateTags) only for the resources whose tags
    differ, so a second run reports no change.
author:
  - dynatrain maintainers (@dynatrain)
options:
  resources:
    description: EC2 resource ids (instances, volumes, ...).
    type: list
    elements: str
    required: true
  tags:
    description: Tags to set.
    type: dict
    required: true
  stamp:
    description:
      - A tag key set to the current time (epoch seconds, UTC) on each resource whose O(tags) change, in the same
        call, so that a reader knows since when a status holds. Resources whose O(tags) are already set keep
        their stamp (a second run reports no change).
    type: str
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
- name: Mark the new workers ADDED
  dynatrain.elastic.ec2_tags:
    resources: [i-0123456789abcdef0, i-0fedcba9876543210]
    tags:
      elastic_worker_status: ADDED
    stamp: "dynatrain:status-time"
"""

RETURN = r"""
changed_resources:
  description: The resources whose tags were changed.
  returned: success
  type: list
  elements: str
  sample: ["i-0123456789abcdef0"]
"""

import time

try:
    import botocore
except ImportError:
    pass  # handled by AnsibleAWSModule

from ansible_collections.amazon.aws.plugins.module_utils.modules import AnsibleAWSModule
from ansible_collections.amazon.aws.plugins.module_utils.retries import AWSRetry

from ansible_collections.dynatrain.elastic.plugins.module_utils.aws_task import TaskFailed, run_module

BATCH = 1000  # CreateTags takes at most this many resources


def current_tags(client, resources):
    """{resource id: {key: value}} of the resources, read in one paginated DescribeTags."""
    found = {r: {} for r in resources}
    paginator = client.get_paginator("describe_tags")
    for i in range(0, len(resources), 200):  # a filter takes at most 200 values
        pages = paginator.paginate(Filters=[{"Name": "resource-id", "Values": resources[i:i + 200]}])
        for page in pages.build_full_result().get("Tags", []):
            found.setdefault(page["ResourceId"], {})[page["Key"]] = page.get("Value", "")
    return found


def to_change(found, tags):
    """The resources whose tags lack one of tags (or have another value). Pure."""
    return [r for r, have in found.items() if any(have.get(k) != v for k, v in tags.items())]


ARGUMENT_SPEC = dict(
    resources=dict(type="list", elements="str", required=True),
    tags=dict(type="dict", required=True),
    stamp=dict(type="str"),
)


def run(api, params, check_mode):
    """The module's work (module_utils/aws_task.py): api is the module or its action plugin."""
    resources = list(dict.fromkeys(params["resources"]))
    tags = {str(k): "" if v is None else str(v) for k, v in params["tags"].items()}
    if not resources or not tags:
        return dict(changed=False, changed_resources=[])
    client = api.client("ec2", retry_decorator=AWSRetry.jittered_backoff())
    try:
        todo = to_change(current_tags(client, resources), tags)
        stamped = dict(tags, **({params["stamp"]: str(int(time.time()))} if params["stamp"] else {}))
        if todo and not check_mode:
            for i in range(0, len(todo), BATCH):
                client.create_tags(Resources=todo[i:i + BATCH], Tags=[{"Key": k, "Value": v} for k, v in stamped.items()],
                                   aws_retry=True)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
        raise TaskFailed("Could not tag %s" % ", ".join(resources), exception=e) from e
    return dict(changed=bool(todo), changed_resources=todo)


def main():
    run_module(AnsibleAWSModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True), run)


if __name__ == "__main__":
    main()
