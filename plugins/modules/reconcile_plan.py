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
    C(ADD_QUEUED) with a launch token, C(REMOVAL_QUEUED)) are left alone for O(timeout) seconds,
    counted from when the status was set (C(status_time)), else from the launch (an add's new
    instances; a worker an add took from the warm pool carries the time it was taken).
    An operation still queued after that was interrupted (Ctrl-C, a lost controller) or failed,
    and reconcile finishes it or rolls it back.
  - C(expired_adds) - C(ADD_QUEUED) past O(timeout), not in C(host_worker); tag C(ADD_FAILED),
    remove the marker, terminate.
  - C(confirmed) - C(ADD_QUEUED) past O(timeout), in C(host_worker) and confirmed by the launcher
    (an C(ADDED) event since its launch); tag C(ADDED).
  - C(expired_removals) - C(REMOVAL_QUEUED) past O(timeout), no longer in C(host_worker); tag
    C(REMOVED), remove the marker, terminate. Past O(timeout) and still in C(host_worker), an
    C(ADD_QUEUED) the launcher never confirmed and a C(REMOVAL_QUEUED) are removed gracefully
    (C(remove)).
  - C(unparked) - warm-pool workers (group C(pool)) still running O(timeout) seconds after their launch, left by a
    pool fill that was interrupted (Ctrl-C, a lost controller) before it stopped them. With O(park_pool) the warm
    pool's refill configures and parks them; without it they are terminated (nothing says they were configured). A
    pool worker younger than that belongs to the fill at work on it.
  - Only C(host_worker_log) events since an instance's launch count (EC2 re-uses private
    addresses, and an old C(FAILED) of its address is another instance's); an instance an add owns
    (C(ADD_QUEUED) within O(timeout)) is never lost.
author:
  - dynatrain maintainers (@dynatrain)
options:
  nodes:
    description:
      - The cluster's running instances, one dict each with C(id), C(ip), C(role)
        (C(master)|C(worker)), C(status) (the C(elastic_worker_status) tag or null),
        C(elastic) (the elastic-worker tag is present), C(group) (C(base)|C(elastic)|C(pool)|null), C(state) (the
        EC2 state; running when not given),
        C(token) (the instance carries the playbooks' launch token), C(launch_time) (ISO 8601
        or epoch seconds) and C(status_time) (epoch seconds when the status tag was set, the
        C(dynatrain:status-time) tag, or null).
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
  timeout:
    description:
      - Seconds an instance belongs to the C(add_workers) / C(remove_workers) that queued it
        (from when the status was set, else from its launch); longer than
        any add (launch, configure, data preparation and C(dt_join_timeout)) or removal takes.
    type: int
    default: 1800
  park_pool:
    description: The warm pool is refilled after the plan (C(dt_warm_pool_size) given), which parks RV(unparked).
    type: bool
    default: false
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
    timeout: 1800
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
expired_adds:
  description: Instances an interrupted or failed add left C(ADD_QUEUED) outside the job, to tag C(ADD_FAILED) and terminate.
  type: list
  elements: dict
  returned: always
confirmed:
  description: Instances an interrupted add left C(ADD_QUEUED) that the launcher confirmed, to tag C(ADDED).
  type: list
  elements: dict
  returned: always
expired_removals:
  description: Instances an interrupted removal left C(REMOVAL_QUEUED) outside the job, to tag C(REMOVED) and terminate.
  type: list
  elements: dict
  returned: always
unparked:
  description: Warm-pool workers an interrupted fill left running, to park (O(park_pool)) or terminate.
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

import datetime
import time

from ansible.module_utils.basic import AnsibleModule

DEFAULT_TIMEOUT = 1800            # s an ADD_QUEUED / REMOVAL_QUEUED instance belongs to its operation
KEYS = ("lost", "drained", "join", "remove", "expired_adds", "confirmed", "expired_removals", "unparked")
POOL_GROUP = "pool"


def epoch(value):
    """Seconds since the epoch of an ISO 8601 string or a number; None when absent or unreadable."""
    if value in (None, ""):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp()


def last_event(log, ip, since=None):
    """The last host_worker_log event of ``ip`` at or after ``since`` (epoch s; None: any).

    EC2 re-uses private addresses: events from before an instance's launch are another instance's."""
    floor = None if since is None else int(since * 1_000_000_000)
    last = None
    for entry in log:
        if str(entry["ip"]) == ip and (floor is None or int(entry.get("ns") or 0) >= floor):
            last = str(entry["event"])
    return last


def queued(node):
    """True for an instance an add_workers (ADD_QUEUED, launch token) or a removal (REMOVAL_QUEUED) queued."""
    status = node.get("status")
    return status == "REMOVAL_QUEUED" or (status == "ADD_QUEUED" and bool(node.get("token")))


