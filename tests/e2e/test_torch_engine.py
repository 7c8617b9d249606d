"""Issue 26 end to end on the local cloud with the PyTorch engine (`-e dt_engine=torch`), one cluster
lifecycle: bake the node image for the torch engine (/etc/dynatrain/baked.json says so), bootstrap a
master and two base workers from it, then while the job trains add a worker (`add_workers -e count=1`,
without naming the engine: the cluster keeps its own), remove it (`remove_workers -e count=1`), kill a
base worker's container (its loss is logged FAILED and the job resumes from a survivor's snapshot), and
drain the other on a spot notice (`localcloud interrupt`, nothing recomputed); end the job with
`train.yml` (again without the engine). host_worker_log holds exactly the expected lines in DT's layout,
no sample is skipped or repeated within an epoch across the resizes, accuracy >= 0.9, status.json and
the launcher's events name the torch engine, and status.yml shows it. Teardown at the end.
Issue 41: the add and the removal happen in place (the helper API's default on CPU): every survivor's
training process is the same before and after both, no checkpoint is written for either, and the joiner's
state comes from its peers (bytes moved); the restart path is the MXNet e2e's (test_elastic.py).

Its own cluster (e2etorch) and loopback network (127.81.0.0/16), apart from the other e2e modules'."""
import argparse
import os
import re
import subprocess
import sys
import time

import pytest

from conftest import ROOT, demo, playbook, resizes, task_results

from dynatrain_runtime import CheckpointStore, audit_check  # the runtime wheel (make runtime)

pytestmark = pytest.mark.e2e

CLUSTER = "e2etorch"
# Checkpoints stay on the shared volume (S3 copies are test_elastic's): one thing less to wait for.
NET = {"dt_cluster_name": CLUSTER, "dt_vpc_cidr": "127.81.0.0/16", "dt_subnet_cidr": "127.81.1.0/24",
       "dt_checkpoint_s3": False}
ENGINE = {"dt_engine": "torch"}
# Far more epochs than the membership changes take (~6 s an epoch with SLOW); the test then ends the
# job TAIL_EPOCHS after the epoch it reads (train.yml, restarted with a smaller --epochs, at full speed).
EPOCH_BUDGET = 2000
TAIL_EPOCHS = 20
SLOW = ["--step-sleep", "0.25"]  # stands in for a heavier model, so the changes land mid-run
LOG_LINE = re.compile(r"^(\d+) (ADDED|REMOVED|FAILED) (127\.81\.1\.\d+) (\d{19})$")
STARTED = time.time()


def _train(epochs):
    return ["--epochs", str(epochs), "--seed", "7", "--audit-samples", "--checkpoint-every", "20"]


def _boto(env, service):
    import boto3
    return boto3.client(service, endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                        aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])


def _nodes(env):
    """This run's instances by private IP (the image builder and earlier runs' instances left out)."""
    out = {}
    for r in _boto(env, "ec2").describe_instances(Filters=[
            {"Name": "tag:dynatrain:cluster", "Values": [CLUSTER]}])["Reservations"]:
        for i in r["Instances"]:
            tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
            if i["LaunchTime"].timestamp() < STARTED - 5 or tags.get("dynatrain:role") == "image-builder":
                continue
            ip = i["PrivateIpAddress"]
            if ip in out and out[ip]["launch"] > i["LaunchTime"]:
                continue  # an address re-used by a later instance: the newest one is the node
            out[ip] = dict(id=i["InstanceId"], state=i["State"]["Name"], tags=tags, launch=i["LaunchTime"],
                           image=i["ImageId"])
    return out


def _job(env):
    d = demo.Demo(argparse.Namespace(cluster=CLUSTER, subnet="", json=True, train_args=[]))
    d.env = env
    return d


def _log(job):
    lines = job.read("host_worker_log").splitlines()
    parsed = [LOG_LINE.match(line) for line in lines]
    assert all(parsed), lines
    return [(int(m.group(1)), m.group(2), m.group(3)) for m in parsed]


def _run_ok(env, name, extra):
    t0 = time.monotonic()
    rc, out = playbook(env, name, dict(NET, **extra))
    assert rc == 0, "%s failed:\n%s" % (name, out[-5000:])
    print("%s: %.0f s" % (name, time.monotonic() - t0), flush=True)
    return out


