"""Real MXNet runs of the launcher (--transport local) on 127.x addresses, with the node venv."""
import json
import os
import re
import signal
import socket
import time
import urllib.request

import pytest

from conftest import (LauncherRun, audit_ok, events, latest_meta, log_lines, pids_of_host, wait_for,  # noqa: F401  pylint: disable=unused-import
                      write_hosts)


EPOCHS = ["--epochs", "5", "--seed", "42", "--global-batch", "64", "--lr", "0.1"]
M, A, B, C = "127.0.0.61", "127.0.0.62", "127.0.0.63", "127.0.0.64"


def free_tcp_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape_when(port, needle):
    """The launcher's metrics text once it holds ``needle``, else None (also while it does not answer)."""
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    return text if needle in text else None


def final(efs):
    with open(os.path.join(str(efs), "results", "final.json")) as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def fixed_run(tmp_path_factory, node_python, digits_npz):
    efs = tmp_path_factory.mktemp("efs_fixed")
    write_hosts(str(efs), ["127.0.0.52", "127.0.0.51"])
    run = LauncherRun(efs, node_python, digits_npz, EPOCHS, port_base=19100)
    try:
        rc = run.wait(90)
        assert rc == 0, run.tail()
    finally:
        run.close()
    return str(efs)


def test_fixed_two_workers_reach_90_percent(fixed_run):
    res = final(fixed_run)
    assert res["val_acc"] >= 0.90, res
    assert res["epochs"] == 5 and res["world_at_end"] == 2
    assert [l[:3] for l in log_lines(fixed_run)] == [["0", "ADDED", "127.0.0.52"], ["1", "ADDED", "127.0.0.51"]]
    audit_ok(latest_meta(fixed_run))
    evs = events(fixed_run)
    epochs = [e for e in evs if e["event"] == "epoch"]
    assert [e["epoch"] for e in epochs] == list(range(5))
    assert all(e["world"] == 2 and "val_acc" in e and "samples_per_s" in e for e in epochs)
    assert evs[-1]["event"] == "launcher_exit" and evs[-1]["reason"] == "finished"
    status = json.load(open(os.path.join(fixed_run, "status.json")))
    assert status["state"] == "finished"


def test_elastic_add_remove_fail(tmp_path, node_python, digits_npz, fixed_run):
    efs = str(tmp_path)
    write_hosts(efs, [A, M])
    metrics_port = free_tcp_port()
    run = LauncherRun(efs, node_python, digits_npz, EPOCHS + ["--step-sleep", "0.25", "--checkpoint-every", "5"],
                      launcher_args=["--dead-timeout", "5", "--metrics-port", str(metrics_port),
                                     "--metrics-address", "127.0.0.1"], port_base=19300)
    try:
        def logged(n):
            return lambda: len(log_lines(efs)) >= n
        wait_for(logged(2), 60, "initial ADDED lines", proc=run.proc)
        write_hosts(efs, [A, B, C, M])                                   # add 2
        wait_for(logged(4), 60, "ADDED of the two new workers", proc=run.proc)
        write_hosts(efs, [A, C, M])                                      # remove 1 (a new one)
        wait_for(logged(5), 60, "REMOVED of one added worker", proc=run.proc)
        write_hosts(efs, [C, M])                                         # remove a non-master original
        wait_for(logged(6), 60, "REMOVED of an original worker", proc=run.proc)
        pids = wait_for(lambda: pids_of_host(C), 20, "worker processes of %s" % C)
        for pid in pids:                                                 # the worker host dies
            os.kill(pid, signal.SIGKILL)
        wait_for(logged(7), 20, "FAILED within 15 s (+ margin)", proc=run.proc)
        # the launcher's metrics say what happened: every resize by reason, the failure, the world now
        scraped = wait_for(lambda: scrape_when(metrics_port, 'dynatrain_resizes_total{reason="failure"} 1'), 60,
                           "the failure's resize in the metrics", proc=run.proc)
        assert "dynatrain_worker_failures_total 1" in scraped and "dynatrain_world_size 1" in scraped, scraped
        assert re.search(r'^dynatrain_host_state\{host="%s",state="training"\} 1$' % re.escape(M), scraped, re.M)
        rc = run.wait(120)
        assert rc == 0, run.tail()
    finally:
        run.close()
    lines = log_lines(efs)
    assert [l[1:3] for l in lines] == [["ADDED", A], ["ADDED", M], ["ADDED", B], ["ADDED", C],
                                       ["REMOVED", B], ["REMOVED", A], ["FAILED", C]], lines
    assert [int(l[0]) for l in lines] == list(range(7))
    assert open(os.path.join(efs, "host_worker")).read() == M + "\n"      # the failed host was dropped
    meta = latest_meta(efs)
    audit_ok(meta)
    worlds = {r["world"] for r in meta["audit"]["steps"]}
    assert {1, 2, 3, 4} <= worlds, worlds
    res = final(efs)
    assert abs(res["val_acc"] - final(fixed_run)["val_acc"]) <= 0.01, (res, final(fixed_run))
    evs = events(efs)
    ends = [e for e in evs if e["event"] == "resize_end"]
    assert len(ends) >= 4 and all(e["total_s"] > 0 for e in ends)
    failed = [e for e in evs if e["event"] == "worker_failed"]
    assert failed and failed[0]["ip"] == C
    lost = [e for e in ends if e.get("reason") == "failure"]
    assert lost and lost[0]["recomputed_steps"] >= 0 and lost[0]["resume_step"] <= lost[0]["stop_step"]
    assert all(e["recomputed_steps"] == 0 for e in ends if e.get("reason") != "failure")


