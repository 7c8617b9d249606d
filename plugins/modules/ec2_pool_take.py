#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: ec2_pool_take
short_description: Take stopped workers from a warm pool (claim, start, wait until they run) in one module run
version_added: "0.1.0"
description:
  - Claims the stopped instances O(instances) with one C(CreateTags) (this take's O(token) under O(token_tag),
    with O(tags) and the O(stamp) time), finds the ones this take holds (stopped, still its token; the last claim
    wins, so two takes at once never start the same instance), starts them with one C(StartInstances) and looks
    at them every O(poll) seconds until they run.
  - What the cluster role's pool take did in four AWS module runs (each one about a second of the controller's
    time on its own); issue 28.
  - An instance that is C(stopped) again after its start was asked for O(stopped_polls) looks in a row (a start
    that failed) is not waited for. It is returned in RV(not_started) and keeps its claim (C(ADD_QUEUED) with the
    token), which the reconcile playbook ends after its queued timeout. One that does not run within
    O(wait_timeout) seconds is returned the same way.
author:
  - dynatrain maintainers (@dynatrain)
options:
  instances:
    description: The stopped instances to take, in the order of preference.
    type: list
    elements: str
    required: true
  token_tag:
    description: The tag key of the take's token.
    type: str
    required: true
  token:
    description: This take's token (a random string).
    type: str
    required: true
  tags:
    description: The other tags of the claim (e.g. the group and the status).
    type: dict
    default: {}
  stamp:
    description: A tag key set to the claim's time (epoch seconds, UTC).
    type: str
  wait_timeout:
    description: Seconds to wait for the started instances to run.
    type: int
    default: 150
  poll:
    description: Seconds between two looks.
    type: float
    default: 1.0
  stopped_polls:
    description: Looks in a row that find a started instance stopped before it is given up.
    type: int
    default: 5
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
- name: Take two workers from the warm pool
  dynatrain.elastic.ec2_pool_take:
    instances: [i-0123456789abcdef0, i-0fedcba9876543210]
    token_tag: "dynatrain:launch-token"
    token: "k3j4h5g6f7d8s9a0"
    tags:
      "dynatrain:group": elastic
      elastic_worker_status: ADD_QUEUED
    stamp: "dynatrain:status-time"
  register: taken
"""

RETURN = r"""
instances:
  description: The taken instances that run, as M(amazon.aws.ec2_instance_info) returns instances.
  returned: success
  type: list
  elements: dict
not_started:
  description: Instances this take holds that did not come to run (a start that failed, or the timeout).
  returned: success
  type: list
  elements: str
"""

import time

try:
    import botocore
except ImportError:
    pass  # handled by AnsibleAWSModule

from ansible.module_utils.common.dict_transformations import camel_dict_to_snake_dict

from ansible_collections.amazon.aws.plugins.module_utils.modules import AnsibleAWSModule
from ansible_collections.amazon.aws.plugins.module_utils.retries import AWSRetry
from ansible_collections.amazon.aws.plugins.module_utils.tagging import boto3_tag_list_to_ansible_dict


def describe(client, **kwargs):
    """The instances of a DescribeInstances call (all pages)."""
    pages = client.get_paginator("describe_instances").paginate(**kwargs).build_full_result()
    return [i for r in pages.get("Reservations", []) for i in r.get("Instances", [])]


def as_info(instance):
    """An instance as ec2_instance_info returns it (snake_case keys, tags as a dict)."""
    snaked = camel_dict_to_snake_dict(instance)
    snaked["tags"] = boto3_tag_list_to_ansible_dict(snaked.get("tags", []), "key", "value")
    return snaked


def settle(states, stopped_seen, stopped_polls):
    """(running, pending, given_up) ids from one look at {id: state} (stopped_seen counts the looks in a row
    that found each id stopped, updated here). Pure but for stopped_seen."""
    running, pending, given_up = [], [], []
    for iid, state in states.items():
        stopped_seen[iid] = stopped_seen.get(iid, 0) + 1 if state in ("stopped", "stopping") else 0
        if state == "running":
            running.append(iid)
        elif state in ("terminated", "shutting-down") or stopped_seen[iid] >= stopped_polls:
            given_up.append(iid)
        else:
            pending.append(iid)
    return running, pending, given_up


def main():
    module = AnsibleAWSModule(
        argument_spec=dict(
            instances=dict(type="list", elements="str", required=True),
            token_tag=dict(type="str", required=True, no_log=False),
            token=dict(type="str", required=True, no_log=False),
            tags=dict(type="dict", default={}),
            stamp=dict(type="str"),
            wait_timeout=dict(type="int", default=150),
            poll=dict(type="float", default=1.0),
            stopped_polls=dict(type="int", default=5),
        ),
        supports_check_mode=True,
    )
    p = module.params
    picks = list(dict.fromkeys(p["instances"]))
    if not picks:
        module.exit_json(changed=False, instances=[], not_started=[])
    if module.check_mode:
        module.exit_json(changed=True, instances=[], not_started=[])
    tags = dict({str(k): "" if v is None else str(v) for k, v in p["tags"].items()}, **{p["token_tag"]: p["token"]})
    if p["stamp"]:
        tags[p["stamp"]] = str(int(time.time()))
    client = module.client("ec2", retry_decorator=AWSRetry.jittered_backoff())
    try:
        client.create_tags(Resources=picks, Tags=[{"Key": k, "Value": v} for k, v in tags.items()], aws_retry=True)
        held = [i["InstanceId"] for i in describe(client, Filters=[
            {"Name": "tag:" + p["token_tag"], "Values": [p["token"]]},
            {"Name": "instance-state-name", "Values": ["stopped"]}])]
        if not held:
            module.exit_json(changed=True, instances=[], not_started=[])
        client.start_instances(InstanceIds=held, aws_retry=True)
        deadline = time.monotonic() + p["wait_timeout"]
        stopped_seen, running, given_up = {}, [], []
        while True:
            found = {i["InstanceId"]: i for i in describe(client, InstanceIds=held)}
            running, pending, given_up = settle({iid: found[iid]["State"]["Name"] for iid in found},
                                                stopped_seen, p["stopped_polls"])
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(p["poll"])
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
        module.fail_json_aws(e, msg="Could not take %s from the warm pool" % ", ".join(picks))
    module.exit_json(changed=True, instances=[as_info(found[iid]) for iid in held if iid in running],
                     not_started=[iid for iid in held if iid not in running])


if __name__ == "__main__":
    main()
