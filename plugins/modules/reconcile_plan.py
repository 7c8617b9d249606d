#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: reconcile_plan
short_description: Decide what brings an elastic cluster's EC2 instances, host_worker and log into agreement
version_added: "0.1.0"
description:
  - The pure decision step of the C(reconcile) playbook, which changes nothing. It compares the
    cluster's running instances (from the M(dynatrain.elastic.ec2_elastic) inventory)
    with the job's C(host_worker) and C(host_worker_log) (from M(dynatrain.elastic.job_info))
    and returns what to do with each instance.
  - C(lost) - workers the launcher logged C(FAILED) that are no longer in C(host_worker);
    tag C(FAILED), remove their data marker, terminate.
  - C(drained) - workers that left the job on their own (a spot interruption drain, last log
    event C(REMOVED)) while their tag still says C(ADDED); tag C(REMOVED), remove the marker,
    terminate.
  - C(join) - instances launched from the worker launch template outside the playbooks (DT's
    console workflow - the elastic-worker tag, no launch token, never in the job); configure,
    prepare and join them as C(add_workers) does.
  - C(remove) - elastic workers in C(host_worker) whose elastic-worker tag was deleted (DT's way
    to ask for a removal); remove them gracefully.
  - C(launch) - how many workers to launch so that the job reaches O(desired) workers
    (the master counts), after the joins and removals above.
  - Instances that C(add_workers) or C(remove_workers) are handling right now (status
    C(ADD_QUEUED) with a launch token, C(REMOVAL_QUEUED)) are left alone.
author:
  - dynatrain maintainers (@dynatrain)
options:
  nodes:
    description:
      - The cluster's running instances, one dict each with C(id), C(ip), C(role)
        (C(master)|C(worker)), C(status) (the C(elastic_worker_status) tag or null),
        C(elastic) (the elastic-worker tag is present), C(group) (C(base)|C(elastic)|null)
        and C(token) (the instance carries the playbooks' launch token).
    type: list
    elements: dict
    required: true
  hosts:
    description: The addresses in C(host_worker), the master last.
    type: list
    elements: str
    required: true
  log:
    description: C(host_worker_log) entries, oldest first, as RV(dynatrain.elastic.job_info#module:log) returns them
      (dicts with C(seq), C(event), C(ip), C(ns)).
    type: list
    elements: dict
    default: []
  desired:
    description: Workers the job should have (the master included); V(0) keeps the size as it is.
    type: int
    default: 0
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    support: N/A
    platforms: posix
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Decide what reconcile does
  dynatrain.elastic.reconcile_plan:
    nodes: "{{ my_nodes }}"
    hosts: "{{ job.hosts }}"
    log: "{{ job.log }}"
    desired: 4
  register: plan
"""

RETURN = r"""
lost:
  description: Instances the launcher lost, to tag C(FAILED), clean up and terminate.
  type: list
  elements: dict
  returned: always
drained:
  description: Instances that left the job on their own, to tag C(REMOVED), clean up and terminate.
  type: list
  elements: dict
  returned: always
join:
  description: Instances to configure and join (DT's console workflow).
  type: list
  elements: dict
  returned: always
remove:
  description: Elastic workers whose elastic-worker tag was deleted, to remove gracefully.
  type: list
  elements: dict
  returned: always
launch:
  description: How many new workers to launch to reach O(desired).
  type: int
  returned: always
summary:
  description: One line per decision, for the play's output.
  type: list
  elements: str
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule

BUSY = ("REMOVAL_QUEUED",)        # remove_workers is at work on these


def last_events(log):
    """The last host_worker_log event of each address."""
    last = {}
    for entry in log:
        last[str(entry["ip"])] = str(entry["event"])
    return last


def plan(nodes, hosts, log, desired=0):
    last = last_events(log)
    workers = [n for n in nodes if n.get("role") == "worker" and n.get("status") not in BUSY]
    out = {"lost": [], "drained": [], "join": [], "remove": []}
    for node in workers:
        ip, status = node.get("ip"), node.get("status")
        if ip in hosts:
            if node.get("group") == "elastic" and not node.get("elastic") and status == "ADDED":
                out["remove"].append(node)
            continue
        if status == "FAILED" or last.get(ip) == "FAILED":
            if status not in ("REMOVED",):
                out["lost"].append(node)
        elif last.get(ip) == "REMOVED" and status == "ADDED":
            out["drained"].append(node)
        elif node.get("elastic") and not node.get("token") and status in (None, "", "ADD_QUEUED"):
            out["join"].append(node)
    in_flight = [n for n in workers if n.get("token") and n.get("status") == "ADD_QUEUED" and n.get("ip") not in hosts]
    size = len(hosts) - len(out["remove"]) + len(out["join"]) + len(in_flight)
    out["launch"] = max(0, int(desired) - size) if desired else 0
    out["summary"] = summarize(out, desired, size)
    return out


def summarize(out, desired, size):
    lines = []
    labels = {"lost": "lost by the launcher (FAILED): clean up and terminate",
              "drained": "left the job on their own (spot drain): tag REMOVED and terminate",
              "join": "launched from the worker template outside the playbooks: join",
              "remove": "elastic-worker tag deleted: remove from the job"}
    for key, label in labels.items():
        for node in out[key]:
            lines.append(f"{node.get('id')} {node.get('ip')}: {label}")
    if not lines and not out["launch"]:
        lines.append("nothing to do")
    if desired:
        lines.append(f"desired size {desired}: the job will have {size}; launching {out['launch']}")
    return lines


def main():
    module = AnsibleModule(
        argument_spec={
            "nodes": {"type": "list", "elements": "dict", "required": True},
            "hosts": {"type": "list", "elements": "str", "required": True},
            "log": {"type": "list", "elements": "dict", "default": []},
            "desired": {"type": "int", "default": 0},
        },
        supports_check_mode=True,
    )
    p = module.params
    if p["desired"] < 0:
        module.fail_json(msg=f"desired={p['desired']} is not valid: give the number of workers (>= 1, the master "
                             "included) or 0 to keep the size")
    module.exit_json(changed=False, **plan(p["nodes"], p["hosts"], p["log"], p["desired"]))


if __name__ == "__main__":
    main()
