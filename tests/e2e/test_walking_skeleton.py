"""Issue 2 end to end: bad input, bootstrap master + 1 worker on the local
cloud, MXNet dist_sync across 2 containers to >= 90 % on digits, idempotent
re-run, teardown leaves nothing."""
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, playbook

pytestmark = pytest.mark.e2e

CLUSTER = "e2eskel"
NET = {"dt_cluster_name": CLUSTER, "dt_vpc_cidr": "127.78.0.0/16", "dt_subnet_cidr": "127.78.1.0/24"}


def _ec2(env):
    import boto3
    return boto3.client("ec2", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                        aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])


def _cluster_vpcs(env):
    vpcs = _ec2(env).describe_vpcs(Filters=[{"Name": "tag:dynatrain:cluster", "Values": [CLUSTER]}])["Vpcs"]
    return [v["VpcId"] for v in vpcs]


def _containers(env):
    out = subprocess.run(["podman", "ps", "-a", "--filter", "label=dynatrain.localcloud=1", "--format", "{{.Names}}"],
                         env=env, capture_output=True, text=True, check=True).stdout
    return set(out.split())


@pytest.mark.parametrize("bad", ["-1", "abc"])
def test_bad_worker_count_creates_nothing(cloud, bad):
    rc, out = playbook(cloud, "bootstrap", dict(NET, worker_count=bad))
    assert rc != 0
    assert "worker_count=%s is not valid" % bad in out
    assert "Nothing was created" in out
    assert _cluster_vpcs(cloud) == []


def test_bootstrap_trains_across_two_nodes(cloud):
    args = ["--cluster", CLUSTER, "--workers", "1", "--subnet", NET["dt_subnet_cidr"], "--no-elastic",
            "--train-args", "--epochs 10", "--json"]
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "demo.py")] + args, cwd=ROOT,
                          capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])

    nodes = summary["nodes"]
    assert sorted(n["role"] for n in nodes) == ["master", "worker"]
    ips = [n["ip"] for n in nodes]
    assert all(ip.startswith("127.78.1.") for ip in ips)
    # every instance is a running container named by its instance id
    assert {n["id"] for n in nodes} <= _containers(cloud)

    master = [n["ip"] for n in nodes if n["role"] == "master"][0]
    assert summary["host_worker"][-1] == master and sorted(summary["host_worker"]) == sorted(ips)
    for line in summary["host_worker_log"]:
        assert re.match(r"^\d+ ADDED 127\.78\.1\.\d+ \d{19}$", line), line

    final = summary["final"]
    assert final["val_acc"] >= 0.90
    assert final["world_at_end"] == 2
    # one process group, with a worker process on each of the two nodes
    assert [sorted(g["membership"]) for g in summary["generations"]] == [sorted(ips)]

    # the checkpoint on the shared volume is complete
    ckpts = os.path.join(summary["efs_dir"], "checkpoints")
    assert os.path.isdir(ckpts) and os.listdir(ckpts)

    # each node has the env file and a known_hosts-pinned SSH login
    env_file = subprocess.run(["podman", "exec", nodes[0]["id"], "cat", "/etc/profile.d/deeplearning.sh"],
                              env=cloud, capture_output=True, text=True, check=True).stdout
    assert "DEEPLEARNING_WORKERS_COUNT=2" in env_file
    assert "EFS_MOUNT=/myEFSvolume" in env_file


def test_bootstrap_again_changes_nothing(cloud):
    rc, out = playbook(cloud, "bootstrap", dict(NET, worker_count=1))
    assert rc == 0, out[-4000:]
    recap = out[out.rindex("PLAY RECAP"):]
    assert re.findall(r"changed=(\d+)", recap) and all(c == "0" for c in re.findall(r"changed=(\d+)", recap)), recap


def test_status_reads_the_cluster(cloud):
    rc, out = playbook(cloud, "status", NET)
    assert rc == 0, out[-4000:]
    nodes = re.findall(r"- (127\.78\.1\.\d+) (master|worker) - (i-[0-9a-f]+)", out)
    assert sorted(node[1] for node in nodes) == ["master", "worker"], out[-4000:]
    assert re.search(r"- 1 ADDED 127\.78\.1\.\d+ \d{19}", out), out[-4000:]
    assert "state: finished" in out and "world_size: 2" in out, out[-4000:]


def test_teardown_leaves_nothing(cloud):
    before = _containers(cloud)
    ids = [i["InstanceId"] for r in _ec2(cloud).describe_instances(
        Filters=[{"Name": "tag:dynatrain:cluster", "Values": [CLUSTER]}])["Reservations"] for i in r["Instances"]]
    assert ids
    rc, out = playbook(cloud, "teardown", NET)
    assert rc == 0, out[-4000:]
    assert _cluster_vpcs(cloud) == []
    states = {i["State"]["Name"] for r in _ec2(cloud).describe_instances(InstanceIds=ids)["Reservations"]
              for i in r["Instances"]}
    assert states == {"terminated"}
    import time
    deadline = time.time() + 60
    while time.time() < deadline and set(ids) & _containers(cloud):
        time.sleep(1)
    assert not set(ids) & _containers(cloud), "containers of terminated instances remain"
    assert before  # sanity: there were containers to remove
