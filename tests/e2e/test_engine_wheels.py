"""Issue 43, "the first hour": every engine works right after `make setup` / `make demo`, and an engine whose
node wheels the controller lacks is refused, or made ready, before any resource exists.

Both tests run on a wheelhouse as `make setup` leaves it (MXNet's wheels and the node runtime, none of
PyTorch's; a copy made of hard links, so the checkout's own wheelhouse -- which test_torch_engine fills --
is never changed), named with -e dt_wheelhouse_controller_dir.

- test_missing_engine_wheel_refused_before_any_resource: `bootstrap.yml -e dt_engine=torch` with on-demand
  building off (dt_wheelhouse_build=false, as where no builder is at hand) is refused with the command that
  builds the wheels, and the local cloud holds exactly the resources it held before (no bootstrap runs).
- test_torch_right_after_the_mxnet_setup: the torch flow of the issue as typed -- bootstrap,
  add_workers -e count=1, remove_workers -e count=1, the README's own-script path (a torchrun script copied
  to every node with `ansible`, a new job with it through train.yml), status.yml -e plot=true,
  teardown.yml -- where bootstrap's preflight builds PyTorch's wheels on demand (seconds: make setup has its
  CPU wheel on disk) and says so.

Its own clusters and loopback network (127.84.0.0/16), apart from the other e2e modules'."""
import argparse
import os
import re
import shutil
import subprocess
import time

import pytest

from conftest import ROOT, demo, playbook, user_env

pytestmark = pytest.mark.e2e

NET = {"dt_vpc_cidr": "127.84.0.0/16", "dt_subnet_cidr": "127.84.1.0/24", "dt_checkpoint_s3": False}
TORCH_ONLY = os.path.join(ROOT, "requirements-node-torch.txt")
SETUP_ONLY = os.path.join(ROOT, "requirements-node.txt")


def _projects(req_file):
    with open(req_file, encoding="utf-8") as fh:
        return {re.sub(r"[-_.]+", "_", m.group(1)).lower() for m in
                (re.match(r"^([A-Za-z0-9_.\-]+)==", line.split("#", 1)[0].strip()) for line in fh) if m}


@pytest.fixture
def setup_wheelhouse(tmp_path):
    """The wheelhouse `make setup` leaves: the checkout's, less the wheels only PyTorch needs."""
    source = os.path.join(ROOT, ".localcloud", "wheelhouse")
    torch_only = _projects(TORCH_ONLY) - _projects(SETUP_ONLY)
    dest = tmp_path / "wheelhouse"
    dest.mkdir()
    for name in os.listdir(source):
        if name.endswith(".whl") and re.sub(r"[-_.]+", "_", name.split("-", 1)[0]).lower() not in torch_only:
            try:
                os.link(os.path.join(source, name), dest / name)
            except OSError:  # another file system than the checkout's
                shutil.copy2(os.path.join(source, name), dest / name)
    assert not list(dest.glob("torch-*.whl"))
    assert list(dest.glob("mxnet-*.whl")) and list(dest.glob("dynatrain_runtime-*.whl"))
    return dest


def _built(out):
    """Whether a playbook's preflight ran the wheelhouse builder (its task changed, not skipped)."""
    runs = out.split("TASK [Build on the controller the engine's node wheels")[1:]
    return any("changed: [" in run.split("\nTASK [")[0] for run in runs)


def _cloud(env):
    """A demo.Demo without a cluster of its own: its boto clients on the local cloud of ``env``."""
    job = demo.Demo.__new__(demo.Demo)
    job.env = env
    return job


def _ec2(env):
    return _cloud(env).boto("ec2")


def _worker_template_image(env, cluster):
    """The image the cluster's on-demand worker launch template boots (its default version)."""
    (version,) = _ec2(env).describe_launch_template_versions(LaunchTemplateName=cluster + "-worker",
                                                             Versions=["$Default"])["LaunchTemplateVersions"]
    return version["LaunchTemplateData"]["ImageId"]


def _master_image(env, cluster):
    """The image the cluster's master booted (the base image when no node image existed at the bootstrap)."""
    (master,) = [i for r in _ec2(env).describe_instances(Filters=[
        {"Name": "tag:Name", "Values": [cluster + "-master"]},
        {"Name": "instance-state-name", "Values": ["running"]}])["Reservations"] for i in r["Instances"]]
    return master["ImageId"]


