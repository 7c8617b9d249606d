"""The AWS modules' action plugins (plugins/plugin_utils/aws_action.py): the module's own run() in the
controller's process, with amazon.aws's option handling, through ansible-playbook against a moto server."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import boto3
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@pytest.fixture(scope="module")
def ec2(moto_endpoint):
    client = boto3.client("ec2", region_name="eu-west-1", endpoint_url=moto_endpoint,
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    client.endpoint = moto_endpoint
    return client


@pytest.fixture()
def instance(ec2):
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    iid = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    yield iid
    ec2.terminate_instances(InstanceIds=[iid])


def tags_of(ec2, iid):
    found = ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [iid]}])["Tags"]
    return {t["Key"]: t["Value"] for t in found}


def play(tmp_path, task, env_extra=None, check=False):
    """Run one task on the implicit localhost; returns (rc, its registered result or None, the output)."""
    book = tmp_path / "play.yml"
    book.write_text(json.dumps([{
        "hosts": "localhost", "gather_facts": False,
        "tasks": [dict(task, register="out", ignore_errors=True),
                  {"ansible.builtin.copy": {"content": "{{ out | to_json }}", "dest": str(tmp_path / "out.json")},
                   "check_mode": False}],
    }]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(CREDS, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), AWS_EC2_METADATA_DISABLED="true",
               AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"))
    env.update(env_extra or {})
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
                           "-c", "local",
                           "-e", "ansible_python_interpreter=" + sys.executable, str(book)] + (["--check"] if check else []),
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    out = tmp_path / "out.json"
    return proc.returncode, json.loads(out.read_text()) if out.exists() else None, proc.stdout + proc.stderr


def test_tags_in_the_controller_process_with_the_modules_options(tmp_path, ec2, instance):
    rc, out, log = play(tmp_path, {"dynatrain.elastic.ec2_tags": {
        "resources": [instance], "tags": {"dynatrain:status": "ADDED"}, "stamp": "dynatrain:status-time",
        "region": "eu-west-1", "endpoint_url": ec2.endpoint}})
    assert rc == 0 and out and not out.get("failed"), log[-3000:]
    assert out["changed"] is True and out["changed_resources"] == [instance]
    assert tags_of(ec2, instance)["dynatrain:status"] == "ADDED"
    assert tags_of(ec2, instance)["dynatrain:status-time"].isdigit()
    # the same again: nothing to change
    rc, out, log = play(tmp_path, {"dynatrain.elastic.ec2_tags": {
        "resources": [instance], "tags": {"dynatrain:status": "ADDED"}, "region": "eu-west-1",
        "endpoint_url": ec2.endpoint}})
    assert rc == 0 and out["changed"] is False, log[-3000:]


def test_amazon_aws_aliases_and_environment_fallbacks_are_honoured(tmp_path, ec2, instance):
    """aws_region / aws_endpoint_url are the module's aliases; the credentials and the region come from the
    environment as a module run would read them."""
    rc, out, log = play(tmp_path, {"dynatrain.elastic.ec2_tags": {
        "resources": [instance], "tags": {"a": "1"}, "aws_endpoint_url": ec2.endpoint}},
        env_extra={"AWS_REGION": "eu-west-1"})
    assert rc == 0 and out["changed"] is True, log[-3000:]
    assert tags_of(ec2, instance)["a"] == "1"


def test_check_mode_changes_nothing_and_says_what_would_change(tmp_path, ec2, instance):
    rc, out, log = play(tmp_path, {"dynatrain.elastic.ec2_tags": {
        "resources": [instance], "tags": {"b": "2"}, "region": "eu-west-1", "endpoint_url": ec2.endpoint}},
        check=True)
    assert rc == 0 and out["changed"] is True and out["changed_resources"] == [instance], log[-3000:]
    assert "b" not in tags_of(ec2, instance)


def test_an_aws_error_fails_the_task_with_the_modules_message(tmp_path, ec2):
    rc, out, log = play(tmp_path, {"dynatrain.elastic.ec2_tags": {
        "resources": ["nonsense"], "tags": {"c": "3"}, "region": "eu-west-1",
        "endpoint_url": ec2.endpoint}})
    assert out["failed"] is True, log[-3000:]
    assert out["msg"].startswith("Could not tag nonsense: "), out["msg"]
    assert "InvalidID" in out["msg"], out["msg"]
    # AWS's answer as amazon.aws's fail_json_aws puts it (filter launch_error reads the code there)
    assert out["error"]["code"].startswith("InvalidID"), out


def test_partial_credentials_are_said_and_never_shown(tmp_path, ec2, instance):
    rc, out, log = play(tmp_path, {"dynatrain.elastic.ec2_tags": {
        "resources": [instance], "tags": {"c": "3"}, "region": "eu-west-1", "endpoint_url": ec2.endpoint,
        "secret_key": ""}}, env_extra={"AWS_SECRET_ACCESS_KEY": ""})
    assert out["failed"] is True and "missing: aws_secret_access_key" in out["msg"], log[-3000:]
    assert "testing" not in json.dumps(out)  # the access key is not in the result


def test_a_bad_argument_is_refused_as_the_module_refuses_it(tmp_path, ec2, instance):
    rc, out, log = play(tmp_path, {"dynatrain.elastic.ec2_tags": {
        "resources": [instance], "tags": {"d": "4"}, "region": "eu-west-1", "endpoint_url": ec2.endpoint,
        "no_such_option": 1}})
    assert out["failed"] is True and "no_such_option" in out["msg"], log[-3000:]
    rc, out, log = play(tmp_path, {"dynatrain.elastic.ec2_tags": {
        "tags": {"d": "4"}, "region": "eu-west-1", "endpoint_url": ec2.endpoint}})
    assert out["failed"] is True and "resources" in out["msg"], log[-3000:]
    assert "d" not in tags_of(ec2, instance)


def test_no_region_says_so(tmp_path, ec2, instance):
    rc, out, log = play(tmp_path, {"dynatrain.elastic.ec2_tags": {
        "resources": [instance], "tags": {"e": "5"}, "endpoint_url": ec2.endpoint}})
    assert out["failed"] is True and "requires a region" in out["msg"], log[-3000:]


def test_the_other_aws_modules_run_as_actions_too(tmp_path, ec2, instance):
    """Each AWS module of the collection has its action (plugins/action/<module>.py): read-only ones here."""
    where = {"region": "eu-west-1", "endpoint_url": ec2.endpoint}
    rc, out, log = play(tmp_path, {"dynatrain.elastic.ec2_status_checks": dict(where, instance_ids=[instance])})
    assert rc == 0 and not out.get("failed"), log[-3000:]
    assert [i["instance_id"] for i in out["instances"]] == [instance] and out["impaired"] == []
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIXvtQ4r0J2Jb1J7Q6s3QZkq9fYyq6p2J0Sg7w6l0w2x"
    node = {"instance_id": instance, "address": "10.0.0.9", "key": key}
    rc, out, log = play(tmp_path, {"dynatrain.elastic.host_key_check": dict(where, nodes=[node])})
    assert rc == 0 and out["sources"] == {instance: "first-use"}, log[-3000:]  # moto's console prints no keys
    rc, out, log = play(tmp_path, {"dynatrain.elastic.host_key_check": dict(where, nodes=[node], require_console=True)})
    assert out["failed"] is True and out["msg"].startswith("Refusing to pin host keys: " + instance), log[-3000:]
    rc, out, log = play(tmp_path, {"dynatrain.elastic.preflight_az": dict(where, instance_types=["c5.xlarge"])})
    assert rc == 0 and out["availability_zone"].startswith("eu-west-1"), log[-3000:]
    rc, out, log = play(tmp_path, {"dynatrain.elastic.preflight_az": dict(where, instance_types=[""])})
    assert out["failed"] is True and "instance_types is empty" in out["msg"], log[-3000:]


def test_a_launch_from_a_template_is_tagged_waited_for_and_a_refusal_names_its_code(tmp_path, ec2):
    """ec2_launch (issue 43): one RunInstances from the launch template, the tags on the instances and their
    volumes, IMDSv2 required, and back only once they run; a refused request fails with EC2's code, launching
    nothing."""
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    name = "launchtest-worker"
    ec2.create_launch_template(LaunchTemplateName=name,
                               LaunchTemplateData={"ImageId": image, "InstanceType": "t3.micro"})
    try:
        rc, out, log = play(tmp_path, {"dynatrain.elastic.ec2_launch": {
            "launch_template": name, "count": 2, "tags": {"dynatrain:launch-token": "tok1", "k": "v"},
            "poll": 0.1, "region": "eu-west-1", "endpoint_url": ec2.endpoint}})
        assert rc == 0 and out and not out.get("failed"), log[-3000:]
        ids = out["instance_ids"]
        assert len(ids) == 2 and out["not_running"] == [] and sorted(i["instance_id"] for i in out["instances"]) == sorted(ids)
        assert all(i["state"]["name"] == "running" and i["tags"]["k"] == "v" for i in out["instances"]), out
        found = ec2.describe_instances(Filters=[{"Name": "tag:dynatrain:launch-token", "Values": ["tok1"]}])
        instances = [i for r in found["Reservations"] for i in r["Instances"]]
        assert sorted(i["InstanceId"] for i in instances) == sorted(ids)
        assert all(i["MetadataOptions"]["HttpTokens"] == "required" for i in instances)
        volumes = [m["Ebs"]["VolumeId"] for i in instances for m in i.get("BlockDeviceMappings", [])]
        assert volumes and all(tags_of(ec2, v).get("k") == "v" for v in volumes)
    finally:
        ec2.delete_launch_template(LaunchTemplateName=name)
        gone = ec2.describe_instances(Filters=[{"Name": "tag:dynatrain:launch-token", "Values": ["tok1"]}])
        ec2.terminate_instances(InstanceIds=[i["InstanceId"] for r in gone["Reservations"] for i in r["Instances"]])
    rc, out, log = play(tmp_path, {"dynatrain.elastic.ec2_launch": {
        "launch_template": "no-such-template", "count": 1, "tags": {"dynatrain:launch-token": "tok2"},
        "region": "eu-west-1", "endpoint_url": ec2.endpoint}})
    assert out["failed"] is True and "no-such-template" in out["msg"], log[-3000:]
    assert out["error"]["code"], out
    found = ec2.describe_instances(Filters=[{"Name": "tag:dynatrain:launch-token", "Values": ["tok2"]}])
    assert found["Reservations"] == []
