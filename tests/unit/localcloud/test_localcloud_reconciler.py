"""Reconciler decisions: instances + containers -> actions (no podman, no moto)."""

import os

import pytest

from localcloud import config
from localcloud.reconciler import Instance, Reconciler, efs_for, plan, plan_mounts


def inst(iid, state="running", ip="127.77.1.10", vpc="vpc-1"):
    return Instance(id=iid, state=state, private_ip=ip, region="us-east-1", vpc_id=vpc)


def kinds(actions):
    return sorted((a.kind, a.instance_id) for a in actions)


def test_new_running_and_pending_instances_get_created():
    acts = plan([inst("i-a"), inst("i-b", state="pending", ip="127.77.1.11")], {}, set(), set())
    assert kinds(acts) == [("create", "i-a"), ("create", "i-b")]


def test_running_container_needs_nothing():
    assert plan([inst("i-a")], {"i-a": "running"}, {"i-a"}, set()) == []


@pytest.mark.parametrize("state", ["stopped", "stopping", "terminated", "shutting-down"])
def test_not_live_instance_container_removed(state):
    acts = plan([inst("i-a", state=state)], {"i-a": "running"}, {"i-a"}, set())
    assert kinds(acts) == [("remove", "i-a")]
    assert state in acts[0].reason


def test_container_without_instance_removed():
    acts = plan([], {"i-gone": "running"}, set(), set())
    assert kinds(acts) == [("remove", "i-gone")] and acts[0].reason == "no such instance"


def test_dead_container_is_lost_not_recreated():
    acts = plan([inst("i-a")], {"i-a": "exited"}, {"i-a"}, set())
    assert kinds(acts) == [("lost", "i-a")]
    acts = plan([inst("i-a")], {}, {"i-a"}, set())  # container vanished entirely
    assert kinds(acts) == [("lost", "i-a")]


def test_instance_being_created_is_left_alone():
    assert plan([inst("i-a")], {}, set(), {"i-a"}) == []
    # ... and its half-made container is not "orphaned" either
    assert plan([], {"i-a": "created"}, set(), {"i-a"}) == []


def test_non_loopback_instance_is_skipped():
    acts = plan([inst("i-a", ip="172.31.5.6")], {}, set(), set())
    assert kinds(acts) == [("skip", "i-a")]


def test_existing_container_not_made_by_us_is_adopted():
    assert kinds(plan([inst("i-a")], {"i-a": "running"}, set(), set())) == [("adopt", "i-a")]


def test_stopped_then_started_instance_gets_a_new_container():
    # We removed its container on stop (created no longer holds it) -> create.
    assert kinds(plan([inst("i-a")], {}, set(), set())) == [("create", "i-a")]


def test_efs_only_from_own_vpc():
    fs_vpcs = {"fs-1": {"vpc-1"}, "fs-2": {"vpc-2"}, "fs-3": set()}
    assert efs_for(inst("i-a", vpc="vpc-1"), fs_vpcs) == ["fs-1"]
    assert efs_for(inst("i-b", vpc="vpc-3"), fs_vpcs) == []


def test_late_mount_target_is_mounted():
    fs_vpcs = {"fs-1": {"vpc-1"}, "fs-2": {"vpc-1"}}
    acts = plan_mounts([inst("i-a")], {"i-a": "running"}, {"i-a"}, {"i-a": {"fs-1"}}, fs_vpcs)
    assert [(a.kind, a.instance_id, a.reason) for a in acts] == [("mount", "i-a", "fs-2")]
    assert plan_mounts([inst("i-a")], {"i-a": "exited"}, {"i-a"}, {}, fs_vpcs) == []


class FakeEC2:
    def __init__(self):
        self.terminated = []

    def terminate_instances(self, InstanceIds):
        self.terminated += InstanceIds


def test_interrupt_schedules_termination(tmp_path, monkeypatch):
    monkeypatch.setenv("DT_LOCALCLOUD_HOME", str(tmp_path))
    ec2 = FakeEC2()
    r = Reconciler(lambda service, region: ec2, lambda: ["us-east-1"], str(tmp_path))
    r.last["instances"] = [inst("i-a"), inst("i-t", state="terminated")]
    assert r.interrupt("i-t", 10) is None and r.interrupt("i-nope", 10) is None
    intr = r.interrupt("i-a", 10)
    assert r.imds.interruptions["i-a"] is intr
    r._terminate_due(now=intr.terminate_at - 1)
    assert ec2.terminated == []
    r._terminate_due(now=intr.terminate_at)
    assert ec2.terminated == ["i-a"] and not r.terminations


def test_deleted_file_system_directory_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("DT_LOCALCLOUD_HOME", str(tmp_path))
    r = Reconciler(None, None, str(tmp_path))
    r._sync_efs_dirs({"fs-1": set(), "fs-2": set()})
    assert sorted(os.listdir(config.efs_dir())) == ["fs-1", "fs-2"]
    r._sync_efs_dirs({"fs-2": set()})
    assert os.listdir(config.efs_dir()) == ["fs-2"]


@pytest.mark.parametrize("public_ip", ["127.254.3.4", None])
def test_create_hands_the_node_its_public_address(tmp_path, monkeypatch, public_ip):
    """instance.env (read by localcloud-init) and a podman label carry the public IP, empty when none."""
    from localcloud import reconciler

    monkeypatch.setenv("DT_LOCALCLOUD_HOME", str(tmp_path))
    runs, waited = [], []
    monkeypatch.setattr(reconciler.podman, "run", lambda args, timeout=None: runs.append(args))
    monkeypatch.setattr(reconciler.baked_images, "image_for", lambda ami: "localhost/dynatrain-node:bookworm")
    monkeypatch.setattr(reconciler, "wait_ssh", lambda ip, timeout=None: waited.append(ip) or True)
    r = Reconciler(None, None, str(tmp_path))
    node = Instance(id="i-p", state="running", private_ip="127.77.1.10", region="us-east-1", vpc_id="vpc-1",
                    public_key="ssh-ed25519 AAAA k", public_ip=public_ip)
    r._create(node, [])
    with open(os.path.join(config.instance_dir("i-p"), "instance.env")) as f:
        env = dict(line.split("=", 1) for line in f.read().splitlines())
    assert env["LOCALCLOUD_PRIVATE_IP"] == "127.77.1.10"
    assert env["LOCALCLOUD_PUBLIC_IP"] == (public_ip or "")
    (args,) = runs
    assert "dynatrain.localcloud.private-ip=127.77.1.10" in args
    assert "dynatrain.localcloud.public-ip=%s" % (public_ip or "") in args
    assert waited == ["127.77.1.10"] + ([public_ip] if public_ip else [])
    assert r.created == {"i-p"}
