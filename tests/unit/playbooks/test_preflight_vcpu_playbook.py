"""playbooks/preflight.yml's vCPU quota check (issue 12) against an in-process moto server that
answers EC2's Service Quotas like AWS (localcloud/quotas.py): the vCPUs requested (instance type
vCPUs x count) plus those running in the class must fit the quota; the failure says what to
change, nothing is created."""
from __future__ import annotations

import pytest

import test_preflight_playbook
from test_preflight_playbook import run_preflight, settings, vpc_count

from localcloud import quotas

cloud = test_preflight_playbook.cloud  # the same fixture: a moto server and an AMI for this module

STANDARD, STANDARD_SPOT = "L-1216C47A", "L-34B43A08"


@pytest.fixture(autouse=True)
def ec2_quotas():
    quotas.apply()  # the moto server runs in this process
    quotas.reset()
    yield
    quotas.reset()


def test_bootstrap_within_the_quota_passes(tmp_path, cloud):
    quotas.set_quota("ec2", STANDARD, 12)  # c5.xlarge has 4 vCPUs: master + 2 workers = 12
    rc, out = run_preflight(tmp_path, settings(cloud, worker_count=2))
    assert rc == 0, out[-3000:]
    assert f"vCPU quotas {STANDARD} cover the request" in out, out[-2000:]


def test_bootstrap_over_the_quota_says_what_to_change(tmp_path, cloud):
    quotas.set_quota("ec2", STANDARD, 8)
    before = vpc_count(cloud)
    rc, out = run_preflight(tmp_path, settings(cloud, worker_count=2))
    assert rc != 0
    for needle in ["vCPU quota too small in us-east-1",
                   "dt_master_instance_type=c5.xlarge (4 vCPUs) x 1 + dt_worker_instance_type (worker_count)"
                   "=c5.xlarge (4 vCPUs) x 2 need 12 vCPUs",
                   "'Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances' (L-1216C47A) is 8",
                   "--quota-code L-1216C47A --desired-value 12", "worker_count", "Nothing was created"]:
        assert needle in out, out[-3000:]
    assert vpc_count(cloud) == before


def test_bootstrap_counts_the_warm_pool_it_fills(tmp_path, cloud):
    quotas.set_quota("ec2", STANDARD, 12)  # master + 2 workers fit; 1 more for the pool does not
    rc, out = run_preflight(tmp_path, settings(cloud, worker_count=2, dt_warm_pool_size=1))
    assert rc != 0
    assert "dt_worker_instance_type (dt_warm_pool_size)=c5.xlarge (4 vCPUs) x 1" in out, out[-3000:]
    assert "--desired-value 16" in out, out[-3000:]


def test_the_pool_workers_that_exist_are_not_counted_again(tmp_path, cloud):
    """A re-run of bootstrap finds the pool filled (stopped: no vCPUs; running while a fill goes on:
    counted once, as the pool's), so only the master and workers count."""
    ec2 = cloud["ec2"]
    tags = [{"ResourceType": "instance", "Tags": [{"Key": "dynatrain:cluster", "Value": "pftest"},
                                                  {"Key": "dynatrain:group", "Value": "pool"}]}]
    ids = [i["InstanceId"] for i in ec2.run_instances(ImageId=cloud["image"]["ImageId"], MinCount=2, MaxCount=2,
                                                      InstanceType="c5.xlarge", TagSpecifications=tags)["Instances"]]
    try:
        ec2.stop_instances(InstanceIds=ids[:1])
        quotas.set_quota("ec2", STANDARD, 12)  # master + 2 workers; the pool of 2 exists (1 stopped, 1 running)
        rc, out = run_preflight(tmp_path, settings(cloud, worker_count=2, dt_warm_pool_size=2))
        assert rc == 0, out[-3000:]
        rc, out = run_preflight(tmp_path, settings(cloud, worker_count=2, dt_warm_pool_size=3))  # 1 more to launch
        assert rc != 0 and "dt_worker_instance_type (dt_warm_pool_size)=c5.xlarge (4 vCPUs) x 1" in out, out[-3000:]
    finally:
        ec2.terminate_instances(InstanceIds=ids)


def test_running_instances_of_the_class_count(tmp_path, cloud):
    ec2 = cloud["ec2"]
    ids = [i["InstanceId"] for i in ec2.run_instances(ImageId=cloud["image"]["ImageId"], MinCount=2, MaxCount=2,
                                                      InstanceType="m5.large")["Instances"]]  # 2 x 2 vCPUs
    try:
        quotas.set_quota("ec2", STANDARD, 14)
        rc, out = run_preflight(tmp_path, settings(cloud, worker_count=2))
        assert rc != 0
        assert "need 12 vCPUs, 4 are already running" in out and "--desired-value 16" in out, out[-3000:]
    finally:
        ec2.terminate_instances(InstanceIds=ids)


def test_add_workers_checks_the_spot_quota_of_count(tmp_path, cloud):
    quotas.set_quota("ec2", STANDARD, 4)  # on-demand: only the new spot workers count
    quotas.set_quota("ec2", STANDARD_SPOT, 8)
    extra = dict(dt_preflight_admin_cidr=False, dt_preflight_launch="add", dt_worker_market="spot")
    rc, out = run_preflight(tmp_path, settings(cloud, count=3, **extra))
    assert rc != 0
    assert "'All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests' (L-34B43A08) is 8" in out, out[-3000:]
    assert "dt_worker_instance_type (count)=c5.xlarge (4 vCPUs) x 3 need 12 vCPUs" in out
