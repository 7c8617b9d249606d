"""dynatrain.elastic.ec2_pool_take: a warm-pool take in one module run (issue 28): claim with the take's token,
start only what this take holds, wait until they run, and stop waiting for one that fell back to stopped."""
from __future__ import annotations

import json

import boto3
import pytest
from moto import mock_aws

from ansible.module_utils.testing import patch_module_args

from ansible_collections.dynatrain.elastic.plugins.modules import ec2_pool_take

TOKEN = "dynatrain:launch-token"


def take(capsys, ids, token="t1", **params):
    args = {"instances": ids, "token_tag": TOKEN, "token": token, "region": "us-east-1",
            "tags": {"dynatrain:group": "elastic", "elastic_worker_status": "ADD_QUEUED"},
            "stamp": "dynatrain:status-time", "poll": 0.01}
    args.update(params)
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            ec2_pool_take.main()
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def pool(monkeypatch):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        ami = ec2.describe_images()["Images"][0]["ImageId"]
        ids = [i["InstanceId"] for i in ec2.run_instances(ImageId=ami, MinCount=3, MaxCount=3)["Instances"]]
        ec2.stop_instances(InstanceIds=ids)
        yield ec2, ids


def tags_of(ec2, iid):
    res = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
    return {t["Key"]: t["Value"] for t in res.get("Tags", [])}, res["State"]["Name"]


def test_takes_claims_and_starts_the_picks_only(capsys, pool):
    ec2, ids = pool
    out = take(capsys, ids[:2])
    assert out["changed"] and out["not_started"] == []
    assert sorted(i["instance_id"] for i in out["instances"]) == sorted(ids[:2])
    assert all(i["state"]["name"] == "running" and i["tags"][TOKEN] == "t1" for i in out["instances"])
    tags, state = tags_of(ec2, ids[0])
    assert state == "running" and tags["elastic_worker_status"] == "ADD_QUEUED" and tags["dynatrain:status-time"]
    assert tags_of(ec2, ids[2])[1] == "stopped"


def test_a_pick_another_take_claimed_since_is_not_started(capsys, pool, monkeypatch):
    ec2, ids = pool
    real = ec2_pool_take.describe

    def claimed_by_another_in_between(client, **kwargs):
        if "Filters" in kwargs:   # the look for what this take holds: another take's claim came last on ids[1]
            client.create_tags(Resources=[ids[1]], Tags=[{"Key": TOKEN, "Value": "other"}])
        return real(client, **kwargs)

    monkeypatch.setattr(ec2_pool_take, "describe", claimed_by_another_in_between)
    out = take(capsys, ids[:2])
    assert [i["instance_id"] for i in out["instances"]] == [ids[0]]
    assert tags_of(ec2, ids[1]) == ({TOKEN: "other", "dynatrain:group": "elastic", "elastic_worker_status": "ADD_QUEUED",
                                     "dynatrain:status-time": tags_of(ec2, ids[1])[0]["dynatrain:status-time"]}, "stopped")


def test_check_mode_and_an_empty_pick_change_nothing(capsys, pool):
    ec2, ids = pool
    assert take(capsys, [])["changed"] is False
    out = take(capsys, ids[:1], _ansible_check_mode=True)
    assert out["instances"] == [] and tags_of(ec2, ids[0]) == ({}, "stopped")


def test_settle_gives_up_on_a_start_that_fell_back_to_stopped():
    seen = {}
    for _look in range(4):
        running, pending, given_up = ec2_pool_take.settle({"a": "running", "b": "stopped", "c": "pending"}, seen, 5)
        assert (running, pending, given_up) == (["a"], ["b", "c"], [])
    assert ec2_pool_take.settle({"a": "running", "b": "stopped", "c": "running"}, seen, 5) == (["a", "c"], [], ["b"])
    # a look that finds it pending again starts the count anew
    seen = {"b": 4}
    assert ec2_pool_take.settle({"b": "pending"}, seen, 5) == ([], ["b"], []) and seen == {"b": 0}
    assert ec2_pool_take.settle({"b": "terminated"}, {}, 5) == ([], [], ["b"])
