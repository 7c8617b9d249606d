#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: ec2_launch
short_description: Launch instances from a launch template and wait until they run, in one module run
version_added: "0.1.0"
description:
  - "One C(RunInstances) of O(count) instances from the launch template O(launch_template) (C(MinCount) =
    C(MaxCount) = O(count): EC2 gives all of them or none), tagged by the same call (the instance and its volumes,
    as M(amazon.aws.ec2_instance) tags them), with IMDSv2 required; then, with O(wait), a look every O(poll)
    seconds until every one of them runs, or O(wait_timeout) has passed."
  - What the fleet role's launch did in two AWS module runs, M(amazon.aws.ec2_instance) and
    M(amazon.aws.ec2_instance_info) waiting, each about a second of the controller's time on its own and the
    second looking every 2 s (issue 43).
  - "A refused request fails with EC2's error under RV(error) (C(code), C(message): e.g.
    C(InsufficientInstanceCapacity)), as amazon.aws's modules report it, and launched nothing. Instances that do
    not run within O(wait_timeout) are returned in RV(not_running), not failed: the caller decides (the fleet role
    waits on, then terminates them)."
author:
  - dynatrain maintainers (@dynatrain)
options:
  launch_template:
    description: The name of the launch template (its default version).
    type: str
    required: true
  count:
    description: How many instances to launch.
    type: int
    required: true
  tags:
    description: The tags of the instances and their volumes.
    type: dict
    default: {}
  wait:
    description: Wait until the instances run.
    type: bool
    default: true
  wait_timeout:
    description: Seconds to wait for them to run.
    type: int
    default: 120
  poll:
    description: Seconds between two looks.
    type: float
    default: 0.5
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
- name: Launch two workers from the worker launch template and wait until they run
  dynatrain.elastic.ec2_launch:
    launch_template: mycluster-worker
    count: 2
    tags:
      "dynatrain:group": elastic
      "dynatrain:launch-token": "k3j4h5g6f7d8s9a0"
  register: launched
"""

RETURN = r"""
instances:
  description:
    - The launched instances, as M(amazon.aws.ec2_instance_info) returns instances, as last seen (running, unless
      in RV(not_running) or O(wait) is false).
  returned: success
  type: list
  elements: dict
instance_ids:
  description: The ids of every instance launched.
  returned: success
  type: list
  elements: str
not_running:
  description: The launched instances that did not run within O(wait_timeout) (with O(wait)).
  returned: success
  type: list
  elements: str
error:
  description: EC2's error when the request was refused (C(code), C(message)).
  returned: failure
  type: dict
"""

import time

try:
    import botocore
except ImportError:
    pass  # handled by AnsibleAWSModule

from ansible_collections.amazon.aws.plugins.module_utils.modules import AnsibleAWSModule
from ansible_collections.amazon.aws.plugins.module_utils.retries import AWSRetry
from ansible_collections.amazon.aws.plugins.module_utils.tagging import boto3_tag_specifications

from ansible_collections.dynatrain.elastic.plugins.module_utils.aws_task import TaskFailed, run_module
from ansible_collections.dynatrain.elastic.plugins.module_utils.ec2_instances import as_info, describe


def run_spec(launch_template, count, tags):
    """The RunInstances request: all or none (MinCount = MaxCount), the tags on the instance and its volumes (as
    amazon.aws's ec2_instance sets them), IMDSv2 required with ec2_instance's other metadata defaults."""
    spec = dict(LaunchTemplate={"LaunchTemplateName": launch_template}, MinCount=count, MaxCount=count,
                MetadataOptions={"HttpEndpoint": "enabled", "HttpTokens": "required", "HttpPutResponseHopLimit": 1,
                                 "HttpProtocolIpv6": "disabled", "InstanceMetadataTags": "disabled"})
    if tags:
        spec["TagSpecifications"] = boto3_tag_specifications(tags, ["volume", "instance"])   # ec2_instance's own
    return spec


def wait_running(client, ids, timeout, poll, sleep=time.sleep, clock=time.monotonic):
    """Look every poll s until every id runs or timeout s passed: ({id: instance} as last seen, ids not running).
    An instance EC2 does not list yet (eventual consistency right after RunInstances) is still pending."""
    deadline = clock() + timeout
    found = {}
    while True:
        found.update({i["InstanceId"]: i for i in describe(client, InstanceIds=list(ids))} if ids else {})
        pending = [iid for iid in ids if found.get(iid, {}).get("State", {}).get("Name") != "running"]
        if not pending or clock() >= deadline:
            return found, pending
        sleep(poll)


ARGUMENT_SPEC = dict(
    launch_template=dict(type="str", required=True),
    count=dict(type="int", required=True),
    tags=dict(type="dict", default={}),
    wait=dict(type="bool", default=True),
    wait_timeout=dict(type="int", default=120),
    poll=dict(type="float", default=0.5),
)


def run(api, params, check_mode):
    """The module's work (module_utils/aws_task.py): api is the module or its action plugin."""
    p = params
    if p["count"] < 1:
        raise TaskFailed("count=%s: launch at least one instance." % p["count"])
    if check_mode:
        return dict(changed=True, instances=[], instance_ids=[], not_running=[])
    client = api.client("ec2", retry_decorator=AWSRetry.jittered_backoff())
    try:
        # no aws_retry: a refused request (capacity, quota) is the caller's to handle at once, not retried
        launched = client.run_instances(**run_spec(p["launch_template"], p["count"], p["tags"]))["Instances"]
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
        raise TaskFailed("Could not launch %s instance(s) from the launch template %s"
                         % (p["count"], p["launch_template"]), exception=e) from e
    ids = [i["InstanceId"] for i in launched]
    found, not_running = {i["InstanceId"]: i for i in launched}, []
    if p["wait"]:
        try:
            seen, not_running = wait_running(client, ids, p["wait_timeout"], p["poll"])
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            raise TaskFailed("Launched %s but could not look at them" % ", ".join(ids), exception=e,
                             instance_ids=ids) from e
        found.update(seen)
    return dict(changed=True, instances=[as_info(found[iid]) for iid in ids], instance_ids=ids,
                not_running=not_running)


def main():
    run_module(AnsibleAWSModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True), run)


if __name__ == "__main__":
    main()