def test_sigterm_then_restart_resumes(tmp_path, node_python, digits_npz):
    efs = str(tmp_path)
    write_hosts(efs, [A, M])
    args = EPOCHS + ["--step-sleep", "0.05", "--checkpoint-every", "1000"]
    run = LauncherRun(efs, node_python, digits_npz, args, port_base=19500)
    try:
        wait_for(lambda: len(log_lines(efs)) >= 2, 60, "first step", proc=run.proc)
        wait_for(lambda: any(e["event"] == "epoch" for e in events(efs)), 30, "first epoch", proc=run.proc)
        run.proc.send_signal(signal.SIGTERM)
        rc = run.wait(30)
        assert rc == 0, run.tail()
    finally:
        run.close()
    meta = latest_meta(efs)
    assert meta is not None and not meta["finished"] and meta["step"] > 0
    stopped_at = meta["step"]
    assert [e for e in events(efs) if e["event"] == "launcher_exit"][-1]["checkpoint_step"] == stopped_at
    assert json.load(open(os.path.join(efs, "status.json")))["state"] == "stopped"
    write_hosts(efs, [A, B, M])                                          # a worker joins while stopped
    run = LauncherRun(efs, node_python, digits_npz, args, port_base=19600)
    try:
        rc = run.wait(90)
        assert rc == 0, run.tail()
    finally:
        run.close()
    lines = log_lines(efs)
    assert [l[:3] for l in lines] == [["0", "ADDED", A], ["1", "ADDED", M], ["2", "ADDED", B]]
    starts = [e for e in events(efs) if e["event"] == "generation_start"]
    assert starts[0]["resume_step"] == 0 and starts[1]["resume_step"] == stopped_at
    assert starts[1]["generation"] > starts[0]["generation"]
    meta = latest_meta(efs)
    audit_ok(meta)
    steps = [r["step"] for r in meta["audit"]["steps"]]
    assert steps == list(range(len(steps)))                              # no step lost or repeated
    assert final(efs)["val_acc"] >= 0.90


def test_spot_drain_leaves_at_the_next_step_with_nothing_recomputed(tmp_path, node_python, digits_npz):
    from dynatrain_runtime.contract.shared_volume import JobFiles, read_drain_requests, write_drain_request
    efs = str(tmp_path)
    write_hosts(efs, [A, B, M])
    # epoch boundaries and no periodic checkpoint: only a stop at the very step could avoid recomputing
    run = LauncherRun(efs, node_python, digits_npz, EPOCHS + ["--step-sleep", "0.1", "--checkpoint-every", "0"],
                      launcher_args=["--resize-at", "epoch"], port_base=19700)
    try:
        wait_for(lambda: len(log_lines(efs)) >= 3, 60, "initial ADDED lines", proc=run.proc)
        wait_for(lambda: any(e["event"] == "epoch" for e in events(efs)), 60, "first epoch", proc=run.proc)
        write_drain_request(JobFiles(efs), B, "spot", notice={"action": "terminate"})
        asked = time.time()
        wait_for(lambda: len(log_lines(efs)) >= 4, 30, "REMOVED of the drained worker", proc=run.proc)
        drained_s = time.time() - asked
        rc = run.wait(120)
        assert rc == 0, run.tail()
    finally:
        run.close()
    assert [l[1:3] for l in log_lines(efs)] == [["ADDED", A], ["ADDED", B], ["ADDED", M], ["REMOVED", B]]
    assert drained_s < 20, drained_s                      # well inside the two-minute notice
    assert open(os.path.join(efs, "host_worker")).read() == A + "\n" + M + "\n"
    assert read_drain_requests(JobFiles(efs)) == {}
    evs = events(efs)
    removed = [e for e in evs if e["event"] == "host_worker_log" and e["log_event"] == "REMOVED"]
    assert removed[0]["ip"] == B and removed[0]["reason"] == "spot"
    start = next(e for e in evs if e["event"] == "resize_start" and e.get("reason") == "drain")
    assert start["drained"] == {B: "spot"}
    end = next(e for e in evs if e["event"] == "resize_end" and e.get("reason") == "drain")
    assert end["recomputed_steps"] == 0 and end["first_step"] == end["resume_step"] + 1 > 1
    gens = [e for e in evs if e["event"] == "generation_start"]
    assert len(gens) == 2 and gens[1]["membership"] == [A, M]
    meta = latest_meta(efs)
    audit_ok(meta)
    steps = [r["step"] for r in meta["audit"]["steps"]]
    assert steps == list(range(len(steps)))               # 0 recomputed steps
    assert gens[1]["resume_step"] > 0 and [r["world"] for r in meta["audit"]["steps"]].count(3) == gens[1]["resume_step"]
