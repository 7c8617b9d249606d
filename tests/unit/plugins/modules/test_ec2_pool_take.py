"""dynatrain.elastic.ec2_pool_take: a warm-pool take in one module run (issue 28): claim with the take's token,
start only what this take holds, wait until they run, and stop waiting for one that fell back to stopped."""
from __future__ import annotations

import json

import boto3
import botocore.client
import botocore.exceptions
import pytest
from moto import mock_aws

from ansible.module_utils.testing import patch_module_args
from ansible_collections.amazon.aws.plugins.module_utils.retries import AWSRetry, RetryingBotoClientWrapper

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


def a_take(ec2, token):
    """One take's steps, with the module's own kind of client (aws_retry), for a test to interleave two takes."""
    client = RetryingBotoClientWrapper(ec2, AWSRetry.jittered_backoff())
    return ec2_pool_take.Take(client, TOKEN, token, {"dynatrain:group": "elastic", "elastic_worker_status": "ADD_QUEUED"},
                              "dynatrain:status-time", {"dynatrain:group": "pool"})


def pooled(ec2, ids):
    ec2.create_tags(Resources=ids, Tags=[{"Key": "dynatrain:group", "Value": "pool"}])


def test_two_interleaved_claims_the_last_claim_wins_and_the_other_backs_off(pool):
    # issue 40: two adds that looked at the pool at the same time picked the same workers and both started them
    ec2, ids = pool
    pooled(ec2, ids)
    a, b = a_take(ec2, "ta"), a_take(ec2, "tb")
    free_a, free_b = a.pick(ids[:2]), b.pick(ids[1:3])      # both looked before either claimed: ids[1] twice
    assert free_a == ids[:2] and free_b == ids[1:3]
    claimed_a, claimed_b = a.claim(free_a), b.claim(free_b)
    held_a, held_b = a.confirm(claimed_a), b.confirm(claimed_b)
    assert held_a == [ids[0]] and a.lost == [ids[1]] and held_b == ids[1:3] and b.lost == []
    assert a.start(held_a) == [ids[0]] and b.start(held_b) == ids[1:3]
    assert tags_of(ec2, ids[1])[0][TOKEN] == "tb" and tags_of(ec2, ids[0])[0][TOKEN] == "ta"
    # a third take that looks now finds none of them in the pool
    c = a_take(ec2, "tc")
    assert c.pick(ids) == [] and c.lost == ids


def test_the_start_is_the_commit_and_the_winner_gets_its_token_back(pool):
    # the window a confirm cannot close: b's claim lands after a's confirm, and b's confirm comes before a's start
    ec2, ids = pool
    pooled(ec2, ids)
    a, b = a_take(ec2, "ta"), a_take(ec2, "tb")
    free_a, free_b = a.pick([ids[0]]), b.pick([ids[0]])
    held_a = a.confirm(a.claim(free_a))
    held_b = b.confirm(b.claim(free_b))
    assert held_a == held_b == [ids[0]]                   # both hold it by the tag alone
    assert a.start(held_a) == [ids[0]]                    # EC2 starts an instance once: a's start was first
    assert tags_of(ec2, ids[0])[0][TOKEN] == "ta"          # and the token is a's again
    assert b.start(held_b) == [] and b.lost == [ids[0]]   # b's start found it pending: b backs off


