"""Reconciler decisions: instances + containers -> actions (no podman, no moto)."""

import os

import pytest

from localcloud import config
from localcloud.reconciler import Action, Instance, Reconciler, efs_for, plan, plan_mounts


def inst(iid, state="running", ip="127.77.1.10", vpc="vpc-1"):
    return Instance(id=iid, state=state, private_ip=ip, region="us-east-1", vpc_id=vpc)


def kinds(actions):
    return sorted((a.kind, a.instance_id) for a in actions)


def test_new_running_and_pending_instances_get_created():
    acts = plan([inst("i-a"), inst("i-b", state="pending", ip="127.77.1.11")], {}, set(), set())
    assert kinds(acts) == [("create", "i-a"), ("create", "i-b")]


def test_running_container_needs_nothing():
    assert plan([inst("i-a")], {"i-a": "running"}, {"i-a"}, set()) == []


@pytest.mark.parametrize("state", ["terminated", "shutting-down"])
def test_terminated_instance_container_removed(state):
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


# -- stopped instances: the container is kept (halt) and started again (resume) --------
def test_stop_request_halts_the_container_and_keeps_it():
    acts = plan([inst("i-a", state="stopping")], {"i-a": "running"}, {"i-a"}, set())
    assert kinds(acts) == [("halt", "i-a")] and "stopping" in acts[0].reason


def test_stopping_instance_is_halted_until_settled_even_when_its_container_already_stopped():
    # halt settles stopping -> stopped; until then plan() asks again (podman stop is idempotent)
    assert kinds(plan([inst("i-a", state="stopping")], {"i-a": "exited"}, {"i-a"}, set(), {"i-a"})) == [
        ("halt", "i-a")
    ]
    # a lost node whose instance is stopped: halted too (stop/start is EC2's remedy)
    assert kinds(plan([inst("i-a", state="stopping")], {"i-a": "exited"}, {"i-a"}, set())) == [("halt", "i-a")]


def test_stopped_instance_with_halted_container_needs_nothing():
    assert plan([inst("i-a", state="stopped")], {"i-a": "exited"}, {"i-a"}, set(), {"i-a"}) == []
    # ... nor when the container was removed by hand meanwhile: created again on start
    assert plan([inst("i-a", state="stopped")], {}, {"i-a"}, set(), {"i-a"}) == []


def test_stopped_instance_whose_container_runs_again_is_halted():
    # e.g. `podman start` by hand: the machine of a stopped instance is off
    acts = plan([inst("i-a", state="stopped")], {"i-a": "running"}, {"i-a"}, set(), {"i-a"})
    assert kinds(acts) == [("halt", "i-a")]


@pytest.mark.parametrize("state", ["pending", "running"])
def test_started_instance_with_halted_container_resumes(state):
    acts = plan([inst("i-a", state=state)], {"i-a": "exited"}, {"i-a"}, set(), {"i-a"})
    assert kinds(acts) == [("resume", "i-a")]


def test_container_of_running_instance_that_exited_without_halt_is_lost():
    # another node was halted by us; this one died on its own: lost, never resumed
    acts = plan([inst("i-a"), inst("i-b", state="stopped", ip="127.77.1.11")],
                {"i-a": "exited", "i-b": "exited"}, {"i-a", "i-b"}, set(), {"i-b"})
    assert kinds(acts) == [("lost", "i-a")]


@pytest.mark.parametrize("state", ["terminated", "shutting-down"])
def test_terminated_instance_removes_its_halted_container(state):
    acts = plan([inst("i-a", state=state)], {"i-a": "exited"}, {"i-a"}, set(), {"i-a"})
    assert kinds(acts) == [("remove", "i-a")]


def test_started_instance_whose_halted_container_is_gone_gets_a_new_one():
    # removed by hand while stopped (halted, no container) -> create, not "lost"
    assert kinds(plan([inst("i-a", state="pending")], {}, {"i-a"}, set(), {"i-a"})) == [("create", "i-a")]
    # never had one (created no longer holds it) -> create
    assert kinds(plan([inst("i-a")], {}, set(), set())) == [("create", "i-a")]


def test_halt_and_resume_in_flight_are_left_alone():
    assert plan([inst("i-a", state="stopping")], {"i-a": "running"}, {"i-a"}, {"i-a"}) == []
    assert plan([inst("i-a", state="pending")], {"i-a": "exited"}, {"i-a"}, {"i-a"}, {"i-a"}) == []


def test_api_only_instance_is_halted_and_skipped_so_its_state_settles():
    # 172.31.x: no container; halt (stopping -> stopped) and skip (pending -> running) settle it
    assert kinds(plan([inst("i-a", state="stopping", ip="172.31.5.6")], {}, set(), set())) == [("halt", "i-a")]
    assert plan([inst("i-a", state="stopped", ip="172.31.5.6")], {}, set(), set()) == []
    assert kinds(plan([inst("i-a", state="pending", ip="172.31.5.6")], {}, set(), set())) == [("skip", "i-a")]


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


def _completed(rc=0, stderr=""):
    import subprocess

    return subprocess.CompletedProcess(["podman"], rc, "", stderr)


@pytest.fixture
def halting(tmp_path, monkeypatch):
    """A Reconciler with podman and moto's state changes recorded, not made."""
    from localcloud import reconciler

    monkeypatch.setenv("DT_LOCALCLOUD_HOME", str(tmp_path))
    calls = []
    monkeypatch.setattr(reconciler.moto_compat, "settle", lambda iid, a, b: calls.append(("settle", iid, a, b)))
    monkeypatch.setattr(reconciler.moto_compat, "set_impaired",
                        lambda iid, why=None: calls.append(("impaired", iid, why)))
    monkeypatch.setattr(reconciler, "wait_ssh", lambda ip, timeout=None: calls.append(("ssh", ip)) or True)
    return Reconciler(None, None, str(tmp_path)), calls, monkeypatch, reconciler


