"""roles/fleet launch.yml: the worker market and the on-demand fallback, run with
ansible-playbook against a moto server patched by localcloud.moto_compat (no node
answers SSH here, so each launch ends in the role's clean-up: the instances it
launched are terminated; what matters is which market each was launched in)."""
import json
import os
import re
import subprocess
import sys

import boto3
import pytest
import yaml
from botocore.config import Config

from ansible_collections.dynatrain.elastic.plugins.filter.launch_error import launch_error

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from localcloud import moto_compat  # noqa: E402


@pytest.fixture(scope="module")
def cloud(moto_endpoint):
    moto_compat.apply()
    endpoint = moto_endpoint
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint, aws_access_key_id="localcloud",
                       aws_secret_access_key="localcloud", config=Config(retries={"total_max_attempts": 1}))
    data = {"ImageId": ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"], "InstanceType": "t3.micro"}
    ec2.create_launch_template(LaunchTemplateName="mkt-worker", LaunchTemplateData=data)
    ec2.create_launch_template(LaunchTemplateName="mkt-worker-spot", LaunchTemplateData=dict(data, InstanceMarketOptions={
        "MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}))
    yield endpoint, ec2
    moto_compat.set_spot_capacity(None)


def _launch(tmp_path, endpoint, count, **variables):
    play = [{
        "name": "Launch",
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "tasks": [{
            "name": "Launch workers",
            "ansible.builtin.include_role": {"name": "dynatrain.elastic.fleet", "tasks_from": "launch"},
            "vars": dict({
                "fleet_cluster_name": "mkt", "fleet_endpoint_url": endpoint, "fleet_access_key": "localcloud",
                "fleet_secret_key": "localcloud", "fleet_state_dir": str(tmp_path), "fleet_launch_count": count,
                "fleet_public_ip": False, "fleet_ssh_wait_timeout": 1,
                "fleet_launch_tags": {"test": tmp_path.name},
            }, **variables),
        }],
    }]
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump(play))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), AWS_MAX_ATTEMPTS="1")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
                           "-e", "ansible_python_interpreter=" + sys.executable, str(path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    return " ".join((proc.stdout + proc.stderr).split())  # messages are folded across lines


def _launched(ec2, tmp_path):
    found = ec2.describe_instances(Filters=[{"Name": "tag:test", "Values": [tmp_path.name]}])
    return sorted((i.get("InstanceLifecycle", "on-demand"), {t["Key"]: t["Value"] for t in i["Tags"]}["dynatrain:market"])
                  for r in found["Reservations"] for i in r["Instances"])


@pytest.fixture
def short_of_spot(monkeypatch):
    # amazon.aws.ec2_instance retries InsufficientInstanceCapacity for minutes (as against
    # AWS); the other capacity error the fallback knows is answered at once.
    monkeypatch.setattr(moto_compat, "SPOT_CAPACITY_ERROR", "MaxSpotInstanceCountExceeded")
    moto_compat.set_spot_capacity(0)
    yield
    moto_compat.set_spot_capacity(None)


def test_spot_market_launches_spot(cloud, tmp_path):
    endpoint, ec2 = cloud
    out = _launch(tmp_path, endpoint, 2, fleet_worker_market="spot")
    assert "on-demand instead" not in out
    assert _launched(ec2, tmp_path) == [("spot", "spot"), ("spot", "spot")], out[-3000:]


def test_default_market_is_on_demand(cloud, tmp_path):
    endpoint, ec2 = cloud
    out = _launch(tmp_path, endpoint, 1)
    assert _launched(ec2, tmp_path) == [("on-demand", "on-demand")], out[-3000:]
    # The request that succeeded is not counted again: its ids go to the wait, which reads them running
    # (no SSH here, so the launch ends in its rescue: the instance terminated, nothing orphaned).
    assert re.search(r"Count what the requests gave \(on-demand\)\] \** skipping", out), out[-3000:]
    assert "The new workers i-" in out and "did not become ready" in out, out[-3000:]
    # fleet_ssh_wait_timeout (1 s) ends the wait, not its count of retries (4): a scan of an address that
    # never answers takes its whole -T, so counting retries alone waited ~5x the timeout
    retried = out.count("RETRYING: [localhost]: Wait for SSH on each node")
    assert retried < 4, out[-3000:]


def test_an_on_demand_launch_waits_for_its_own_instances_only(cloud, tmp_path):
    """ec2_instance's instance_ids also lists the elastic workers that already run (its filter: the Name tag):
    only the new one is waited for, and the launch's cleanup terminates only it."""
    endpoint, ec2 = cloud
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    running = ec2.run_instances(ImageId=image, InstanceType="t3.micro", MinCount=1, MaxCount=1, TagSpecifications=[{
        "ResourceType": "instance", "Tags": [{"Key": "Name", "Value": "mkt-elastic-worker"}]}])["Instances"][0]
    out = _launch(tmp_path, endpoint, 1)
    new = [iid for iid, _state in _launched_ids(ec2, tmp_path)]
    assert len(new) == 1 and new[0] != running["InstanceId"], out[-3000:]
    assert "The new workers %s did not become ready" % new[0] in out, out[-3000:]
    state = ec2.describe_instances(InstanceIds=[running["InstanceId"]])["Reservations"][0]["Instances"][0]["State"]
    assert state["Name"] == "running"
    ec2.terminate_instances(InstanceIds=[running["InstanceId"]])


def _launched_ids(ec2, tmp_path):
    found = ec2.describe_instances(Filters=[{"Name": "tag:test", "Values": [tmp_path.name]}])
    return [(i["InstanceId"], i["State"]["Name"]) for r in found["Reservations"] for i in r["Instances"]]


def test_short_spot_capacity_falls_back_to_on_demand(cloud, tmp_path, short_of_spot):
    endpoint, ec2 = cloud
    out = _launch(tmp_path, endpoint, 2, fleet_worker_market="spot")
    assert "Spot capacity is short (MaxSpotInstanceCountExceeded: There is no Spot capacity" in out, out[-3000:]
    assert "launching 2 on-demand instead" in out
    assert _launched(ec2, tmp_path) == [("on-demand", "on-demand"), ("on-demand", "on-demand")], out[-3000:]
    # One spot request only: the others went straight to on-demand, in one request.
    assert out.count("Request the other instances (spot)") == 1
    rest = out.split("Request the other instances (spot)", 1)[1].split("TASK [", 1)[0]
    assert "skipping: [localhost]" in rest, out[-3000:]
    fallback = out.split("Request the missing instances on-demand", 1)[1].split("TASK [", 1)[0]
    assert "changed: [localhost]" in fallback and "item=" not in fallback, fallback


def test_short_spot_capacity_without_fallback_fails(cloud, tmp_path, short_of_spot):
    endpoint, ec2 = cloud
    out = _launch(tmp_path, endpoint, 1, fleet_worker_market="spot", fleet_spot_fallback="none")
    assert "No spot worker could be launched: spot capacity is short (MaxSpotInstanceCountExceeded" in out, out[-3000:]
    assert "dt_spot_fallback=none" in out
    assert _launched(ec2, tmp_path) == []


@pytest.mark.parametrize("result,expected", [
    ({"failed": True, "msg": "Failed to run instances: ...", "error": {"code": "InsufficientInstanceCapacity",
      "message": "There is no Spot capacity available that matches your request."}},
     {"code": "InsufficientInstanceCapacity",
      "text": "InsufficientInstanceCapacity: There is no Spot capacity available that matches your request."}),
    ({"failed": True, "msg": "value of count must be an int"}, {"code": "", "text": "value of count must be an int"}),
    ({"failed": True}, {"code": "", "text": "unknown error"}),
    (None, {"code": "", "text": "unknown error"}),
])
def test_launch_error(result, expected):
    assert launch_error(result) == expected


@pytest.mark.parametrize("playbook,extra", [
    ("add_workers", {"count": 1, "dt_worker_market": "reserved"}),
    ("add_workers", {"count": 1, "dt_worker_market": "spot", "dt_spot_fallback": "wait"}),
    ("reconcile", {"dt_worker_market": "Spot"}),
])
def test_playbooks_refuse_a_bad_market_before_any_cloud_call(tmp_path, playbook, extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
                           "-e", "ansible_python_interpreter=" + sys.executable, "-e", json.dumps(dict(extra, max_workers=32)),
                           "playbooks/%s.yml" % playbook], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0, out[-2000:]
    assert "dt_worker_market is spot or on-demand" in out and "Nothing was changed." in out, out[-2000:]
    # only the request checks before it ran (add_workers: count, count against max_workers; reconcile: the
    # settings check, then its own)
    assert "ok=2 changed=0" in out, out[-2000:]
