#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: ec2_status_checks
short_description: Read the EC2 status checks of instances (is the machine itself answering?)
version_added: "0.1.0"
description:
  - Reads the instance and system status checks of O(instance_ids) with one C(DescribeInstanceStatus) call
    (M(amazon.aws.ec2_instance_info) does not return them).
  - EC2 runs the checks every minute, from inside AWS; an instance whose machine or operating system stopped
    answering fails them (C(impaired)), whatever the path from the controller to it. A node that does not
    answer SSH from the controller but passes them is alive, and the controller's network path (the admin
    CIDR, a VPN) is the likelier fault, so C(bootstrap.yml) replaces a silent master only when its checks fail.
  - Changes nothing.
author:
  - dynatrain maintainers (@dynatrain)
options:
  instance_ids:
    description: The instances.
    type: list
    elements: str
    required: true
  wait_impaired:
    description:
      - Seconds to keep reading (every 10 s) until every instance is C(impaired); the last reading is returned
        either way. EC2 needs a few minutes to find a machine that just died. V(0) reads once.
    type: int
    default: 0
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
- name: Read the master's status checks, for up to 2 minutes until they fail
  dynatrain.elastic.ec2_status_checks:
    instance_ids: [i-0123456789abcdef0]
    wait_impaired: 120
  register: checks

- name: Say whether its machine is lost
  ansible.builtin.debug:
    msg: "{{ 'lost' if checks.impaired else 'alive' }}"
"""

RETURN = r"""
instances:
  description: One entry per instance EC2 knows, in the order of O(instance_ids).
  returned: success
  type: list
  elements: dict
  contains:
    instance_id:
      description: The instance.
      type: str
    state:
      description: Its state (C(running), C(stopped), ...).
      type: str
    instance_status:
      description: The instance status check (C(ok), C(impaired), C(initializing), C(insufficient-data), C(not-applicable)).
      type: str
    system_status:
      description: The system (AWS hardware) status check, same values.
      type: str
    impaired:
      description: Either check is C(impaired).
      type: bool
  sample: [{"instance_id": "i-0123456789abcdef0", "state": "running", "instance_status": "impaired",
            "system_status": "ok", "impaired": true}]
impaired:
  description: The instances whose instance or system status check is C(impaired).
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


def summarize(statuses, order):
    """The module's instances, in ``order``, from DescribeInstanceStatus' InstanceStatuses. Pure."""
    found = {}
    for item in statuses:
        checks = {k: (item.get(k) or {}).get("Status", "not-applicable") for k in ("InstanceStatus", "SystemStatus")}
        found[item["InstanceId"]] = {
            "instance_id": item["InstanceId"],
            "state": (item.get("InstanceState") or {}).get("Name"),
            "instance_status": checks["InstanceStatus"],
            "system_status": checks["SystemStatus"],
            "impaired": "impaired" in checks.values(),
        }
    return [found[i] for i in order if i in found]


POLL_S = 10


def read(client, ids):
    pages = client.get_paginator("describe_instance_status").paginate(InstanceIds=ids, IncludeAllInstances=True)
    return summarize(pages.build_full_result().get("InstanceStatuses", []), ids)


ARGUMENT_SPEC = dict(
    instance_ids=dict(type="list", elements="str", required=True),
    wait_impaired=dict(type="int", default=0),
)


def run(api, params, _check_mode):
    """The module's work (module_utils/aws_task.py): api is the module or its action plugin. Read-only."""
    ids = list(dict.fromkeys(params["instance_ids"]))
    if not ids:
        return dict(changed=False, instances=[], impaired=[])
    client = api.client("ec2", retry_decorator=AWSRetry.jittered_backoff())
    deadline = time.monotonic() + max(0, params["wait_impaired"])
    try:
        instances = read(client, ids)
        while not all(i["impaired"] for i in instances) and time.monotonic() < deadline:
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
            instances = read(client, ids)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
        raise TaskFailed("Could not read the status checks of %s" % ", ".join(ids), exception=e) from e
    return dict(changed=False, instances=instances, impaired=[i["instance_id"] for i in instances if i["impaired"]])


def main():
    run_module(AnsibleAWSModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True), run)


if __name__ == "__main__":
    main()
