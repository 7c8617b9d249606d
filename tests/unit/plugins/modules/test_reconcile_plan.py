"""The reconcile decisions: which instance is cleaned up, joined, removed; how many are launched."""
import json

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.dynatrain.elastic.plugins.modules import reconcile_plan as rp

M = "10.0.0.1"      # the master
A = "10.0.0.2"
B = "10.0.0.3"
C = "10.0.0.4"
D = "10.0.0.5"


def node(ip, role="worker", status="ADDED", elastic=True, group="elastic", token=True):
    return {"id": "i-" + ip.replace(".", ""), "ip": ip, "role": role, "status": status, "elastic": elastic,
            "group": group, "token": token}


MASTER = node(M, role="master", status=None, elastic=False, group=None)


def entry(seq, event, ip):
    """A host_worker_log entry as dynatrain.elastic.job_info returns it."""
    return {"seq": seq, "event": event, "ip": ip, "ns": 1542536656974259605 + seq}


LOG = [entry(0, "ADDED", A), entry(1, "ADDED", M), entry(2, "ADDED", B)]


def ids(nodes):
    return [n["ip"] for n in nodes]


def test_healthy_cluster_needs_nothing():
    out = rp.plan([MASTER, node(A, group="base", elastic=False), node(B)], [A, B, M], LOG)
    assert (out["lost"], out["drained"], out["join"], out["remove"], out["launch"]) == ([], [], [], [], 0)
    assert out["summary"] == ["nothing to do"]


def test_a_worker_the_launcher_lost_is_cleaned_up():
    log = LOG + [entry(3, "FAILED", B)]
    out = rp.plan([MASTER, node(A), node(B)], [A, M], log)
    assert ids(out["lost"]) == [B] and out["join"] == [] and out["drained"] == []
    # once tagged FAILED (kept with keep_failed) it is still reported, never joined again
    out = rp.plan([MASTER, node(A), node(B, status="FAILED")], [A, M], log)
    assert ids(out["lost"]) == [B] and out["join"] == []


def test_a_drained_spot_worker_is_tagged_removed():
    log = LOG + [entry(3, "REMOVED", B)]
    out = rp.plan([MASTER, node(A), node(B, status="ADDED")], [A, M], log)
    assert ids(out["drained"]) == [B]
    # remove_workers' own removal (REMOVAL_QUEUED, then REMOVED) is left to remove_workers
    for status in ("REMOVAL_QUEUED", "REMOVED"):
        assert rp.plan([MASTER, node(A), node(B, status=status)], [A, M], log)["drained"] == []


def test_console_launched_instance_is_joined_but_not_one_add_workers_is_preparing():
    console = node(C, status=None, token=False)
    ours = node(D, status="ADD_QUEUED", token=True)
    out = rp.plan([MASTER, node(A), console, ours], [A, M], LOG[:2])
    assert ids(out["join"]) == [C]
    tagged_console = node(C, status="ADD_QUEUED", token=False)       # the template's own status tag
    assert ids(rp.plan([MASTER, node(A), tagged_console], [A, M], LOG[:2])["join"]) == [C]
    untagged = node(C, status=None, elastic=False, token=False)      # no elastic tag: not ours to join
    assert rp.plan([MASTER, node(A), untagged], [A, M], LOG[:2])["join"] == []


def test_deleting_the_elastic_tag_removes_an_elastic_worker_but_never_a_base_worker():
    out = rp.plan([MASTER, node(A, group="base", elastic=False), node(B, elastic=False)], [A, B, M], LOG)
    assert ids(out["remove"]) == [B]
    out = rp.plan([MASTER, node(A, group="base", elastic=False)], [A, M], LOG[:2])
    assert out["remove"] == []


@pytest.mark.parametrize("desired,nodes,hosts,launch", [
    (4, [MASTER, node(A)], [A, M], 2),                                        # grow to 4
    (2, [MASTER, node(A)], [A, M], 0),                                        # already there
    (3, [MASTER, node(A), node(B, status="FAILED")], [A, M], 1),             # replace the lost one
    (3, [MASTER, node(A), node(C, status=None, token=False)], [A, M], 0),    # a console join counts
    (3, [MASTER, node(A), node(D, status="ADD_QUEUED")], [A, M], 0),        # add_workers in flight counts
    (3, [MASTER, node(A), node(B, elastic=False)], [A, B, M], 1),            # a removal makes room
    (0, [MASTER, node(A)], [A, M], 0),                                        # 0 keeps the size
])
def test_desired_size(desired, nodes, hosts, launch):
    out = rp.plan(nodes, hosts, LOG, desired)
    assert out["launch"] == launch
    assert any("desired size" in line for line in out["summary"]) == bool(desired)
    idle = not (out["lost"] or out["drained"] or out["join"] or out["remove"] or launch)
    assert ("nothing to do" in out["summary"]) == idle


def test_module_rejects_a_negative_size(capsys):
    with patch_module_args({"nodes": [MASTER], "hosts": [M], "desired": -1}):
        with pytest.raises(SystemExit):
            rp.main()
    out = json.loads(capsys.readouterr().out)
    assert out["failed"] and "desired=-1" in out["msg"]


def test_module_returns_the_plan(capsys):
    with patch_module_args({"nodes": [MASTER, node(A), node(B)], "hosts": [A, M], "log": LOG + [entry(3, "FAILED", B)]}):
        with pytest.raises(SystemExit):
            rp.main()
    out = json.loads(capsys.readouterr().out)
    assert out["changed"] is False and "failed" not in out and [n["ip"] for n in out["lost"]] == [B] and out["launch"] == 0
