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
  - "Takes stopped workers from a warm pool as atomically as EC2 allows (EC2 has no compare-and-set on a tag; the
    last writer of a tag wins): 1. a fresh look keeps the picks that are still the pool's (stopped, carrying
    O(pool_tags)); 2. the claim: one C(CreateTags) of this take's O(token) under O(token_tag), with O(tags) and the
    O(stamp) time; 3. a fresh look confirms the claim: only the picks that still carry this take's token and are
    still stopped are held (a pick whose token is another take's was claimed last by that take: this one backs off,
    RV(lost), and its caller launches instead); 4. one C(StartInstances) of the held picks, which is the commit:
    only the instances whose previous state was C(stopped) are this take's (EC2 starts an instance once; a take
    whose start finds it C(pending) or C(running) was second, and backs off); each started instance gets this
    take's token back if a later claim overwrote it; 5. looks every O(poll) seconds until they run."
  - "A start that fails (C(StartInstances) refused for a pick, e.g. no capacity; or an instance found C(stopped)
    again O(stopped_polls) looks in a row after its start) returns the pick to the pool (RV(returned)): the tags
    the claim wrote get back their values from before it, unless another take's token is on it by then. Nothing is
    left C(ADD_QUEUED) for the reconcile playbook to terminate. One that does not run within O(wait_timeout) seconds
    keeps its claim (RV(not_started)); reconcile ends it after its queued timeout."
  - What the cluster role's pool take did in four AWS module runs (each one about a second of the controller's
    time on its own); issues 28 and 40.
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
  pool_tags:
    description:
      - The tags a pick must still carry to be taken (the pool's group tag), looked at right before the claim. A
        pick without them was taken by another add since the caller looked (RV(lost)).
    type: dict
    default: {}
  runtime_tag:
    description: The tag key of the node runtime a pool worker was configured with (set when it was parked).
    type: str
  runtime:
    description:
      - The node runtime the cluster's launcher runs (the runtime wheel's file name). With O(runtime_tag), a pick
        whose runtime tag is another (or missing) is refused before it is claimed (RV(stale)); a worker of an older
        runtime never joins, the caller terminates it and launches in its place.
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
    pool_tags:
      "dynatrain:group": pool
  register: taken
"""

RETURN = r"""
instances:
  description: The taken instances that run, as M(amazon.aws.ec2_instance_info) returns instances.
  returned: success
  type: list
  elements: dict
not_started:
  description: Instances this take holds that did not come to run within O(wait_timeout) (their claim stays).
  returned: success
  type: list
  elements: str
lost:
  description: Picks another take holds (its claim came last, or it started them first); this take backed off.
  returned: success
  type: list
  elements: str
returned:
  description: Picks whose start failed, given back to the pool (their tags as before the claim), with why.
  returned: success
  type: dict
stale:
  description: Picks refused for their runtime (O(runtime_tag) is not O(runtime)), with the runtime each has.
  returned: success
  type: dict
