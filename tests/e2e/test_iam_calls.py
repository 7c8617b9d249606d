"""Issue 12: the controller's IAM policy is least privilege, proven by the calls the e2e made.

Runs last in the e2e session (the e2e conftest puts it after every other test). The local
cloud recorded every AWS API call it served (localcloud/request_log.py); this test
first tears the e2e's clusters down (so teardown's calls are in the record too; the
session's clean-up then finds nothing left), then compares the actions the product made
(its calls carry Ansible's User-Agent; the test's own boto3 look-ups and the cloud's
bookkeeping do not) with files/iam/controller-policy.json: every call must be allowed,
and every allowed action must have been called or be listed, with why, in
files/iam/controller-policy-coverage.json (which also lists the calls that need no grant).
"""
from __future__ import annotations

import json
import os
import sys
import time

import pytest

from conftest import CLUSTERS, ROOT, playbook

if ROOT not in sys.path:  # the repository's localcloud package, however pytest is started
    sys.path.insert(0, ROOT)

from localcloud import request_log  # noqa: E402

pytestmark = pytest.mark.e2e

IAM = os.path.join(ROOT, "files", "iam")
# Collected with test_elastic.py at the session's start: calls before it (a molecule scenario on a
# cloud left up) are not this run's.
SESSION_START = time.time()


def _load(name):
    with open(os.path.join(IAM, name), encoding="utf-8") as f:
        return json.load(f)


def _this_session(records):
    return [r for r in records if r.get("t", 0) >= SESSION_START]


def test_controller_policy_allows_exactly_the_calls_of_the_run(cloud):
    calls = request_log.log_path(cloud.get("DT_LOCALCLOUD_HOME") or os.path.join(ROOT, ".localcloud"))
    records = _this_session(request_log.read(calls)) if os.path.exists(calls) else []
    if "ec2:RunInstances" not in request_log.product_actions(records):
        pytest.skip("no cluster was launched in this session (run it after tests/e2e/test_elastic.py)")
    for name, extra in sorted(CLUSTERS.items()):
        rc, out = playbook(cloud, "teardown", extra, timeout=600)
        assert rc == 0, "teardown of %s failed:\n%s" % (name, out[-3000:])
    called = request_log.product_actions(_this_session(request_log.read(calls)))
    allowed = request_log.policy_actions(_load("controller-policy.json"))
    coverage = _load("controller-policy-coverage.json")
    not_exercised, not_needed = coverage["allowed_not_exercised_by_the_e2e"], coverage["called_not_needed"]
    print("IAM: %d actions called by the product, %d allowed, %d allowed but not exercised here"
          % (len(called), len(allowed), len(not_exercised)), flush=True)
    problems = request_log.compare(allowed, called, not_exercised, not_needed)
    assert not problems, "files/iam/controller-policy.json against %s:\n%s" % (calls, "\n".join(problems))
