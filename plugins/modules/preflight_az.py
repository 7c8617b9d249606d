#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_az
short_description: Choose the availability zone that offers every instance type of the cluster
version_added: "0.1.0"
description:
  - Reads the region's available zones (C(DescribeAvailabilityZones)) and where each instance type is
    offered (C(DescribeInstanceTypeOfferings) by availability zone), and returns the zone for the
    cluster's subnet - the first by name that offers every type (so a re-run picks the same), or
    O(availability_zone) when it is given and offers them all.
  - Fails, saying what to change, when a type is offered nowhere in the region, when no single zone
    offers them all, or when O(availability_zone) does not exist or lacks a type.
  - Read-only; used by C(playbooks/preflight.yml) before anything is created.
author:
  - dynatrain maintainers (@dynatrain)
options:
  instance_types:
    description: The instance types the cluster launches (master and workers).
    type: list
    elements: str
    required: true
  availability_zone:
    description:
      - A zone fixed by the user or by the cluster's existing subnet; checked, not chosen.
      - Empty lets the module choose.
    type: str
    default: ""
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
- name: Choose the subnet's availability zone
  dynatrain.elastic.preflight_az:
    region: us-west-2
    instance_types: [c5.xlarge, g4dn.xlarge]
  register: az

- name: Show it
  ansible.builtin.debug:
    msg: "{{ az.availability_zone }}"
"""

RETURN = r"""
availability_zone:
  description: The zone for the cluster's subnet.
  returned: success
  type: str
  sample: us-west-2a
zones:
  description: The region's available zones (by name).
  returned: success
  type: list
  elements: str
  sample: [us-west-2a, us-west-2b]
offerings:
  description: For each instance type asked for, the zones that offer it.
  returned: success
  type: dict
  sample: {"c5.xlarge": ["us-west-2a", "us-west-2b"]}
"""

try:
    import botocore
except ImportError:
    pass  # handled by AnsibleAWSModule

from ansible_collections.amazon.aws.plugins.module_utils.modules import AnsibleAWSModule
from ansible_collections.amazon.aws.plugins.module_utils.retries import AWSRetry

from ansible_collections.dynatrain.elastic.plugins.module_utils.aws_task import TaskFailed, run_module
from ansible_collections.dynatrain.elastic.plugins.module_utils.preflight import choose_az


def read_offerings(client, instance_types):
    """{instance type: [zones]} and the available zones of the client's region."""
    zones = client.describe_availability_zones(
        Filters=[{"Name": "state", "Values": ["available"]}, {"Name": "zone-type", "Values": ["availability-zone"]}],
        aws_retry=True,
    )["AvailabilityZones"]
    offerings = {t: [] for t in instance_types}
    paginator = client.get_paginator("describe_instance_type_offerings")
    pages = paginator.paginate(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": list(instance_types)}],
    )
    for offer in pages.build_full_result().get("InstanceTypeOfferings", []):
        offerings.setdefault(offer["InstanceType"], []).append(offer["Location"])
    return offerings, [z["ZoneName"] for z in zones]


ARGUMENT_SPEC = dict(
    instance_types=dict(type="list", elements="str", required=True),
    availability_zone=dict(type="str", default=""),
)


def run(api, params, _check_mode):
    """The module's work (module_utils/aws_task.py): api is the module or its action plugin. Read-only."""
    types = [t for t in params["instance_types"] if t]
    if not types:
        raise TaskFailed("instance_types is empty: give the cluster's instance types.")
    client = api.client("ec2", retry_decorator=AWSRetry.jittered_backoff())
    try:
        offerings, zones = read_offerings(client, types)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
        raise TaskFailed("Could not read the availability zones / instance type offerings", exception=e) from e
    region = api.region or ""
    try:
        zone = choose_az(offerings, types, zones, params["availability_zone"] or "", region)
    except ValueError as e:
        raise TaskFailed(str(e), offerings={t: sorted(z) for t, z in offerings.items()}, zones=sorted(zones)) from e
    return dict(
        changed=False,
        availability_zone=zone,
        zones=sorted(zones),
        offerings={t: sorted(z) for t, z in offerings.items()},
    )


def main():
    run_module(AnsibleAWSModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True), run)


if __name__ == "__main__":
    main()