def test_a_take_between_anothers_confirm_and_its_start_never_starts_it_twice(capsys, pool, monkeypatch):
    # the module as two adds run it: b's whole take runs between a's confirm and a's StartInstances; the old
    # describe-then-start had both report the instance as theirs
    ec2, ids = pool
    nested = {}
    real = botocore.client.BaseClient._make_api_call

    def b_takes_it_first(self, operation, params):
        if operation == "StartInstances" and not nested:
            nested["b"] = None
            nested["b"] = take(capsys, [ids[0]], token="tb")
        return real(self, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", b_takes_it_first)
    a = take(capsys, [ids[0]], token="ta")
    taken = [(who, i["instance_id"]) for who, out in (("a", a), ("b", nested["b"])) for i in out["instances"]]
    assert taken == [("b", ids[0])] and a["lost"] == [ids[0]]
    assert tags_of(ec2, ids[0])[0][TOKEN] == "tb"


def test_a_pick_no_longer_in_the_pool_is_not_claimed(capsys, pool):
    ec2, ids = pool
    ec2.create_tags(Resources=ids[:2], Tags=[{"Key": "dynatrain:group", "Value": "pool"}])
    ec2.create_tags(Resources=[ids[1]], Tags=[{"Key": "dynatrain:group", "Value": "elastic"}])  # taken since
    out = take(capsys, ids[:2], pool_tags={"dynatrain:group": "pool"})
    assert [i["instance_id"] for i in out["instances"]] == [ids[0]] and out["lost"] == [ids[1]]
    assert tags_of(ec2, ids[1]) == ({"dynatrain:group": "elastic"}, "stopped")


def test_a_refused_start_returns_the_pick_to_the_pool(capsys, pool, monkeypatch):
    # issue 40: a failed StartInstances left the picks ADD_QUEUED, and reconcile terminated them
    ec2, ids = pool
    pooled = {"dynatrain:group": "pool", "elastic_worker_status": "ADD_QUEUED", TOKEN: "fill"}
    ec2.create_tags(Resources=ids[:2], Tags=[{"Key": k, "Value": v} for k, v in pooled.items()])
    real = botocore.client.BaseClient._make_api_call

    def no_capacity_for_the_second(self, operation, params):
        if operation == "StartInstances" and ids[1] in params.get("InstanceIds", []):
            raise botocore.exceptions.ClientError(
                {"Error": {"Code": "InsufficientInstanceCapacity", "Message": "no capacity"}}, operation)
        return real(self, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", no_capacity_for_the_second)
    out = take(capsys, ids[:2], pool_tags={"dynatrain:group": "pool"})
    assert [i["instance_id"] for i in out["instances"]] == [ids[0]] and out["not_started"] == []
    assert list(out["returned"]) == [ids[1]] and "InsufficientInstanceCapacity" in out["returned"][ids[1]]
    assert tags_of(ec2, ids[1]) == (pooled, "stopped")        # the pool's again, as before the claim
    assert tags_of(ec2, ids[0])[0][TOKEN] == "t1"


def test_a_start_that_falls_back_to_stopped_returns_it_to_the_pool(capsys, pool, monkeypatch):
    ec2, ids = pool
    real = ec2_pool_take.describe

    def stopped_again(client, **kwargs):
        found = real(client, **kwargs)
        for i in found:
            if i["InstanceId"] == ids[0] and i["State"]["Name"] in ("pending", "running"):
                i["State"] = {"Code": 80, "Name": "stopped"}
        return found

    monkeypatch.setattr(ec2_pool_take, "describe", stopped_again)
    out = take(capsys, [ids[0]], stopped_polls=2)
    assert out["instances"] == [] and list(out["returned"]) == [ids[0]]
    assert TOKEN not in tags_of(ec2, ids[0])[0] and "elastic_worker_status" not in tags_of(ec2, ids[0])[0]


def test_a_pool_worker_of_another_runtime_is_refused_before_it_is_claimed(capsys, pool):
    # issue 40: a taken pool worker was never checked for a runtime older than the launcher's
    ec2, ids = pool
    ec2.create_tags(Resources=[ids[0]], Tags=[{"Key": "dynatrain:runtime", "Value": "rt-2.whl"}])
    ec2.create_tags(Resources=[ids[1]], Tags=[{"Key": "dynatrain:runtime", "Value": "rt-1.whl"}])
    out = take(capsys, ids, runtime_tag="dynatrain:runtime", runtime="rt-2.whl")
    assert [i["instance_id"] for i in out["instances"]] == [ids[0]]
    assert out["stale"] == {ids[1]: "rt-1.whl", ids[2]: "unknown"}
    assert tags_of(ec2, ids[1]) == ({"dynatrain:runtime": "rt-1.whl"}, "stopped")     # not claimed, not started


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
