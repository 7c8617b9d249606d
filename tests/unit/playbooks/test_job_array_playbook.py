"""playbooks/job_array.yml against an in-process moto server (no nodes): a bad manifest creates nothing and says
what to change; regions without capacity fail their rows clearly while the other rows go on (each row runs
run_job.yml: bootstrap fails in preflight, teardown runs anyway), array.json records every row, the play fails
naming them; status.yml -e array=NAME prints the array's table."""
from __future__ import annotations

import json
import os
import sys
import uuid

import boto3
import pytest

from localcloud import quotas
from playbook_run import ROOT, local_inventory, output, playbook_env, run_playbook

STANDARD = "L-1216C47A"


@pytest.fixture(scope="module")
def cloud(moto_endpoint):
    """The moto server, and an AMI of our own in us-west-2 only (eu-west-1 has none)."""
    name = "debian-12-amd64-jatest-" + uuid.uuid4().hex[:8]
    ec2 = boto3.client("ec2", region_name="us-west-2", endpoint_url=moto_endpoint,
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    stock = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    instance = ec2.run_instances(ImageId=stock, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    image = ec2.create_image(InstanceId=instance, Name=name)["ImageId"]
    ec2.terminate_instances(InstanceIds=[instance])
    quotas.apply()  # the moto server runs in this process
    quotas.reset()
    quotas.set_quota("ec2", STANDARD, 0, region="us-west-2")  # no vCPUs there; every other region has them
    yield {"url": moto_endpoint, "ami_name": name, "ami": image}
    quotas.reset()


@pytest.fixture
def inventory(tmp_path, cloud):
    """The local inventory's settings as a static inventory, pointed at the moto server and this test's AMI."""
    return local_inventory(tmp_path / "inventory.yml", {"localhost": {"ansible_connection": "local"}},
                           dt_aws_endpoint_url=cloud["url"], dt_ami_name=cloud["ami_name"],
                           dt_state_dir=str(tmp_path / "state"), ansible_python_interpreter=sys.executable)


def run(tmp_path, inventory, playbook, *extra):
    proc = run_playbook(inventory, playbook, *extra, env=playbook_env(tmp_path, credentials=True), cwd=tmp_path,
                        timeout=600)
    return proc.returncode, output(proc)


def vpcs(cloud, region):
    ec2 = boto3.client("ec2", region_name=region, endpoint_url=cloud["url"],
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    return sorted(v["CidrBlock"] for v in ec2.describe_vpcs()["Vpcs"])


def test_a_bad_manifest_creates_nothing_and_names_each_problem(tmp_path, inventory, cloud):
    (tmp_path / "bad jobs.csv").write_text("region,name,workers,args\nus-west-2,a,1,\nEU,a,many,--x 'y\n")
    before = vpcs(cloud, "us-west-2")
    rc, out = run(tmp_path, inventory, os.path.join(ROOT, "job_array.yml"), "-e", json.dumps({"manifest": "bad jobs.csv"}))
    assert rc != 0
    for needle in ["The manifest bad jobs.csv has 4 problem(s); nothing was created:",
                   "- line 3 (name 'a'): region 'EU' is not a region name",
                   "- line 3 (name 'a'): workers 'many' is not valid",
                   "- line 3 (name 'a'): args '--x 'y' cannot be split like a shell line",
                   "- line 3 (name 'a'): the name is used on line 2 too"]:
        assert needle in out, out[-3000:]
    assert not (tmp_path / "state" / "arrays").exists()
    assert vpcs(cloud, "us-west-2") == before


def test_regions_without_capacity_fail_their_rows_and_the_rest_go_on(tmp_path, inventory, cloud):
    (tmp_path / "Capacity.csv").write_text(
        "region,name,workers,args\n"
        "us-west-2,nocpu,1,--epochs 2\n"      # the region's vCPU quota is 0
        "eu-west-1,noami,0,\n"                # the AMI is not in that region
        "us-west-2,second,1,--epochs 2\n")    # the region's next row runs after the first failed
    rc, out = run(tmp_path, inventory, os.path.join(ROOT, "playbooks", "job_array.yml"),
                  "-e", "manifest=Capacity.csv", "-e", "max_parallel=1",
                  "-e", json.dumps({"array_vars": {"dt_resize_at": "epoch"}}))
    assert rc != 0, out[-3000:]
    adir = tmp_path / "state" / "arrays" / "capacity"  # the manifest's stem, sanitised
    doc = json.loads((adir / "array.json").read_text())
    rows = {r["name"]: r for r in doc["rows"]}
    assert [r["state"] for r in doc["rows"]] == ["failed", "failed", "failed"], out[-3000:]
    assert doc["ended"] and all(r["started"] and r["ended"] and r["duration_s"] is not None for r in doc["rows"])
    for name in ("nocpu", "second"):
        assert rows[name]["error"].startswith("bootstrap failed: vCPU quota too small in us-west-2")
        assert f"(full output {adir}/{name}.bootstrap.log)" in rows[name]["error"]
    assert rows["noami"]["error"].startswith("bootstrap failed: No AMI named "
                                             f"{cloud['ami_name']} owned by 123456789012")
    assert "is not available in region eu-west-1" in rows["noami"]["error"]
    assert not any("teardown failed" in r["error"] for r in doc["rows"])  # the teardown ran, and worked
    # us-west-2 ran its rows one after the other (max_parallel=1)
    assert rows["nocpu"]["ended"] <= rows["second"]["started"]
    # each row: its settings (the row's own network, the array's vars), its log with the nested runs' lines
    settings = json.loads((adir / "rows" / "second.json").read_text())
    assert (settings["dt_cluster_name"], settings["dt_region"], settings["worker_count"]) == ("capacity-second", "us-west-2", 1)
    assert (settings["dt_vpc_cidr"], settings["dt_subnet_cidr"]) == ("127.80.0.0/16", "127.80.1.0/24")
    assert settings["dt_train_script_args"] == ["--epochs", "2"] and settings["dt_resize_at"] == "epoch"
    assert "dt_train_script_args" not in json.loads((adir / "rows" / "noami.json").read_text())
    log = (adir / "nocpu.log").read_text()
    assert "-- play: Run one job on a cluster of its own" in log and "-- play: Tear down the cluster" in log
    assert (adir / "nocpu.teardown.log").exists() and (adir / "nocpu.full.log").exists()
    # the summary and the failure name every failed row
    assert "array capacity: 3 jobs (3 failed)" in out
    assert "3 of 3 jobs of array capacity failed: nocpu (us-west-2: bootstrap failed" in out
    assert "127.79.0.0/16" not in vpcs(cloud, "eu-west-1")  # nothing was created for the failed rows

    # status.yml -e array=NAME shows the same table, and no cluster
    rc, out = run(tmp_path, inventory, os.path.join(ROOT, "status.yml"), "-e", "array=capacity")
    assert rc == 0, out[-3000:]
    table = out[out.index("JOB "):].splitlines()
    assert table[0].split()[:5] == ["JOB", "REGION", "CLUSTER", "STATE", "TIME"]
    assert [line.split()[:4] for line in table[1:4]] == [["nocpu", "us-west-2", "capacity-nocpu", "failed"],
                                                         ["noami", "eu-west-1", "capacity-noami", "failed"],
                                                         ["second", "us-west-2", "capacity-second", "failed"]]
    assert "ERROR: bootstrap failed: No AMI named" in table[2]
    assert table[4].strip().startswith("array capacity: 3 jobs (3 failed); wall time ")
    assert "Select the cluster's nodes" not in out

    rc, out = run(tmp_path, inventory, os.path.join(ROOT, "status.yml"), "-e", "array=nothere")
    assert rc != 0 and "no job array was run under that name" in out


def test_an_array_that_is_running_is_not_started_again(tmp_path, inventory):
    (tmp_path / "jobs.csv").write_text("region,name,workers,args\nus-west-2,a,1,\n")
    adir = tmp_path / "state" / "arrays" / "jobs"
    adir.mkdir(parents=True)
    running = {"array": "jobs", "ended": None, "rows": [
        {"name": "a", "region": "us-west-2", "cluster": "jobs-a", "state": "running"},
        {"name": "b", "region": "us-east-1", "cluster": "jobs-b", "state": "finished"}]}
    (adir / "array.json").write_text(json.dumps(running))
    rc, out = run(tmp_path, inventory, os.path.join(ROOT, "job_array.yml"), "-e", "manifest=jobs.csv")
    assert rc != 0
    assert "Array jobs is running already (its jobs a are running or queued in" in " ".join(out.split())
    assert json.loads((adir / "array.json").read_text()) == running and not (adir / "rows").exists()