"""

import time

try:
    import botocore
except ImportError:
    pass  # handled by AnsibleAWSModule

from ansible_collections.amazon.aws.plugins.module_utils.modules import AnsibleAWSModule
from ansible_collections.amazon.aws.plugins.module_utils.retries import AWSRetry
from ansible_collections.amazon.aws.plugins.module_utils.tagging import boto3_tag_list_to_ansible_dict

from ansible_collections.dynatrain.elastic.plugins.module_utils.aws_task import TaskFailed, run_module
from ansible_collections.dynatrain.elastic.plugins.module_utils.ec2_instances import as_info, describe


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


class Take:
    """One take's steps, in order: pick, claim, confirm, start, wait (main runs them; a test interleaves two
    takes')."""

    def __init__(self, client, token_tag, token, tags, stamp=None, pool_tags=None, runtime_tag=None, runtime=None):
        self.client, self.token_tag, self.token = client, token_tag, token
        self.claim_tags = dict({str(k): "" if v is None else str(v) for k, v in (tags or {}).items()},
                               **{token_tag: token})
        if stamp:
            self.claim_tags[stamp] = str(int(time.time()))
        self.pool_tags = {str(k): str(v) for k, v in (pool_tags or {}).items()}
        self.before = {}            # id -> {key: value before the claim, None where absent}
        self.lost, self.returned, self.stale = [], {}, {}
        self.runtime_tag, self.runtime = (runtime_tag, runtime) if runtime_tag and runtime else (None, None)

    def look(self, ids):
        """{id: instance} by a fresh DescribeInstances (an id EC2 no longer knows is left out)."""
        if not ids:
            return {}
        # a filter, not InstanceIds: an id EC2 no longer knows is left out instead of failing the look
        found = describe(self.client, Filters=[{"Name": "instance-id", "Values": list(ids)}])
        return {i["InstanceId"]: i for i in found}

    def _tags(self, instance):
        return boto3_tag_list_to_ansible_dict(instance.get("Tags", []))

    def _ours(self, instance):
        return self._tags(instance).get(self.token_tag) == self.token

    def pick(self, picks):
        """The picks that are still the pool's by a fresh look (stopped, carrying pool_tags); the tags the claim
        will write are noted as they are, to give them back after a failed start."""
        found = self.look(picks)
        free = [iid for iid in picks if iid in found and found[iid]["State"]["Name"] == "stopped"
                and all(self._tags(found[iid]).get(k) == v for k, v in self.pool_tags.items())]
        self.lost += [iid for iid in picks if iid not in free]
        if self.runtime:
            self.stale = {iid: self._tags(found[iid]).get(self.runtime_tag) or "unknown" for iid in free
                          if self._tags(found[iid]).get(self.runtime_tag) != self.runtime}
            free = [iid for iid in free if iid not in self.stale]
        self.before.update({iid: {k: self._tags(found[iid]).get(k) for k in self.claim_tags} for iid in free})
        return free

    def claim(self, free):
        """Tag them with this take's token (one CreateTags); the ids claimed."""
        if free:
            self.client.create_tags(Resources=free, Tags=[{"Key": k, "Value": v} for k, v in self.claim_tags.items()],
                                    aws_retry=True)
        return free

    def confirm(self, claimed):
        """The claimed ids that still carry this take's token and are stopped (a fresh look): the last claim won."""
        found = self.look(claimed)
        held = [iid for iid in claimed if iid in found and self._ours(found[iid])
                and found[iid]["State"]["Name"] == "stopped"]
        self.lost += [iid for iid in claimed if iid not in held]
        return held

    def _start(self, ids):
        """{id: previous state} of the starts EC2 accepted, {id: why} of those it refused (one by one after a
        refused batch, so that one bad pick does not cost the others)."""
        try:
            starting = self.client.start_instances(InstanceIds=ids, aws_retry=True)["StartingInstances"]
            return {s["InstanceId"]: s["PreviousState"]["Name"] for s in starting}, {}
        except botocore.exceptions.ClientError as e:
            if len(ids) == 1:
                err = e.response.get("Error", {})
                return {}, {ids[0]: "%s: %s" % (err.get("Code"), err.get("Message"))}
        started, refused = {}, {}
        for iid in ids:
            one, why = self._start([iid])
            started.update(one)
            refused.update(why)
        return started, refused

    def start(self, held):
        """Start the held ids; the ones this take started (previous state stopped: the commit). A refused start
        goes back to the pool; one another take started first is lost."""
        if not held:
            return []
        started, refused = self._start(held)
        won = [iid for iid in held if started.get(iid) == "stopped"]
        self.lost += [iid for iid in held if iid in started and iid not in won]
        self.give_back(refused)
        # a claim that came after this take's confirm may have put its token on them: the start decided, ours back
        found = self.look(won)
        overwritten = [iid for iid in won if iid in found and not self._ours(found[iid])]
        if overwritten:
            self.client.create_tags(Resources=overwritten,
                                    Tags=[{"Key": k, "Value": v} for k, v in self.claim_tags.items()], aws_retry=True)
        return won

    def give_back(self, why):
        """Return {id: why} to the pool: the claim's tags as they were before it, where this take's token is still
        on them (another take's claim is that take's to undo)."""
        found = self.look(list(why))
        for iid, reason in why.items():
            if iid not in found or not self._ours(found[iid]):
                continue
            old = self.before.get(iid, {})
            put = {k: v for k, v in old.items() if v is not None}
            gone = [k for k, v in old.items() if v is None]
            if put:
                self.client.create_tags(Resources=[iid], Tags=[{"Key": k, "Value": v} for k, v in put.items()],
                                        aws_retry=True)
            if gone:
                self.client.delete_tags(Resources=[iid], Tags=[{"Key": k} for k in gone], aws_retry=True)
            self.returned[iid] = reason

    def wait(self, ids, timeout, poll, stopped_polls):
        """Look until the started ids run; (running instances, ids still pending at the timeout). One found
        stopped again stopped_polls looks in a row goes back to the pool."""
        deadline = time.monotonic() + timeout
        stopped_seen, found, running, pending, given_up = {}, {}, [], [], []
        while ids:
            found = self.look(ids)
            running, pending, given_up = settle({iid: found[iid]["State"]["Name"] for iid in found},
                                                stopped_seen, stopped_polls)
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(poll)
        self.give_back({iid: "fell back to stopped after its start" for iid in given_up
                        if found[iid]["State"]["Name"] in ("stopped", "stopping")})
        return ([found[iid] for iid in ids if iid in running], [iid for iid in ids if iid in pending])


ARGUMENT_SPEC = dict(
    instances=dict(type="list", elements="str", required=True),
    token_tag=dict(type="str", required=True, no_log=False),
    token=dict(type="str", required=True, no_log=False),
    tags=dict(type="dict", default={}),
    stamp=dict(type="str"),
    pool_tags=dict(type="dict", default={}),
    runtime_tag=dict(type="str"),
    runtime=dict(type="str"),
    wait_timeout=dict(type="int", default=150),
    poll=dict(type="float", default=1.0),
    stopped_polls=dict(type="int", default=5),
)


def run(api, params, check_mode):
    """The module's work (module_utils/aws_task.py): api is the module or its action plugin."""
    p = params
    picks = list(dict.fromkeys(p["instances"]))
    if not picks:
        return dict(changed=False, instances=[], not_started=[], lost=[], returned={}, stale={})
    if check_mode:
        return dict(changed=True, instances=[], not_started=[], lost=[], returned={}, stale={})
    client = api.client("ec2", retry_decorator=AWSRetry.jittered_backoff())
    take = Take(client, p["token_tag"], p["token"], p["tags"], p["stamp"], p["pool_tags"], p["runtime_tag"],
                p["runtime"])
    try:
        won = take.start(take.confirm(take.claim(take.pick(picks))))
        running, pending = take.wait(won, p["wait_timeout"], p["poll"], p["stopped_polls"])
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
        raise TaskFailed("Could not take %s from the warm pool" % ", ".join(picks), exception=e) from e
    return dict(changed=bool(take.before), instances=[as_info(i) for i in running], not_started=pending,
                lost=take.lost, returned=take.returned, stale=take.stale)


def main():
    run_module(AnsibleAWSModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True), run)


if __name__ == "__main__":
    main()
