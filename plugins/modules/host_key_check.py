#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_key_check
short_description: Check scanned SSH host keys against the fingerprints on the instances' consoles
version_added: "0.1.0"
description:
  - For each node, reads the instance's console output (C(GetConsoleOutput)), where cloud-init prints the
    fingerprints of the host keys it generated at first boot, and checks that the key read over the network
    (C(ssh-keyscan)) is one of them.
  - A key whose fingerprint the console does not list while it lists others is refused, naming the instance,
    its address and both fingerprints; nothing is pinned then.
  - A console without fingerprints (not written yet, or an AMI without cloud-init) leaves the key trusted on
    first use, unless O(require_console=true).
  - Read-only.
author:
  - dynatrain maintainers (@dynatrain)
options:
  nodes:
    description: The nodes to check.
    type: list
    elements: dict
    required: true
    suboptions:
      instance_id:
        description: The node's instance id.
        type: str
        required: true
      address:
        description: The address the key was read from (for messages).
        type: str
        default: ""
      key:
        description: The public key line read from the node, e.g. ssh-keyscan's C(<host> ssh-ed25519 AAAA...).
        type: str
        required: true
  require_console:
    description: Fail for a node whose console lists no fingerprint, instead of trusting its key on first use.
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
- name: Check the scanned host keys against the consoles
  dynatrain.elastic.host_key_check:
    region: us-west-2
    nodes:
      - instance_id: i-0123456789abcdef0
        address: 10.77.1.12
        key: "10.77.1.12 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI..."
  register: checked
"""

RETURN = r"""
sources:
  description: For each instance id, where its key's trust comes from - C(console) (the console lists its
    fingerprint) or C(first-use) (the console lists none).
  returned: success
  type: dict
  sample: {"i-0123456789abcdef0": "console"}
fingerprints:
  description: For each instance id, the SHA256 fingerprint of the key checked.
  returned: success
  type: dict
  sample: {"i-0123456789abcdef0": "SHA256:qW8iEeHKX3W0nW59VjxdhCUw0z299bqU4+KahUZnrqk"}
"""

try:
    import botocore
except ImportError:
    pass  # handled by AnsibleAWSModule

from ansible_collections.amazon.aws.plugins.module_utils.modules import AnsibleAWSModule
from ansible_collections.amazon.aws.plugins.module_utils.retries import AWSRetry

from ansible_collections.dynatrain.elastic.plugins.module_utils.aws_task import TaskFailed, run_module
from ansible_collections.dynatrain.elastic.plugins.module_utils.console_host_keys import console_fingerprints, verdict


def console_text(client, instance_id):
    # botocore decodes the base64 of GetConsoleOutput itself (handlers.decode_console_output)
    return client.get_console_output(InstanceId=instance_id, aws_retry=True).get("Output") or ""


ARGUMENT_SPEC = dict(
    nodes=dict(type="list", elements="dict", required=True, options=dict(
        instance_id=dict(type="str", required=True),
        address=dict(type="str", default=""),
        key=dict(type="str", required=True, no_log=False),
    )),
    require_console=dict(type="bool", default=False),
)


def run(api, params, _check_mode):
    """The module's work (module_utils/aws_task.py): api is the module or its action plugin. Read-only."""
    client = api.client("ec2", retry_decorator=AWSRetry.jittered_backoff())
    sources, fingerprints, problems = {}, {}, []
    for node in params["nodes"]:
        iid, addr = node["instance_id"], node["address"] or node["instance_id"]
        try:
            text = console_text(client, iid)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            raise TaskFailed("Could not read the console output of %s (%s)" % (iid, addr), exception=e) from e
        try:
            result, fp = verdict(node["key"], text)
        except ValueError as e:
            raise TaskFailed("%s (%s): %s" % (iid, addr, e)) from e
        fingerprints[iid] = fp
        if result == "console":
            sources[iid] = "console"
        elif result == "none" and not params["require_console"]:
            sources[iid] = "first-use"
        elif result == "none":
            problems.append("%s (%s): its console lists no host key fingerprint yet; wait for cloud-init to print "
                            "them, or allow first use (require_console=false)" % (iid, addr))
        else:
            problems.append("%s (%s): the host key read from the network (%s) is not one the instance printed on its "
                            "console (%s): someone may be between you and the node. Nothing was pinned; check the "
                            "network path and the instance, then run again"
                            % (iid, addr, fp, ", ".join(sorted(console_fingerprints(text)))))
    if problems:
        raise TaskFailed("Refusing to pin host keys: " + "; ".join(problems), sources=sources, fingerprints=fingerprints)
    return dict(changed=False, sources=sources, fingerprints=fingerprints)


def main():
    run_module(AnsibleAWSModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True), run)


if __name__ == "__main__":
    main()
