"""playbooks/teardown.yml when the final save fails (issue 24, defect 9): the shared volume holds the job's
newest checkpoints, so nothing is deleted and the play says what to do, unless -e teardown_force=true.
Against an in-process moto server (patched by localcloud.moto_compat) holding the cluster's EFS; the master is
this machine (local connection), whose save fails at once (it has sync settings, and no sudo/systemd here)."""
from __future__ import annotations

import os

import boto3
import pytest

from localcloud import moto_compat
from playbook_run import LOCALHOST, ROOT, flat_output, local_inventory, playbook_env, run_playbook

CLUSTER = "tdtest"
MASTER = "127.95.1.10"


@pytest.fixture
def cloud(moto_endpoint):
    moto_compat.apply()
    efs = boto3.client("efs", region_name="us-east-1", endpoint_url=moto_endpoint, aws_access_key_id="localcloud",
                       aws_secret_access_key="localcloud")
    tags = [{"Key": "dynatrain:cluster", "Value": CLUSTER}, {"Key": "Name", "Value": f"{CLUSTER}-efs"}]
    efs.create_file_system(CreationToken=f"{CLUSTER}-efs", Tags=tags)
    return moto_endpoint, efs


def file_systems(efs):
    return [f["CreationToken"] for f in efs.describe_file_systems()["FileSystems"]]


def teardown(tmp_path, endpoint, *extra):
    groups = {
        f"dt_cluster_{CLUSTER}": {"hosts": {MASTER: dict(LOCALHOST, dt_private_ip=MASTER, dt_cluster=CLUSTER)}},
        "dt_master": {"hosts": {MASTER: {}}}, "dt_workers": {"hosts": {MASTER: {}}},
    }
    inventory = local_inventory(tmp_path / "inventory.yml", children=groups, dt_aws_endpoint_url=endpoint,
                                dt_cluster_name=CLUSTER, dt_state_dir=str(tmp_path / "state"),
                                dt_efs_mount=str(tmp_path / "efs"))
    sync = tmp_path / "sync.default"      # the master's dt-checkpoint-sync settings: it has a job to save
    sync.write_text("DT_SYNC_URL=s3://dynatrain-checkpoints-123456789012/tdtest/job/\n")
    proc = run_playbook(inventory, os.path.join(ROOT, "playbooks", "teardown.yml"),
                        "-e", f"_launcher_sync_defaults_file={sync}", *extra, env=playbook_env(tmp_path), cwd=tmp_path,
                        timeout=600)
    return proc.returncode, flat_output(proc)


def test_a_failed_final_save_keeps_the_shared_volume_unless_forced(tmp_path, cloud):
    endpoint, efs = cloud
    rc, out = teardown(tmp_path, endpoint)
    assert rc != 0, out[-3000:]
    assert f"The job of cluster {CLUSTER} could not be saved to S3 before the teardown" in out, out[-3000:]
    assert "Nothing was deleted" in out and "-e teardown_force=true" in out
    assert "TASK [dynatrain.elastic.fleet : Terminate every instance of the cluster]" not in out
    assert f"{CLUSTER}-efs" in file_systems(efs)

    rc, out = teardown(tmp_path, endpoint, "-e", "teardown_force=true")
    assert "teardown_force=true: the teardown goes on." in out, out[-3000:]
    assert "TASK [dynatrain.elastic.network : Delete the shared file system]" in out, out[-3000:]
    assert f"{CLUSTER}-efs" not in file_systems(efs)
