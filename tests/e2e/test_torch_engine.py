"""Issues 26 and 43 end to end on the local cloud with the PyTorch engine (`-e dt_engine=torch`), one cluster
lifecycle, started right after the MXNet setup (the conftest's setup_wheelhouse: the wheelhouse `make setup`
leaves, none of PyTorch's wheels): bootstrap a master and two base workers -- its preflight builds PyTorch's
wheels on the controller before the first cloud call and says so, and with no torch image yet
(dt_node_image=auto, the default) it bakes one beside the running job and points the worker template at it;
then while the job trains add a worker (`add_workers -e count=1`, without naming the engine: the cluster keeps
its own; it boots the baked image, /etc/dynatrain/baked.json says so), remove it (`remove_workers -e count=1`),
kill a base worker's container (its loss is logged FAILED and the job resumes from a survivor's snapshot), and
drain the other on a spot notice (`localcloud interrupt`, nothing recomputed); end the job with `train.yml`
(again without the engine). host_worker_log holds exactly the expected lines in DT's layout, no sample is
skipped or repeated within an epoch across the resizes, accuracy >= 0.9, status.json and the launcher's events
name the torch engine, and status.yml shows it. Then the README's own-script path as typed: a torchrun script
copied to every node with `ansible`, a new job with it through train.yml, `status.yml -e plot=true`, and
teardown.yml.
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

from conftest import ROOT, demo, playbook, resizes, task_results, user_env

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


def _run_ok(env, common, name, extra):
    t0 = time.monotonic()
    rc, out = playbook(env, name, dict(common, **extra))
    assert rc == 0, "%s failed:\n%s" % (name, out[-5000:])
    print("%s: %.0f s" % (name, time.monotonic() - t0), flush=True)
    return out


def _built(out):
    """Whether a playbook's preflight ran the wheelhouse builder (its task changed, not skipped)."""
    runs = out.split("TASK [Build on the controller the engine's node wheels")[1:]
    return any("changed: [" in run.split("\nTASK [")[0] for run in runs)


def _worker_template_image(env):
    """The image the cluster's on-demand worker launch template boots (its default version)."""
    (version,) = _boto(env, "ec2").describe_launch_template_versions(
        LaunchTemplateName=CLUSTER + "-worker", Versions=["$Default"])["LaunchTemplateVersions"]
    return version["LaunchTemplateData"]["ImageId"]


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


