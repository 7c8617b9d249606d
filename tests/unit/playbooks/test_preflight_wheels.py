"""playbooks/preflight.yml's engine wheels (tasks/engine_wheels.yml): an engine whose node wheels the
controller's wheelhouse lacks is built (where the checkout's builder is) or refused with the command,
before the first cloud call -- never after the resources exist (issue 43).

"Before the first cloud call" is shown with an endpoint nothing listens on: a check placed after the
first AWS call would fail on the credentials (preflight_vcpu's sts call) instead of on the wheels."""
from __future__ import annotations

import json
import os
import socket
import sys
import zipfile

import boto3
import pytest

from playbook_run import CREDENTIALS, ROOT, flat_output, playbook_env, run_playbook

PLAYBOOK = os.path.join(ROOT, "playbooks", "preflight.yml")
TORCH_WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
MXNET_WHEEL = "mxnet-1.9.1-py3-none-manylinux2014_x86_64.whl"
NO_CREDENTIALS = "No usable AWS credentials"

# A stand-in for `python -m localcloud wheelhouse`: records its arguments, then fills --dest (or
# fails when the FAIL file exists).
FAKE_BUILDER = '''
import json, os, sys, zipfile
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "argv.json"), "w") as f:
    json.dump(sys.argv[1:], f)
if os.path.exists(os.path.join(here, "FAIL")):
    sys.exit("wheelhouse: no network here")
dest = sys.argv[sys.argv.index("--dest") + 1]
with zipfile.ZipFile(os.path.join(dest, %r), "w") as z:
    z.writestr("torch-2.13.0+cpu.dist-info/METADATA", "Name: torch\\nVersion: 2.13.0+cpu\\n")
''' % TORCH_WHEEL


def wheel(directory, filename, name, version):
    with zipfile.ZipFile(os.path.join(directory, filename), "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", f"Name: {name}\nVersion: {version}\n")


@pytest.fixture
def wheelhouse(tmp_path):
    """A wheelhouse as `make setup` leaves it: MXNet's wheels, none of PyTorch's."""
    path = tmp_path / "wheelhouse"
    path.mkdir()
    wheel(path, MXNET_WHEEL, "mxnet", "1.9.1")
    return path


@pytest.fixture
def checkout(tmp_path):
    """A checkout with the wheelhouse builder (localcloud/__main__.py)."""
    path = tmp_path / "checkout"
    (path / "localcloud").mkdir(parents=True)
    (path / "localcloud" / "__main__.py").write_text(FAKE_BUILDER)
    return path


def dead_endpoint():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "http://127.0.0.1:%d" % s.getsockname()[1]


def run_preflight(tmp_path, variables, inventory_vars=None):
    path = tmp_path / "vars.json"
    path.write_text(json.dumps(variables))
    # localhost stays implicit; inventory_vars: settings from the inventory (not typed with -e)
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"all": {"vars": inventory_vars or {}}}))
    proc = run_playbook(inventory, PLAYBOOK, "-e", "@" + str(path),
                        env=playbook_env(tmp_path, credentials=True, AWS_MAX_ATTEMPTS="1"))
    return proc.returncode, flat_output(proc)


def settings(endpoint, wheelhouse, **overrides):
    base = {
        "dt_cluster_name": "pfwheels",
        "dt_region": "us-east-1",
        "dt_aws_endpoint_url": endpoint,
        "dt_admin_cidr": "203.0.113.7/32",
        "dt_master_instance_type": "c5.xlarge",
        "dt_worker_instance_type": "c5.xlarge",
        "dt_wheelhouse_controller_dir": str(wheelhouse),
    }
    base.update(overrides)
    return base


def test_torch_without_its_wheels_is_refused_before_any_cloud_call(tmp_path, wheelhouse):
    rc, out = run_preflight(tmp_path, settings(dead_endpoint(), wheelhouse, dt_engine="torch"))
    assert rc != 0
    assert "lacks torch==2.13.0+cpu (wheels for Python 3.11 x86_64 in the wheelhouse: none)" in out, out[-3000:]
    # no builder at hand (an installed collection): the command that fetches them, exactly
    assert "pip download --only-binary=:all: --implementation cp --python-version 3.11" in out, out[-3000:]
    assert f"-d {wheelhouse} --extra-index-url https://download.pytorch.org/whl/cpu torch==2.13.0+cpu" in out
    assert "Nothing was created" in out
    assert NO_CREDENTIALS not in out  # refused before preflight's first AWS call