GONE = 'Error: no container with name or ID "i-a" found: no such container'


@pytest.mark.parametrize("rc, stderr", [(0, ""), (125, GONE)])
def test_halt_stops_the_container_then_settles_the_instance_stopped(halting, rc, stderr):
    r, calls, monkeypatch, reconciler = halting
    monkeypatch.setattr(reconciler.podman, "stop",
                        lambda name, timeout=None: calls.append(("stop", name)) or _completed(rc, stderr))
    monkeypatch.setattr(reconciler.podman, "remove", lambda name: calls.append(("remove", name)))
    r.created, r.busy, r.lost = {"i-a"}, {"i-a"}, {"i-a": "container exited"}
    r._halt(inst("i-a", state="stopping"))
    assert calls == [("stop", "i-a"), ("impaired", "i-a", None), ("settle", "i-a", "stopping", "stopped")]
    assert r.halted == {"i-a"} and r.created == {"i-a"} and not r.busy and not r.lost


def test_halt_that_failed_leaves_the_instance_stopping(halting):
    r, calls, monkeypatch, reconciler = halting
    monkeypatch.setattr(reconciler.podman, "stop", lambda name, timeout=None: _completed(125, "Error: timed out"))
    r.created, r.busy = {"i-a"}, {"i-a"}
    r._halt(inst("i-a", state="stopping"))
    assert calls == [] and not r.halted and not r.busy  # plan() halts it again


def test_resume_starts_the_same_container_with_its_new_public_address(halting):
    r, calls, monkeypatch, reconciler = halting
    monkeypatch.setattr(reconciler.podman, "start", lambda name: calls.append(("start", name)))
    r.created, r.busy, r.halted = {"i-a"}, {"i-a"}, {"i-a"}
    r.volumes, r.mounted = {"i-a": {"fs-1"}}, {"i-a": {"fs-1", "fs-late"}}
    node = Instance(id="i-a", state="pending", private_ip="127.77.1.10", region="us-east-1", vpc_id="vpc-1",
                    public_key="ssh-ed25519 AAAA k", public_ip="127.254.9.9")
    r._resume(node)
    with open(os.path.join(config.instance_dir("i-a"), "instance.env")) as f:
        assert "LOCALCLOUD_PUBLIC_IP=127.254.9.9\n" in f.read()
    assert calls == [("start", "i-a"), ("ssh", "127.77.1.10"), ("ssh", "127.254.9.9"),
                     ("settle", "i-a", "pending", "running")]
    # the late bind mount went with the old boot: plan_mounts makes it again
    assert r.mounted == {"i-a": {"fs-1"}} and not r.halted and not r.busy and r.created == {"i-a"}
    assert [a.reason for a in plan_mounts([node], {"i-a": "running"}, r.created, r.mounted,
                                          {"fs-1": {"vpc-1"}, "fs-late": {"vpc-1"}})] == ["fs-late"]


def _resume_that_fails(halting, moved):
    """A halted i-a whose podman start always fails; start_failed (recorded in calls) answers ``moved``."""
    r, calls, monkeypatch, reconciler = halting

    def fail(name):
        raise reconciler.podman.PodmanError("podman start failed")

    def start_failed(iid):
        calls.append(("start_failed", iid))
        return moved

    monkeypatch.setattr(reconciler.podman, "start", fail)
    monkeypatch.setattr(reconciler.moto_compat, "start_failed", start_failed)
    monkeypatch.setattr(reconciler.Reconciler, "_start_thread", lambda self, kind, target, *args: target(*args))
    r.created, r.halted = {"i-a"}, {"i-a"}
    return inst("i-a", state="pending")


def test_resume_that_failed_is_retried_a_bounded_number_of_times_then_stopped_as_on_ec2(halting):
    r, calls, _monkeypatch, reconciler = halting
    node = _resume_that_fails(halting, moved=True)
    for attempt in range(1, reconciler.MAX_CREATE_ATTEMPTS + 1):
        r._do_resume(Action("resume", "i-a", "instance pending"), node, {})
        if attempt < reconciler.MAX_CREATE_ATTEMPTS:
            assert r.attempts["i-a"] == attempt and calls == []             # still pending: tried again
    # the last try failed too: EC2 returns such an instance to `stopped`; a later start begins anew
    assert calls == [("start_failed", "i-a")]
    assert "i-a" not in r.attempts and r.halted == {"i-a"} and r.created == {"i-a"} and not r.busy


def test_resume_given_up_after_a_stop_came_first_still_lets_a_later_start_begin_anew(halting):
    r, calls, monkeypatch, reconciler = halting
    # the instance is no longer pending (a StopInstances came first): nothing to move
    node = _resume_that_fails(halting, moved=False)
    for _attempt in range(reconciler.MAX_CREATE_ATTEMPTS):
        r._do_resume(Action("resume", "i-a", "instance pending"), node, {})
    assert calls == [("start_failed", "i-a")] and "i-a" not in r.attempts
    monkeypatch.setattr(reconciler.podman, "start", lambda name: calls.append(("start", name)))
    r._do_resume(Action("resume", "i-a", "instance pending"), node, {})   # started again later: it boots
    assert calls[1:] == [("start", "i-a"), ("ssh", node.private_ip), ("settle", "i-a", "pending", "running")]
    assert not r.halted and "i-a" not in r.attempts