def queued_since(node):
    """When the operation that queued the node started (epoch s): the status tag's time, else the launch
    (an add's own launch tags no time; a worker an add took from the warm pool was launched long
    before, and stamped when it was taken); None when unknown."""
    since = epoch(node.get("status_time"))
    return since if since is not None else epoch(node.get("launch_time"))


def owned(node, timeout, now):
    """True while the add/removal that queued the node may still be at work on it (an unknown start: always)."""
    since = queued_since(node)
    return queued(node) and (since is None or now - since < timeout)


def decide_expired(node, in_job, last, out):
    """An add or removal that outlived its timeout: finish it or roll it back."""
    if node.get("status") == "REMOVAL_QUEUED":
        out["remove" if in_job else "expired_removals"].append(node)
    elif in_job:
        out["confirmed" if last == "ADDED" else "remove"].append(node)
    elif last == "FAILED":
        out["lost"].append(node)
    else:
        out["expired_adds"].append(node)


def decide(node, in_job, last, out):
    """A worker no operation owns."""
    status = node.get("status")
    if in_job:
        if node.get("group") == "elastic" and not node.get("elastic") and status == "ADDED":
            out["remove"].append(node)
    elif status == "FAILED" or last == "FAILED":
        if status != "REMOVED":
            out["lost"].append(node)
    elif last == "REMOVED" and status == "ADDED":
        out["drained"].append(node)
    elif node.get("elastic") and not node.get("token") and status in (None, "", "ADD_QUEUED"):
        out["join"].append(node)


def unparked(node, timeout, now):
    """A warm-pool worker an interrupted fill left running: running (or pending) past ``timeout`` after its launch
    (a fill at work owns it until then; an unknown launch: never)."""
    launched = epoch(node.get("launch_time"))
    return (node.get("state") or "running") in ("pending", "running") and launched is not None \
        and now - launched >= timeout


def plan(nodes, hosts, log, desired=0, timeout=DEFAULT_TIMEOUT, now=None, park_pool=False):
    now = time.time() if now is None else now
    out = {key: [] for key in KEYS}
    adding = leaving = 0             # what the operations in flight will add to / take from the job
    for node in (n for n in nodes if n.get("role") == "worker"):
        if node.get("group") == POOL_GROUP:         # no worker process; only a fill's leftovers concern reconcile
            if unparked(node, timeout, now):
                out["unparked"].append(node)
            continue
        in_job = node.get("ip") in hosts
        if owned(node, timeout, now):
            if node.get("status") == "ADD_QUEUED":
                adding += 0 if in_job else 1
            else:
                leaving += 1 if in_job else 0
            continue
        last = last_event(log, node.get("ip"), epoch(node.get("launch_time")))
        if queued(node):
            decide_expired(node, in_job, last, out)
        else:
            decide(node, in_job, last, out)
    size = len(hosts) - leaving - len(out["remove"]) + len(out["join"]) + adding
    out["launch"] = max(0, int(desired) - size) if desired else 0
    out["summary"] = summarize(out, desired, size, park_pool)
    return out


def summarize(out, desired, size, park_pool=False):
    lines = []
    labels = {"lost": "lost by the launcher (FAILED): clean up and terminate",
              "drained": "left the job on their own (spot drain): tag REMOVED and terminate",
              "join": "launched from the worker template outside the playbooks: join",
              "remove": "elastic-worker tag deleted, or an interrupted add/removal: remove from the job",
              "expired_adds": "an interrupted or failed add left it ADD_QUEUED outside the job: tag ADD_FAILED and terminate",
              "confirmed": "an interrupted add left it ADD_QUEUED, the launcher confirmed it: tag ADDED",
              "expired_removals": "an interrupted removal left it REMOVAL_QUEUED outside the job: tag REMOVED and terminate",
              "unparked": "a warm-pool worker an interrupted fill left running: "
                          + ("configure and park it (the warm pool's refill)" if park_pool else "terminate")}
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
            "timeout": {"type": "int", "default": DEFAULT_TIMEOUT},
            "park_pool": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    if p["desired"] < 0:
        module.fail_json(msg=f"desired={p['desired']} is not valid: give the number of workers (>= 1, the master "
                             "included) or 0 to keep the size")
    if p["timeout"] < 1:
        module.fail_json(msg=f"timeout={p['timeout']} is not valid: give the seconds (>= 1) an add or a removal may "
                             "take before reconcile finishes or rolls it back")
    module.exit_json(changed=False, **plan(p["nodes"], p["hosts"], p["log"], p["desired"], p["timeout"],
                                           park_pool=p["park_pool"]))


if __name__ == "__main__":
    main()
