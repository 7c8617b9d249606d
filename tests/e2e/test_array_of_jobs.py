"""Issue 14 end to end on the local cloud: a job array across two regions, and a region without
capacity. `ansible-playbook job_array.yml -e manifest=jobs.csv` (typed as a user would) runs one
small job per row on a cluster of its own: us-east-1 and us-west-2 side by side, each job trained,
its results/final.json copied to S3 by the master, its cluster torn down; the eu-west-1 row fails in
preflight (its vCPU quota is 0) and the others go on. Afterwards both results are in S3, no cluster
of the array is left, and `status.yml -e array=NAME` shows every row.

Runs before test_elastic.py and test_iam_calls.py (name order), so its AWS calls are part of the
IAM proof too.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from conftest import CLUSTERS, ROOT, playbook

pytestmark = pytest.mark.e2e

ARRAY = "e2earray"
# Row i's network moves the second octet of this base by 1 + i (the e2e's other clusters use 127.79-80).
NET = {"dt_vpc_cidr": "127.120.0.0/16", "dt_subnet_cidr": "127.120.1.0/24"}
# us-west-2's row is a master alone (workers 0: a form a user types too); its nodes install from the
# base AMI as us-east-1's do, and one node fewer keeps the e2e within make test's time.
ROWS = [("us-east-1", "east", 1, "--epochs 2 --seed 3"),
        ("us-west-2", "west", 0, "--epochs 2 --seed 4"),
        ("eu-west-1", "nocap", 1, "--epochs 2")]
NO_CAPACITY = "eu-west-1"
VCPU_QUOTA = "L-1216C47A"  # Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances


def _boto(env, service, region):
    import boto3
    return boto3.client(service, endpoint_url=env["AWS_ENDPOINT_URL"], region_name=region,
                        aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])


def _quota(region, value):
    subprocess.run([sys.executable, "-m", "localcloud", "quota", "--region", region, "ec2", VCPU_QUOTA, str(value)],
                   cwd=ROOT, check=True, timeout=60, capture_output=True)


def _left(env, cluster, region):
    """What the cluster still has in its region: live instances and VPCs."""
    tag = [{"Name": "tag:dynatrain:cluster", "Values": [cluster]}]
    ec2 = _boto(env, "ec2", region)
    live = [i["InstanceId"] for r in ec2.describe_instances(Filters=tag)["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] not in ("terminated", "shutting-down")]
    return live + [v["VpcId"] for v in ec2.describe_vpcs(Filters=tag)["Vpcs"]]


def _roles(env, cluster, region):
    """The roles of every instance the cluster ever had (terminated ones too), master first."""
    tag = [{"Name": "tag:dynatrain:cluster", "Values": [cluster]}]
    roles = [{t["Key"]: t["Value"] for t in i.get("Tags", [])}.get("dynatrain:role")
             for r in _boto(env, "ec2", region).describe_instances(Filters=tag)["Reservations"] for i in r["Instances"]]
    return sorted(roles, key=lambda role: role != "master")


def test_job_array_across_two_regions_and_one_without_capacity(cloud, tmp_path):
    env = cloud
    manifest = tmp_path / (ARRAY + ".csv")
    manifest.write_text("region,name,workers,args\n" + "".join(
        '%s,%s,%d,"%s"\n' % row for row in ROWS), encoding="utf-8")
    for region, name, _workers, _args in ROWS:
        CLUSTERS["%s-%s" % (ARRAY, name)] = {"dt_cluster_name": "%s-%s" % (ARRAY, name), "dt_region": region}
    _quota(NO_CAPACITY, 0)
    try:
        started = time.monotonic()
        rc, out = playbook(env, "job_array", dict(NET, manifest=str(manifest)), timeout=2400)
        wall = time.monotonic() - started
    finally:
        _quota(NO_CAPACITY, 256)
    # one row failed, so the array fails -- after every row ended, naming it with preflight's message
    assert rc != 0, out[-5000:]
    assert re.search(r"nocap.*vCPU quota", out), out[-5000:]

    rc, status = playbook(env, "status", {"array": ARRAY})
    assert rc == 0, status[-3000:]
    rows = {}
    for region, name, _workers, _args in ROWS:
        line = re.search(r"^\s*%s\s+%s\s+%s-%s\s+(\w+)\s" % (name, region, ARRAY, name), status, re.M)
        assert line, status[-3000:]
        rows[name] = line.group(1)
    assert rows == {"east": "finished", "west": "finished", "nocap": "failed"}, rows

    # both results in S3, each from its own job; nothing of the array is left running
    s3 = _boto(env, "s3", "us-east-1")
    bucket = [b["Name"] for b in s3.list_buckets()["Buckets"] if b["Name"].startswith("dynatrain-checkpoints-")][0]
    for _region, name, _workers, args in ROWS[:2]:
        key = "%s-%s/%s/results/final.json" % (ARRAY, name, name)
        final = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        assert final["epochs"] == 2 and final["seed"] == int(args.split()[-1]), final
        assert final["val_acc"] > 0.5, final
    for region, name, _workers, _args in ROWS:
        assert not _left(env, "%s-%s" % (ARRAY, name), region), (name, region)
    # each row's cluster had its master and as many base workers as the row asked (0 too)
    for region, name, workers, _args in ROWS[:2]:
        assert _roles(env, "%s-%s" % (ARRAY, name), region) == ["master"] + ["worker"] * workers, (name, region)
    # the results are checked: leave the bucket as this test found it (test_elastic.py's last
    # teardown, with delete_checkpoints=true, then finds it empty and deletes it). The bucket is
    # versioned: every version and delete marker goes, else the bucket is never empty.
    for _region, name, _workers, _args in ROWS:
        for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix="%s-%s/" % (ARRAY, name)):
            for obj in page.get("Versions", []) + page.get("DeleteMarkers", []):
                s3.delete_object(Bucket=bucket, Key=obj["Key"], VersionId=obj["VersionId"])
    summary = re.search(r"wall time (\d+) s vs (\d+) s", out)
    assert summary and int(summary.group(1)) < int(summary.group(2)), out[-3000:]
    print("\njob array (2 regions + 1 without capacity): wall %s s vs %s s one after another; "
          "job_array.yml %.0f s" % (summary.group(1), summary.group(2), wall), flush=True)
