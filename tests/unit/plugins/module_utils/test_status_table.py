"""status.yml's compact view: module_utils/status_table.py and the dynatrain.elastic.status_table filter."""
from __future__ import annotations

import pytest

from ansible_collections.dynatrain.elastic.plugins.filter.status_table import FilterModule, status_table
from ansible_collections.dynatrain.elastic.plugins.module_utils import status_table as st

MASTER, W1, W2, SPOT = "172.31.64.10", "172.31.65.62", "172.31.65.9", "172.31.70.5"


def node(ip, role="worker", state="running", status=None, lifecycle="on-demand", iid=None):
    return dict(dt_private_ip=ip, dt_role=role, dt_state=state, dt_status=status, dt_lifecycle=lifecycle,
                dt_instance_id=iid or "i-" + ip.replace(".", ""), dt_tags={"ignored": "yes"})


NODES = [node(SPOT, status="REMOVED", lifecycle="spot"), node(W1), node(MASTER, role="master"),
         node(W2, status="ADDED")]


def job(**kw):
    out = {
        "hosts": [W1, W2, MASTER], "host_worker_error": None, "log_error": None, "status_error": None,
        "last_log": {W1: {"seq": 0, "event": "ADDED", "ns": 1, "age_s": 310.2},
                     W2: {"seq": 3, "event": "ADDED", "ns": 2, "age_s": 42.4},
                     SPOT: {"seq": 4, "event": "REMOVED", "ns": 3, "age_s": 7.0}},
        "status": {"state": "running", "epoch": 3, "step": 120, "world_size": 3, "samples_per_s": 562.348},
        "state": "running", "running": True, "age_s": 0.4, "checkpoint_age_s": 12.6,
    }
    out.update(kw)
    return out


def test_one_row_per_node_master_first_then_by_address():
    lines = st.status_lines(NODES, job())
    assert lines[0].split() == ["NODE", "ROLE", "EC2", "STATUS", "MARKET", "IN", "JOB", "LAST", "EVENT", "INSTANCE"]
    rows = [line.split() for line in lines[1:5]]
    assert [r[0] for r in rows] == [MASTER, W2, W1, SPOT]  # .9 before .62: numeric order
    assert rows[0][:6] == [MASTER, "master", "running", "-", "on-demand", "yes"]
    assert rows[1][:6] == [W2, "worker", "running", "ADDED", "on-demand", "yes"]
    assert " ".join(rows[1][6:9]) == "ADDED #3 42s"
    assert rows[3][:6] == [SPOT, "worker", "running", "REMOVED", "spot", "no"]
    assert " ".join(rows[3][6:10]) == "REMOVED #4 7s ago"
    assert " ".join(rows[2][6:10]) == "ADDED #0 5m10s ago"
    assert rows[0][6] == "-"  # nothing in the log about the master
    # columns line up: every row starts its 'IN JOB' cell at the header's offset
    col = lines[0].index("IN JOB")
    assert all(line[col:col + 3] in ("yes", "no ") for line in lines[1:5])


def test_job_line():
    assert st.status_lines(NODES, job())[-1] == (
        "job: running  epoch 3 step 120  world 3  562.3 samples/s  checkpoint 13s ago")


def test_job_line_names_the_engine_when_the_launcher_does():
    torch = job(status={"state": "running", "epoch": 3, "step": 120, "world_size": 3, "samples_per_s": 562.348,
                        "engine": "torch"})
    assert st.status_lines(NODES, torch)[-1] == (
        "job: running  engine torch  epoch 3 step 120  world 3  562.3 samples/s  checkpoint 13s ago")


@pytest.mark.parametrize("job_result, expected", [
    (None, "job: unknown (the inventory has no master to ask)"),
    (job(status={}, state=None, running=False), "job: not started (no status.json on the shared volume)"),
    (job(status_error="status.json is not valid JSON (x)"), "job: unknown (status.json is not valid JSON (x))"),
    (job(running=False, age_s=300.0), "job: running? (no update for 5m00s)  epoch 3 step 120"),
    (job(checkpoint_age_s=None, status={"state": "finished", "epoch": 10, "step": 230, "world_size": 2},
         state="finished", running=False), "job: finished  epoch 10 step 230  world 2  - samples/s  no checkpoint"),
])
def test_job_line_cases(job_result, expected):
    assert st.status_lines(NODES, job_result)[-1].startswith(expected)


def test_unknown_membership_and_problems_are_shown():
    lines = st.status_lines(NODES, job(hosts=[], host_worker_error="host_worker line 2: 'x' is not an IPv4 address",
                                       log_error="host_worker_log has bad lines"))
    assert all(line.split()[5] == "?" for line in lines[1:5])  # in job? cannot be told
    assert lines[-2:] == ["host_worker: host_worker line 2: 'x' is not an IPv4 address",
                          "host_worker_log: host_worker_log has bad lines"]


def test_no_nodes():
    assert st.status_lines([], None) == ["no node of this cluster is in the inventory",
                                         "job: unknown (the inventory has no master to ask)"]


@pytest.mark.parametrize("seconds, text", [(None, "-"), (0.4, "0s ago"), (59.6, "1m00s ago"), (-3, "0s ago"),
                                           (3599, "59m59s ago"), (7300, "2h01m ago")])
def test_ago(seconds, text):
    assert st.ago(seconds) == text


def test_filter_takes_only_the_shown_vars_and_treats_skipped_as_no_job():
    class HostVars(dict):
        """Like Ansible's hostvars: reading a variable templates it, so only the shown ones may be read."""

        def __getitem__(self, key):
            raise AssertionError(f"read all of hostvars ({key})")

        def get(self, key, default=None):
            assert key in st.NODE_VARS, key
            return dict.get(self, key, default)

        def keys(self):
            raise AssertionError("listed all of hostvars")

    lines = status_table([HostVars(node(MASTER, role="master"))], {"skipped": True, "changed": False})
    assert lines[1].split()[:2] == [MASTER, "master"]
    assert lines[-1] == "job: unknown (the inventory has no master to ask)"
    assert FilterModule().filters()["status_table"] is status_table


def test_s3_copy_line_after_the_job_line():
    copy = {"url": "s3://b/c/job/", "last_step": 120, "error": None}
    lines = st.status_lines(NODES, job(s3_copy=copy, s3_copy_age_s=4.2))
    assert lines[-2].startswith("job: running") and lines[-1] == "checkpoints in S3: s3://b/c/job/  step 120 copied 4s ago"
    failing = st.status_lines(NODES, job(s3_copy=dict(copy, error="NoSuchBucket: gone"), s3_copy_age_s=None))
    assert failing[-1] == "checkpoints in S3: s3://b/c/job/  nothing copied yet  last pass failed: NoSuchBucket: gone"
    assert not any(line.startswith("checkpoints in S3") for line in st.status_lines(NODES, job()))
