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


# --- interrupted operations (issue 24, defect 4) and re-used addresses (defect 5) ------------------------

NOW = 1542600000.0                                 # 2018-11-19 04:00 UTC, after every LOG entry
LAUNCHED_BEFORE_LOG = "2018-11-18T09:00:00+00:00"  # 1542531600: before LOG's entries (1542536656...)


def iso(epoch_s):
    import datetime
    return datetime.datetime.fromtimestamp(epoch_s, datetime.timezone.utc).isoformat()


def queued(ip, status, age, in_job_since=None, token=True, status_age=None):
    """A node launched ``age`` s before NOW (its status set ``status_age`` s before NOW, when given)."""
    n = node(ip, status=status, token=token)
    n["launch_time"] = iso(NOW - age)
    n["status_time"] = None if status_age is None else str(int(NOW - status_age))
    return n


def ns(epoch_s):
    return int(epoch_s * 1_000_000_000)


def test_an_add_interrupted_before_the_join_is_rolled_back_after_the_timeout():
    stuck = queued(D, "ADD_QUEUED", age=3600)
    out = rp.plan([MASTER, node(A), stuck], [A, M], LOG[:2], desired=3, timeout=900, now=NOW)
    assert ids(out["expired_adds"]) == [D] and out["lost"] == [] and out["join"] == []
    # no longer "in flight": the desired size launches a replacement
    assert out["launch"] == 1
    assert any("tag ADD_FAILED and terminate" in line for line in out["summary"])


def test_an_add_within_its_timeout_is_left_alone_and_counts_towards_the_size():
    busy = queued(D, "ADD_QUEUED", age=60)
    out = rp.plan([MASTER, node(A), busy], [A, M], LOG[:2], desired=3, timeout=900, now=NOW)
    assert all(out[k] == [] for k in rp.KEYS) and out["launch"] == 0


def test_a_worker_taken_from_the_warm_pool_belongs_to_its_add_from_when_it_was_taken():
    # pooled a day ago (its launch), taken a minute ago: the add that took it owns it
    taken = queued(D, "ADD_QUEUED", age=86400, status_age=60)
    out = rp.plan([MASTER, node(A), taken], [A, M], LOG[:2], desired=3, timeout=900, now=NOW)
    assert all(out[k] == [] for k in rp.KEYS) and out["launch"] == 0
    # taken an hour ago and never joined: an interrupted add, rolled back
    stuck = queued(D, "ADD_QUEUED", age=86400, status_age=3600)
    out = rp.plan([MASTER, node(A), stuck], [A, M], LOG[:2], desired=3, timeout=900, now=NOW)
    assert ids(out["expired_adds"]) == [D] and out["launch"] == 1


def test_an_add_interrupted_after_the_host_worker_edit_is_finished_or_rolled_back():
    joined = queued(D, "ADD_QUEUED", age=3600)
    confirmed = LOG[:2] + [{"seq": 2, "event": "ADDED", "ip": D, "ns": ns(NOW - 3000)}]
    out = rp.plan([MASTER, node(A), joined], [A, D, M], confirmed, timeout=900, now=NOW)
    assert ids(out["confirmed"]) == [D] and out["remove"] == []
    # in host_worker, never confirmed: removed from the job gracefully (then terminated by leave_workers)
    out = rp.plan([MASTER, node(A), joined], [A, D, M], LOG[:2], timeout=900, now=NOW)
    assert ids(out["remove"]) == [D] and out["confirmed"] == []


def test_a_removal_interrupted_is_finished_after_the_timeout():
    # the status tag's time counts (the instance itself is old)
    in_job = queued(B, "REMOVAL_QUEUED", age=86400, status_age=3600)
    out = rp.plan([MASTER, node(A), in_job], [A, B, M], LOG, desired=3, timeout=900, now=NOW)
    assert ids(out["remove"]) == [B] and out["launch"] == 1
    gone = LOG + [{"seq": 3, "event": "REMOVED", "ip": B, "ns": ns(NOW - 3500)}]
    out = rp.plan([MASTER, node(A), in_job], [A, M], gone, timeout=900, now=NOW)
    assert ids(out["expired_removals"]) == [B] and out["drained"] == [] and out["lost"] == []
    # within its timeout: left to remove_workers, and not counted as part of the job any more
    busy = queued(B, "REMOVAL_QUEUED", age=86400, status_age=60)
    out = rp.plan([MASTER, node(A), busy], [A, B, M], LOG, desired=3, timeout=900, now=NOW)
    assert all(out[k] == [] for k in rp.KEYS) and out["launch"] == 1


