#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_vcpu
short_description: Check that the EC2 vCPU quotas cover the instances a run launches
version_added: "0.1.0"
description:
  - Reads the vCPUs of each instance type (C(DescribeInstanceTypes)), the region's pending and running
    instances (C(DescribeInstances)) and the vCPU quota of each instance class and market
    (Service Quotas C(GetServiceQuota), service code C(ec2)), and fails, saying what to change, when
    the vCPUs requested plus those running exceed a quota.
  - Checked classes - Standard (A, C, D, H, I, M, R, T, Z), G and VT, P; on-demand and spot. Other
    classes, and a quota that cannot be read (no C(servicequotas:GetServiceQuota) permission), are
    reported in RV(unchecked) and do not fail.
  - Read-only; used by C(playbooks/preflight.yml) before anything is created.
author:
  - dynatrain maintainers (@dynatrain)
options:
  requests:
    description: The instances this run may launch.
    type: list
    elements: dict
    required: true
    suboptions:
      instance_type:
        description: The instance type.
        type: str
        required: true
      count:
        description: How many.
        type: int
        required: true
      market:
        description: The market they launch in.
        type: str
        choices: [on-demand, spot]
        default: on-demand
      setting:
        description: The setting that chose the type, named in the message.
        type: str
        default: instance type
      pool:
        description:
          - The request is the cluster's warm pool at its full size (O(cluster) required). Its workers
            that exist already (stopped ones need no vCPUs, running ones are counted here) are
            subtracted from O(requests[].count) and are not counted as running.
        type: bool
        default: false
  cluster:
    description:
      - The cluster's name (tag C(dynatrain:cluster)). Its master and base workers already running
        are not counted again when O(requests) is the cluster's whole base size (bootstrap).
    type: str
    default: ""
  identity:
    description:
      - Read the caller's identity (STS C(GetCallerIdentity)) first and return its account in RV(account) and
        its ARN in RV(arn), so that a run needs no module run of its own for it (C(playbooks/preflight.yml)).
      - When it cannot be read (no usable credentials), nothing else is checked and the module returns
        RV(identity_error) without failing; the caller says what to set.
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
- name: Check the vCPU quotas of a bootstrap
  dynatrain.elastic.preflight_vcpu:
    region: us-west-2
    cluster: prod
    requests:
      - {instance_type: c5.xlarge, count: 1, setting: dt_master_instance_type}
      - {instance_type: g4dn.xlarge, count: 4, market: spot, setting: dt_worker_instance_type}
"""

RETURN = r"""
checked:
  description: For each quota checked, its code, value, and the vCPUs requested and running.
  returned: success
  type: list
  elements: dict
  sample: [{"code": "L-1216C47A", "quota": 32.0, "requested": 8, "running": 4}]
unchecked:
  description: Why a request's quota was not checked (its class, or the quota could not be read).
  returned: success
  type: list
  elements: str
account:
  description: The caller's AWS account, or null when it could not be read.
  returned: when O(identity=true)
  type: str
  sample: "123456789012"
arn:
  description: The caller's ARN (its partition names the permissions boundary's), or null when it could not be read.
  returned: when O(identity=true)
  type: str
  sample: "arn:aws:iam::123456789012:user/admin"
identity_error:
  description: Why the caller's identity could not be read (then nothing was checked), or null.
  returned: when O(identity=true)
  type: str
