"""module_utils/preflight.py: the vCPU quota rule (issue 12) without AWS."""
from __future__ import annotations

import pytest

from ansible_collections.dynatrain.elastic.plugins.module_utils.preflight import (
    vcpu_class,
    vcpu_needs,
    vcpu_problem,
)


@pytest.mark.parametrize("instance_type, klass", [
    ("c5.xlarge", "standard"), ("m7i.large", "standard"), ("t3.micro", "standard"), ("i4i.xlarge", "standard"),
    ("g4dn.xlarge", "g"), ("g5.48xlarge", "g"), ("vt1.3xlarge", "g"), ("p4d.24xlarge", "p"), ("p5.48xlarge", "p"),
    ("inf2.xlarge", None), ("trn1.2xlarge", None), ("x2idn.16xlarge", None), ("u-6tb1.metal", None), ("", None),
])
def test_class_of_each_family(instance_type, klass):
    assert vcpu_class(instance_type) == klass


def test_needs_add_requested_and_running_per_class_and_market():
    vcpus = {"c5.xlarge": 4, "g4dn.xlarge": 4, "m5.large": 2, "inf2.xlarge": 4}
    requests = [{"instance_type": "c5.xlarge", "count": 1, "market": "on-demand", "setting": "m"},
                {"instance_type": "g4dn.xlarge", "count": 3, "market": "spot", "setting": "w"},
                {"instance_type": "inf2.xlarge", "count": 1, "market": "on-demand"}]
    running = [{"instance_type": "m5.large", "market": "on-demand"}, {"instance_type": "m5.large", "market": "spot"},
               {"instance_type": "g4dn.xlarge", "market": "on-demand"}]
    needs = vcpu_needs(requests, vcpus, running)
    assert set(needs) == {("standard", "on-demand"), ("g", "spot")}
    assert needs[("standard", "on-demand")]["requested"] == 4 and needs[("standard", "on-demand")]["running"] == 2
    assert needs[("g", "spot")]["requested"] == 12 and needs[("g", "spot")]["running"] == 0


def test_problem_only_above_the_quota():
    need = {"requested": 12, "running": 4, "types": ["dt_worker_instance_type=g4dn.xlarge (4 vCPUs) x 3"]}
    assert vcpu_problem("g", "spot", need, 16) == ""
    message = vcpu_problem("g", "spot", need, 15, "us-west-2")
    assert message.startswith("vCPU quota too small in us-west-2: dt_worker_instance_type=g4dn.xlarge (4 vCPUs) x 3 "
                              "need 12 vCPUs, 4 are already running, and the quota 'All G and VT Spot Instance "
                              "Requests' (L-3819A6DF) is 15.")
    assert "--desired-value 16" in message