def test_an_old_failed_of_a_reused_address_does_not_make_a_new_instance_lost():
    old_failure = LOG + [entry(3, "FAILED", B)]               # logged in 2018-11-18 ~10:30 UTC
    # add_workers' new instance got B's address: it is the add's, never lost
    adding = queued(B, "ADD_QUEUED", age=120)
    out = rp.plan([MASTER, node(A), adding], [A, M], old_failure, timeout=900, now=NOW)
    assert out["lost"] == [] and all(out[k] == [] for k in rp.KEYS)
    # a console-launched instance on the address is joined, not terminated
    console = node(B, status=None, token=False)
    console["launch_time"] = iso(NOW - 120)
    out = rp.plan([MASTER, node(A), console], [A, M], old_failure, timeout=900, now=NOW)
    assert ids(out["join"]) == [B] and out["lost"] == []
    # a FAILED logged since the instance's launch still makes it lost
    launched_before = node(B)
    launched_before["launch_time"] = LAUNCHED_BEFORE_LOG
    assert ids(rp.plan([MASTER, node(A), launched_before], [A, M], old_failure, now=NOW)["lost"]) == [B]


def test_an_add_past_its_timeout_that_the_launcher_lost_is_lost():
    stuck = queued(D, "ADD_QUEUED", age=3600)
    log = LOG[:2] + [{"seq": 2, "event": "ADDED", "ip": D, "ns": ns(NOW - 3000)},
                     {"seq": 3, "event": "FAILED", "ip": D, "ns": ns(NOW - 2000)}]
    out = rp.plan([MASTER, node(A), stuck], [A, M], log, timeout=900, now=NOW)
    assert ids(out["lost"]) == [D] and out["expired_adds"] == []


@pytest.mark.parametrize("value,expected", [
    ("2018-11-19T04:00:00+00:00", NOW), ("2018-11-19T04:00:00Z", NOW), ("2018-11-19T04:00:00", NOW),
    (NOW, NOW), (str(int(NOW)), NOW), (None, None), ("", None), ("soon", None),
])
def test_epoch_reads_launch_and_tag_times(value, expected):
    assert rp.epoch(value) == expected


def test_module_rejects_a_timeout_below_one_second(capsys):
    with patch_module_args({"nodes": [MASTER], "hosts": [M], "timeout": 0}):
        with pytest.raises(SystemExit):
            rp.main()
    out = json.loads(capsys.readouterr().out)
    assert out["failed"] and "timeout=0" in out["msg"]


def pool_node(ip, state, launched_ago, now=1_800_000_000):
    return dict(node(ip, status="ADD_QUEUED", group="pool"), state=state, launch_time=now - launched_ago)


def test_pool_workers_an_interrupted_fill_left_running_are_seen():
    # issue 40: a Ctrl-C during the pool fill left running pool workers that reconcile never looked at
    now = 1_800_000_000
    left = pool_node(C, "running", 3600)
    nodes = [MASTER, node(A), left, pool_node(D, "running", 60), pool_node("10.0.0.6", "stopped", 86400)]
    out = rp.plan(nodes, [A, M], LOG, timeout=1800, now=now)
    assert out["unparked"] == [left]                    # the young one is a fill at work; the stopped one is parked
    assert all(left not in out[k] for k in rp.KEYS if k != "unparked") and out["launch"] == 0
    want = f"i-10004 {C}: a warm-pool worker an interrupted fill left running: terminate"
    assert [line for line in out["summary"] if C in line] == [want]
    parked = rp.plan(nodes, [A, M], LOG, timeout=1800, now=now, park_pool=True)
    assert parked["unparked"] == [left] and any("park it" in line for line in parked["summary"])


def test_a_pool_worker_is_never_lost_joined_or_counted():
    now = 1_800_000_000
    log = LOG + [entry(3, "FAILED", C)]
    out = rp.plan([MASTER, node(A), dict(pool_node(C, "stopped", 10), token=False)], [A, M], log, desired=3, now=now)
    assert out["lost"] == [] and out["join"] == [] and out["unparked"] == [] and out["launch"] == 1