"""

try:
    import botocore
except ImportError:
    pass  # handled by AnsibleAWSModule

from ansible_collections.amazon.aws.plugins.module_utils.modules import AnsibleAWSModule
from ansible_collections.amazon.aws.plugins.module_utils.retries import AWSRetry

from ansible_collections.dynatrain.elastic.plugins.module_utils import tags as cluster_tags
from ansible_collections.dynatrain.elastic.plugins.module_utils.aws_task import TaskFailed, run_module
from ansible_collections.dynatrain.elastic.plugins.module_utils.preflight import (
    VCPU_QUOTAS,
    vcpu_class,
    vcpu_needs,
    vcpu_problem,
)


def read_running(ec2, cluster):
    """(the region's pending/running instances as {'instance_type', 'market'}, how many live
    instances the cluster's warm pool has). The cluster's master, base workers and pool workers
    are left out of the first (bootstrap's requests are the cluster's whole base size and pool)."""
    running, pool = [], 0
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}])
    for reservation in pages.build_full_result().get("Reservations", []):
        for instance in reservation["Instances"]:
            tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
            ours = bool(cluster) and tags.get(cluster_tags.CLUSTER) == cluster
            if ours and tags.get(cluster_tags.GROUP) == "pool":
                pool += 1
                continue
            if instance["State"]["Name"] not in ("pending", "running"):
                continue
            if ours and (tags.get(cluster_tags.ROLE) == "master" or tags.get(cluster_tags.GROUP) == "base"):
                continue
            market = "spot" if instance.get("InstanceLifecycle") == "spot" else "on-demand"
            running.append({"instance_type": instance["InstanceType"], "market": market})
    return running, pool


def read_vcpus(ec2, instance_types):
    """{instance type: vCPUs}; a type EC2 does not know is left out (EC2 refuses a whole request that names one:
    the types of that request are then asked one by one)."""
    vcpus = {}
    types = sorted(set(instance_types))
    for start in range(0, len(types), 100):
        batch = types[start:start + 100]
        found = describe_vcpus(ec2, batch)
        if found is None:
            found = {}
            for one in batch:
                found.update(describe_vcpus(ec2, [one]) or {})
        vcpus.update(found)
    return vcpus


def describe_vcpus(ec2, instance_types):
    """{type: vCPUs} of instance_types, or None when EC2 refuses them for a type it does not know."""
    try:
        pages = ec2.get_paginator("describe_instance_types").paginate(InstanceTypes=instance_types)
        return {info["InstanceType"]: info["VCpuInfo"]["DefaultVCpus"]
                for info in pages.build_full_result().get("InstanceTypes", [])}
    except botocore.exceptions.ClientError as e:
        if e.response.get("Error", {}).get("Code") != "InvalidInstanceType":
            raise
        return None


def read_quota(quotas_client, code):
    """(value, '') or (None, why it could not be read)."""
    try:
        return quotas_client.get_service_quota(ServiceCode="ec2", QuotaCode=code, aws_retry=True)["Quota"]["Value"], ""
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
        return None, f"quota {code} could not be read ({e}); grant servicequotas:GetServiceQuota to check it"


ARGUMENT_SPEC = dict(
    requests=dict(type="list", elements="dict", required=True, options=dict(
        instance_type=dict(type="str", required=True),
        count=dict(type="int", required=True),
        market=dict(type="str", choices=["on-demand", "spot"], default="on-demand"),
        setting=dict(type="str", default="instance type"),
        pool=dict(type="bool", default=False),
    )),
    cluster=dict(type="str", default=""),
    identity=dict(type="bool", default=False),
)


def run(api, params, _check_mode):
    """The module's work (module_utils/aws_task.py): api is the module or its action plugin. Read-only."""
    found = {}
    if params["identity"]:
        try:
            sts = api.client("sts", retry_decorator=AWSRetry.jittered_backoff())
            caller = sts.get_caller_identity(aws_retry=True)
            found = dict(account=caller["Account"], arn=caller["Arn"], identity_error=None)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            return dict(changed=False, checked=[], unchecked=[], account=None, arn=None,
                        identity_error=f"Failed to retrieve caller identity: {e}")
    ec2 = api.client("ec2", retry_decorator=AWSRetry.jittered_backoff())
    try:
        running, pool = read_running(ec2, params["cluster"])
        # the pool's workers that exist are not launched again
        requests = [r for r in (dict(r, count=max(r["count"] - pool, 0)) if r["pool"] else r
                                for r in params["requests"]) if r["count"] > 0]
        vcpus = read_vcpus(ec2, [r["instance_type"] for r in requests] + [i["instance_type"] for i in running])
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
        raise TaskFailed("Could not read the instances / instance types", exception=e) from e
    # A type EC2 does not know: not checked here. preflight's zone check, which follows, says that no
    # zone offers it (add_workers launches the type of the cluster's launch template).
    unknown = sorted({r["instance_type"] for r in requests} - set(vcpus))
    requests = [r for r in requests if r["instance_type"] in vcpus]
    unchecked = [f"{t}: EC2 knows no such instance type in {api.region}" for t in unknown]
    unchecked += [f"{r['instance_type']}: its class has no vCPU quota checked here"
                  for r in requests if vcpu_class(r["instance_type"]) is None]
    quotas_client = api.client("service-quotas", retry_decorator=AWSRetry.jittered_backoff())
    checked, problems = [], []
    for (klass, market), need in sorted(vcpu_needs(requests, vcpus, running).items()):
        code = VCPU_QUOTAS[klass][market]
        quota, why = read_quota(quotas_client, code)
        if quota is None:
            unchecked.append(why)
            continue
        checked.append(dict(code=code, quota=quota, requested=need["requested"], running=need["running"]))
        problem = vcpu_problem(klass, market, need, quota, api.region or "")
        if problem:
            problems.append(problem)
    if problems:
        raise TaskFailed(" ".join(problems) + " Nothing was created.", checked=checked, unchecked=unchecked, **found)
    return dict(changed=False, checked=checked, unchecked=unchecked, **found)


def main():
    run_module(AnsibleAWSModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True), run)


if __name__ == "__main__":
    main()
