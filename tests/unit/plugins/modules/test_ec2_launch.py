"""dynatrain.elastic.ec2_launch's wait (issue 43): looks until every launched instance runs, counts one EC2 does not
list yet as pending, and gives back the ones still pending at the timeout instead of failing."""
from __future__ import annotations

import pytest

from ansible_collections.dynatrain.elastic.plugins.modules import ec2_launch


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def looks(monkeypatch, states_per_look):
    """describe() answers each look with the next {id: state} (an id absent: EC2 does not list it yet)."""
    answers = iter(states_per_look)
    seen = []

    def describe(client, **kwargs):
        seen.append(kwargs["InstanceIds"])
        return [{"InstanceId": iid, "State": {"Name": state}} for iid, state in next(answers).items()]
    monkeypatch.setattr(ec2_launch, "describe", describe)
    return seen


def test_waits_until_every_instance_runs(monkeypatch):
    clock = Clock()
    seen = looks(monkeypatch, [{"i-1": "pending"}, {"i-1": "running", "i-2": "pending"},
                               {"i-1": "running", "i-2": "running"}])
    found, pending = ec2_launch.wait_running(None, ["i-1", "i-2"], 10, 0.5, sleep=clock.sleep, clock=clock)
    assert pending == [] and {i: f["State"]["Name"] for i, f in found.items()} == {"i-1": "running", "i-2": "running"}
    assert len(seen) == 3 and clock.now == pytest.approx(1.0)


def test_the_ones_not_running_at_the_timeout_are_returned_not_failed(monkeypatch):
    clock = Clock()
    looks(monkeypatch, [{"i-1": "running", "i-2": "pending"}] * 100)
    found, pending = ec2_launch.wait_running(None, ["i-1", "i-2"], 2, 0.5, sleep=clock.sleep, clock=clock)
    assert pending == ["i-2"] and found["i-1"]["State"]["Name"] == "running"
    assert clock.now == pytest.approx(2.0)


def test_the_request_is_all_or_none_tagged_twice_and_imdsv2():
    spec = ec2_launch.run_spec("c-worker", 3, {"a": 1, "b": True})
    assert spec["MinCount"] == spec["MaxCount"] == 3 and spec["LaunchTemplate"] == {"LaunchTemplateName": "c-worker"}
    assert spec["MetadataOptions"]["HttpTokens"] == "required"
    assert [s["ResourceType"] for s in spec["TagSpecifications"]] == ["volume", "instance"]
    assert spec["TagSpecifications"][1]["Tags"] == [{"Key": "a", "Value": "1"}, {"Key": "b", "Value": "True"}]
    assert "TagSpecifications" not in ec2_launch.run_spec("c-worker", 1, {})