def _resources(env):
    """What a bootstrap creates, counted across the local cloud."""
    job = _cloud(env)
    ec2, efs, iam = job.boto("ec2"), job.boto("efs"), job.boto("iam")
    live = [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] not in ("terminated", "shutting-down")]
    return {
        "instances": len(live),
        "vpcs": len(ec2.describe_vpcs()["Vpcs"]),
        "subnets": len(ec2.describe_subnets()["Subnets"]),
        "security_groups": len(ec2.describe_security_groups()["SecurityGroups"]),
        "key_pairs": len(ec2.describe_key_pairs()["KeyPairs"]),
        "launch_templates": len(ec2.describe_launch_templates()["LaunchTemplates"]),
        "file_systems": len(efs.describe_file_systems()["FileSystems"]),
        "roles": len(iam.list_roles()["Roles"]),
    }


def test_missing_engine_wheel_refused_before_any_resource(cloud, setup_wheelhouse):
    before = _resources(cloud)
    rc, out = playbook(cloud, "bootstrap", dict(NET, dt_cluster_name="e2ewheels", dt_engine="torch",
                                                dt_wheelhouse_controller_dir=str(setup_wheelhouse),
                                                dt_wheelhouse_build=False))
    assert rc != 0, out[-3000:]
    text = " ".join(out.split())
    assert "lacks torch==2.13.0+cpu" in text, text[-3000:]
    assert "-m localcloud wheelhouse --engine torch --dest %s" % setup_wheelhouse in text
    assert "Nothing was created" in text
    assert _resources(cloud) == before
    assert not list(setup_wheelhouse.glob("torch-*.whl"))


def test_torch_right_after_the_mxnet_setup(cloud, setup_wheelhouse, tmp_path):
    base = dict(NET, dt_cluster_name="e2etorchsetup", dt_wheelhouse_controller_dir=str(setup_wheelhouse))
    t0 = time.monotonic()
    rc, out = playbook(cloud, "bootstrap", dict(base, dt_engine="torch", worker_count=1,
                                                dt_train_script_args=["--epochs", "2000", "--step-sleep", "0.25"]))
    assert rc == 0, out[-5000:]
    # the preflight built what the engine needs, before the first cloud call, and said so
    assert _built(out), out[-5000:]
    assert out.index("Build on the controller the engine's node wheels") < out.index("Check the vCPU quotas")
    assert list(setup_wheelhouse.glob("torch-2.13.0+cpu-*.whl"))
    print("bootstrap (torch, wheels built on demand): %.0f s" % (time.monotonic() - t0), flush=True)
    # dt_node_image=auto (the default), no torch image yet: the bootstrap baked one beside the running job and
    # pointed the worker launch template at it (its rewrite never reaches the checkpoint bucket or the network)
    assert "Baked the node image" in out and "the node image bake failed" not in out, out[-5000:]
    assert _worker_template_image(cloud, base["dt_cluster_name"]) != _master_image(cloud, base["dt_cluster_name"])
    for name, extra in (("add_workers", {"count": 1}), ("remove_workers", {"count": 1})):
        rc, out = playbook(cloud, name, dict(base, **extra))
        assert rc == 0, "%s failed:\n%s" % (name, out[-5000:])
        assert not _built(out)  # nothing to build a second time
    # the README's own-script path, as typed: the script at one path on every node, then a new job with it
    # (a torchrun script, unchanged)
    proc = subprocess.run(
        "ansible dt_cluster_%s -e dt_cluster_name=%s -b -m ansible.builtin.copy "
        "-a 'src=benchmarks/torch/torchrun_digits.py dest=/opt/dynatrain/scripts/ mode=0644'"
        % (base["dt_cluster_name"], base["dt_cluster_name"]), shell=True, cwd=ROOT, env=user_env(),
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rc, out = playbook(cloud, "train", dict(base, train_fresh=True, dt_job_name="own",
                                            dt_train_script="/opt/dynatrain/scripts/torchrun_digits.py",
                                            dt_train_script_api="torchrun", dt_train_script_args="--epochs 2"))
    assert rc == 0, out[-5000:]
    job = demo.Demo(argparse.Namespace(cluster=base["dt_cluster_name"], subnet="", json=True, train_args=[]))
    job.env = cloud
    job.wait_for("the torchrun script's job to finish", lambda: job.status().get("state") == "finished", 300)
    plot = tmp_path / "timeline.png"
    rc, out = playbook(cloud, "status", dict(base, plot=True, plot_path=str(plot)))
    assert rc == 0, out[-5000:]
    assert "torch" in out
    assert plot.stat().st_size > 0
    rc, out = playbook(cloud, "teardown", base, timeout=600)
    assert rc == 0, out[-5000:]