def test_torch_engine_end_to_end(cloud, setup_wheelhouse, tmp_path):
    env = cloud
    common = dict(NET, dt_wheelhouse_controller_dir=str(setup_wheelhouse))  # every playbook's -e
    try:
        out = _run_ok(env, common, "bootstrap",
                      dict(ENGINE, worker_count=2, dt_train_script_args=_train(EPOCH_BUDGET) + SLOW))
        # issue 43: the preflight built what the engine needs, before the first cloud call, and said so
        assert _built(out), out[-5000:]
        assert out.index("Build on the controller the engine's node wheels") < out.index("Check the vCPU quotas")
        assert list(setup_wheelhouse.glob("torch-2.13.0+cpu-*.whl"))
        # dt_node_image=auto (the default), no torch image yet: the bootstrap baked one beside the running job
        # and pointed the worker launch template at it
        assert "Baked the node image" in out and "the node image bake failed" not in out, out[-5000:]
        baked = {i["ImageId"] for i in _boto(env, "ec2").describe_images(Owners=["self"], Filters=[
            {"Name": "tag:dynatrain:engine", "Values": ["torch"]}])["Images"]}
        assert _worker_template_image(env) in baked, baked
        job = _job(env)
        efs = job.efs_dir()
        nodes = _nodes(env)
        assert not {n["image"] for n in nodes.values()} & baked, nodes  # booted before the image existed
        master = [ip for ip, n in nodes.items() if n["tags"].get("dynatrain:role") == "master"][0]
        base = sorted(ip for ip, n in nodes.items() if n["tags"].get("dynatrain:group") == "base")
        assert len(base) == 2, nodes
        job.wait_for("training to start", lambda: job.status().get("step", 0) > 0, 300)
        assert job.status()["engine"] == "torch"
        starts = [e for e in job.events() if e.get("event") == "launcher_start"]
        assert starts and starts[-1]["engine"] == "torch", starts
        assert sorted(e[1:] for e in _log(job)) == sorted(("ADDED", ip) for ip in base + [master])

        # add a worker while training, not naming the engine: the cluster's job says torch
        # (issue 41: in place, the survivors' training processes stay: their pids are read before the add)
        before = {ip: _training_pids(env, nodes[ip]["id"]) for ip in base + [master]}
        assert all(before.values()), before
        out = _run_ok(env, common, "add_workers", {"count": 1})
        assert not _built(out)  # nothing to build a second time
        nodes = _nodes(env)
        (added,) = [ip for ip, n in nodes.items() if n["tags"].get("dynatrain:group") == "elastic"]
        assert nodes[added]["tags"]["elastic_worker_status"] == "ADDED"
        assert nodes[added]["image"] in baked, nodes[added]
        marker = _on_node(env, nodes[added]["id"], "cat", "/etc/dynatrain/baked.json")
        assert '"engine": "torch"' in marker.stdout and '"torch": true' in marker.stdout, marker
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
        _run_ok(env, common, "remove_workers", {"count": 1})
        nodes = _nodes(env)
        assert nodes[added]["tags"]["elastic_worker_status"] == "REMOVED"
        assert nodes[added]["state"] in ("shutting-down", "terminated")
        assert _log(job)[-1][1:] == ("REMOVED", added)
        assert not os.path.exists(os.path.join(efs, "prepare_data_success_" + added))
        job.wait_for("the removal's resize to end", lambda: _change(job, "removed", added), 120)
        remove = _change(job, "removed", added)[-1]
        assert remove["mode"] == "in-place" and remove["checkpoint_written"] is False, remove
        assert all(remove["pids"][ip] == add["pids"][ip] for ip in before), (remove["pids"], add["pids"])

        # the README's own-script path, its first half as typed while every node answers (the killed and drained
        # ones below would be unreachable): the script at one path on every node; its job runs at the end
        proc = subprocess.run(
            "ansible dt_cluster_%s -e dt_cluster_name=%s -b -m ansible.builtin.copy "
            "-a 'src=benchmarks/torch/torchrun_digits.py dest=/opt/dynatrain/scripts/ mode=0644'"
            % (CLUSTER, CLUSTER), shell=True, cwd=ROOT, env=user_env(), capture_output=True, text=True,
            timeout=300, check=False)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

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
        _run_ok(env, common, "train", {"train_state": "restarted", "dt_train_script_args": _train(epochs)})
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

        # the README's own-script path, as typed (its script copied above): a new job with it (a torchrun script,
        # unchanged), then the status with its timeline
        fresh_at = time.time()
        _run_ok(env, common, "train", {"train_fresh": True, "dt_job_name": "own",
                                       "dt_train_script": "/opt/dynatrain/scripts/torchrun_digits.py",
                                       "dt_train_script_api": "torchrun", "dt_train_script_args": "--epochs 2"})
        # (train_fresh moved the first job's status and events under runs/: these are the new job's)
        job.wait_for("the torchrun script's job to finish", lambda: job.status().get("state") == "finished" and any(
            e.get("event") == "launcher_start" and e["time"] >= fresh_at for e in job.events()), 300)
        plot = tmp_path / "timeline.png"
        out = _run_ok(env, common, "status", {"plot": True, "plot_path": str(plot)})
        assert re.search(r"job: finished\s+engine torch\s+epoch", out), out[-3000:]
        assert plot.stat().st_size > 0
    finally:
        rc, out = playbook(env, "teardown", common)
        assert rc == 0, out[-3000:]