def _on_node(env, instance_id, *argv):
    return subprocess.run(["podman", "exec", instance_id, *argv], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def _change(job, field, ip):
    """The finished resizes whose ``field`` (added, removed) names ``ip``."""
    return [e for e in job.events() if e.get("event") == "resize_end" and ip in (e.get(field) or [])]


def _training_pids(env, instance_id):
    """The pids (in the node's own pid namespace, as the runtime reports them) of its processes that run
    the training script (``dt-train-digits``; the pattern is spelled so that this shell's own command line,
    which holds it, does not match it)."""
    out = _on_node(env, instance_id, "sh", "-c", "for p in /proc/[0-9]*; do tr '\\0' ' ' <$p/cmdline 2>/dev/null"
                   " | grep -q 'train[-_]digits' && echo ${p#/proc/}; done").stdout
    return {int(p) for p in out.split()}


def test_torch_engine_end_to_end(cloud):
    env = cloud
    # the torch wheels are fetched only when asked for (make setup's wheelhouse is MXNet's)
    subprocess.run([sys.executable, "-m", "localcloud", "wheelhouse", "--engine", "torch"], cwd=ROOT, env=env,
                   check=True, timeout=900)
    try:
        # bake_image: a node image for the torch engine (its recipe names the engine)
        out = _run_ok(env, "bake_image", ENGINE)
        images = _boto(env, "ec2").describe_images(Owners=["self"], Filters=[
            {"Name": "tag:dynatrain:engine", "Values": ["torch"]}])["Images"]
        assert images, out[-3000:]
        baked = {i["ImageId"] for i in images}

        _run_ok(env, "bootstrap", dict(ENGINE, worker_count=2, dt_train_script_args=_train(EPOCH_BUDGET) + SLOW))
        job = _job(env)
        efs = job.efs_dir()
        nodes = _nodes(env)
        assert {n["image"] for n in nodes.values()} <= baked, nodes
        master = [ip for ip, n in nodes.items() if n["tags"].get("dynatrain:role") == "master"][0]
        base = sorted(ip for ip, n in nodes.items() if n["tags"].get("dynatrain:group") == "base")
        assert len(base) == 2, nodes
        marker = _on_node(env, nodes[master]["id"], "cat", "/etc/dynatrain/baked.json")
        assert '"engine": "torch"' in marker.stdout and '"torch": true' in marker.stdout, marker
        job.wait_for("training to start", lambda: job.status().get("step", 0) > 0, 300)
        assert job.status()["engine"] == "torch"
        starts = [e for e in job.events() if e.get("event") == "launcher_start"]
        assert starts and starts[-1]["engine"] == "torch", starts
        assert sorted(e[1:] for e in _log(job)) == sorted(("ADDED", ip) for ip in base + [master])

        # add a worker while training, not naming the engine: the cluster's job says torch
        # (issue 41: in place, the survivors' training processes stay: their pids are read before the add)
        before = {ip: _training_pids(env, nodes[ip]["id"]) for ip in base + [master]}
        assert all(before.values()), before
        out = _run_ok(env, "add_workers", {"count": 1})
        nodes = _nodes(env)
        (added,) = [ip for ip, n in nodes.items() if n["tags"].get("dynatrain:group") == "elastic"]
        assert nodes[added]["tags"]["elastic_worker_status"] == "ADDED"
        # issue 28: a worker from the torch image is configured in one module run (the torch role's plan: venv current)
        assert task_results(out, "Apply the plans in one module run") == {added: "changed"}, out[-5000:]
        assert _log(job)[-1][1:] == ("ADDED", added)
        lock = _on_node(env, nodes[added]["id"], "ls", "/opt/dynatrain")
        assert "torch-requirements.lock" in lock.stdout.split(), lock
        assert "mxnet-requirements.lock" not in lock.stdout.split(), lock
        job.wait_for("world 4", lambda: job.status().get("world_size") == 4, 120)
        job.wait_for("the add's resize to end", lambda: _change(job, "added", added), 120)
        add = _change(job, "added", added)[-1]
        # in place: no checkpoint for the change, every survivor the same process, the joiner's state from peers
        assert add["mode"] == "in-place" and add["checkpoint_written"] is False, add
        assert all(add["pids"][ip] in before[ip] for ip in before), (add["pids"], before)
        assert add["bytes_moved"] > 0, add

        # remove the newest elastic worker
        _run_ok(env, "remove_workers", {"count": 1})
        nodes = _nodes(env)
        assert nodes[added]["tags"]["elastic_worker_status"] == "REMOVED"
        assert nodes[added]["state"] in ("shutting-down", "terminated")
        assert _log(job)[-1][1:] == ("REMOVED", added)
        assert not os.path.exists(os.path.join(efs, "prepare_data_success_" + added))
        job.wait_for("the removal's resize to end", lambda: _change(job, "removed", added), 120)
        remove = _change(job, "removed", added)[-1]
        assert remove["mode"] == "in-place" and remove["checkpoint_written"] is False, remove
        assert all(remove["pids"][ip] == add["pids"][ip] for ip in before), (remove["pids"], add["pids"])

        # kill a base worker's container outright: FAILED, the job resumes from a survivor's snapshot
        # (of a generation that trains: not one still starting after the removal, which has none yet)
        victim, drained = base
        step_removed = job.status().get("step", 0)
        job.wait_for("the job to train at world 3", lambda: job.status().get("world_size") == 3
                     and job.status().get("step", 0) >= step_removed + 5, 120)
        step_before = job.status().get("step", 0)
        subprocess.run(["podman", "kill", nodes[victim]["id"]], env=env, check=True, timeout=60)
        job.wait_for("the launcher to log FAILED", lambda: _log(job)[-1][1:] == ("FAILED", victim), 120)
        # (the status names the new generation's world and resume step before its first step: wait for the
        # resize's end, which the launcher records at that first step)
        job.wait_for("the job to go on without it", lambda: resizes(job, "failure")
                     and job.status().get("world_size") == 2 and job.status().get("step", 0) > step_before, 120)
        lost = resizes(job, "failure")
        print("worker killed -> training again: %.2f s, recovered from the %s, %s step(s) recomputed"
              % (lost[-1]["total_s"], lost[-1]["recovered_from"], lost[-1]["recomputed_steps"]), flush=True)
        assert lost[-1]["recovered_from"] in ("survivor", "in-place"), (lost[-1], [e for e in job.events() if e.get("event") in (
            "worker_failed", "resize_start", "recovery")][-4:], job.read("logs/launcher.log")[-3000:])

        # a spot notice drains the other base worker at the next step (nothing recomputed)
        subprocess.run([sys.executable, "-m", "localcloud", "interrupt", nodes[drained]["id"]],
                       cwd=ROOT, env=env, check=True, timeout=60)
        job.wait_for("the drained worker's REMOVED", lambda: _log(job)[-1][1:] == ("REMOVED", drained), 120)
        job.wait_for("the drain's resize to end", lambda: resizes(job, "drain"), 120)
        drain = resizes(job, "drain")
        assert drain and drain[-1]["recomputed_steps"] == 0, drain[-1:]
        assert job.hosts() == [master]

        # end the job TAIL_EPOCHS later at full speed: train.yml keeps the cluster's engine
        assert not job.final(), "the job finished before the last membership change"
        epochs = job.status().get("epoch", 0) + TAIL_EPOCHS
        restarted_at = time.time()
        _run_ok(env, "train", {"train_state": "restarted", "dt_train_script_args": _train(epochs)})
        final = job.wait_for("the job to finish", job.final, 600)
        restart = [e for e in job.events() if e.get("event") == "launcher_start" and e["time"] >= restarted_at]
        assert restart and restart[-1]["engine"] == "torch", restart
        assert final["epochs"] == epochs and final["val_acc"] >= 0.9, final

        # DT's log, exactly: the three members, the added worker in and out, the killed one, the drained one
        log = _log(job)
        assert [e[0] for e in log] == list(range(7)), log
        assert log[3:] == [(3, "ADDED", added), (4, "REMOVED", added), (5, "FAILED", victim), (6, "REMOVED", drained)]
        # every sample exactly once per epoch across the resizes
        meta = CheckpointStore(os.path.join(efs, "checkpoints")).latest()[1]
        assert meta["finished"]
        assert audit_check(meta["audit"], meta["num_samples"]) == []
        assert sorted(meta["audit"]["completed_epochs"]) == list(range(epochs))
        assert {r["world"] for r in meta["audit"]["steps"]} >= {1, 2, 3, 4}
        assert job.status()["engine"] == "torch"

        out = _run_ok(env, "status", {})
        assert re.search(r"job: finished\s+engine torch\s+epoch", out), out[-3000:]
    finally:
        rc, out = playbook(env, "teardown", NET)
        assert rc == 0, out[-3000:]