def test_the_engine_with_its_wheels_goes_on_to_the_cloud_checks(tmp_path, wheelhouse):
    """The check passes for MXNet (make setup's wheelhouse): preflight goes on to its first AWS call,
    which fails here on the dead endpoint -- so the refusal above comes from the wheels, before it."""
    rc, out = run_preflight(tmp_path, settings(dead_endpoint(), wheelhouse))
    assert rc != 0
    assert NO_CREDENTIALS in out, out[-3000:]
    assert "the nodes install offline from" not in out


def test_refused_with_the_builder_command_when_building_fails(tmp_path, wheelhouse, checkout):
    (checkout / "localcloud" / "FAIL").write_text("")
    rc, out = run_preflight(tmp_path, settings(dead_endpoint(), wheelhouse, dt_engine="torch",
                                               dt_checkout_dir=str(checkout)))
    assert rc != 0
    assert "Building them failed (rc 1): wheelhouse: no network here" in out, out[-3000:]
    assert f"cd {checkout} && {sys.executable} -m localcloud wheelhouse --engine torch --dest {wheelhouse}" in out
    assert NO_CREDENTIALS not in out


def test_gpu_wheels_are_not_built_on_demand(tmp_path, wheelhouse, checkout):
    """auto builds the CPU wheels only: the CUDA builds are several GB, the user asks for them."""
    rc, out = run_preflight(tmp_path, settings(dead_endpoint(), wheelhouse, dt_engine="torch",
                                               dt_worker_instance_type="g5.xlarge",
                                               dt_master_instance_type="g5.xlarge", dt_checkout_dir=str(checkout)))
    assert rc != 0
    assert not (checkout / "localcloud" / "argv.json").exists()
    assert "-m localcloud wheelhouse --engine torch --gpu --dest" in out, out[-3000:]
    assert "several GB" in out
    assert NO_CREDENTIALS not in out


def test_built_on_demand_then_preflight_passes(tmp_path, wheelhouse, checkout, moto_endpoint):
    """With the checkout's builder at hand the wheels are built (a progress line says so) and preflight
    goes on; nothing is created in the cloud."""
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_endpoint,
                       **{k.lower(): v for k, v in CREDENTIALS.items()})
    stock = ec2.describe_images(Owners=["amazon"])["Images"][0]
    before = len(ec2.describe_vpcs()["Vpcs"]) + len(ec2.describe_instances()["Reservations"])
    rc, out = run_preflight(tmp_path, settings(moto_endpoint, wheelhouse, dt_engine="torch",
                                               dt_checkout_dir=str(checkout), dt_ami_id=stock["ImageId"]))
    assert rc == 0, out[-3000:]
    argv = json.loads((checkout / "localcloud" / "argv.json").read_text())
    assert argv == ["wheelhouse", "--engine", "torch", "--dest", str(wheelhouse)]
    assert (wheelhouse / TORCH_WHEEL).exists()
    assert "Build on the controller the engine's node wheels its wheelhouse lacks" in out
    assert "Preflight passed" in out
    after = len(ec2.describe_vpcs()["Vpcs"]) + len(ec2.describe_instances()["Reservations"])
    assert after == before


def test_an_untyped_engine_is_left_to_the_cluster_engine_check(tmp_path, wheelhouse):
    """bootstrap and add_workers take the engine of the cluster's job when dt_engine is not typed: preflight
    does not refuse the inventory's engine (the cluster may train with another): tasks/cluster_engine.yml
    looks again, and refuses, once it knows the engine."""
    variables = settings(dead_endpoint(), wheelhouse, _dt_settings_engine_from_cluster=True)
    rc, out = run_preflight(tmp_path, variables, inventory_vars={"dt_engine": "torch"})
    assert rc != 0
    assert NO_CREDENTIALS in out, out[-3000:]  # it went on to the first AWS call
    assert "the nodes install offline from" not in out
    # typed with -e, the same engine is refused at once
    rc, out = run_preflight(tmp_path, dict(variables, dt_engine="torch"))
    assert "lacks torch==2.13.0+cpu" in out, out[-3000:]
    assert NO_CREDENTIALS not in out


def test_building_off_refuses_with_the_command_though_the_builder_is_there(tmp_path, wheelhouse, checkout):
    """dt_wheelhouse_build=false: nothing is built (the e2e's refusal runs so on the checkout)."""
    rc, out = run_preflight(tmp_path, settings(dead_endpoint(), wheelhouse, dt_engine="torch",
                                               dt_checkout_dir=str(checkout), dt_wheelhouse_build=False))
    assert rc != 0
    assert not (checkout / "localcloud" / "argv.json").exists()
    assert f"cd {checkout} && {sys.executable} -m localcloud wheelhouse --engine torch --dest {wheelhouse}" in out
    assert NO_CREDENTIALS not in out
