"""A warm request (control/warm/<ip>.json, what add_workers writes before its host_worker edit): real MXNet,
--transport local on 127.x.  The joiner's process is started before the edit and is the one that joins.
The run uses one parameter server per node (--num-servers per-node): the join restarts every server."""
import json
import os
import signal

from conftest import LauncherRun, events, latest_meta, pids_of_host, wait_for, write_hosts

from dynatrain_runtime.contract.checkpoint import audit_check
from dynatrain_runtime.contract.shared_volume import JobFiles, read_warm_requests, write_warm_request

M, A, B = "127.0.0.66", "127.0.0.67", "127.0.0.68"


def joiners_warm(efs):
    try:
        with open(os.path.join(efs, "status.json")) as handle:
            return json.load(handle).get("joiners_warm") or []
    except (OSError, ValueError):
        return []


def test_warm_request_starts_the_joiner_before_the_edit_and_it_joins_warm(tmp_path, node_python, digits_npz):
    efs = str(tmp_path)
    write_hosts(efs, [A, M])
    args = ["--epochs", "20", "--seed", "7", "--global-batch", "64", "--step-sleep", "0.05", "--checkpoint-every", "0"]
    run = LauncherRun(efs, node_python, digits_npz, args, launcher_args=["--status-interval", "0.2", "--num-servers", "per-node"],
                      port_base=20000)
    try:
        wait_for(lambda: any(e["event"] == "epoch" for e in events(efs)), 90, "first epoch", proc=run.proc)
        write_warm_request(JobFiles(efs), B)
        wait_for(lambda: B in joiners_warm(efs), 60, "the joiner's warm process", proc=run.proc)
        warm_pids = pids_of_host(B, efs)
        assert len(warm_pids) == 1                                   # started before B is in host_worker
        assert not any(e["event"] == "resize_start" for e in events(efs))
        write_hosts(efs, [A, B, M])
        wait_for(lambda: any(e["event"] == "resize_end" for e in events(efs)), 60, "the join", proc=run.proc)
        assert pids_of_host(B, efs) == warm_pids                     # that process joined: no cold start
        wait_for(lambda: sum(e["event"] == "epoch" and e.get("world") == 3 for e in events(efs)) >= 1, 60,
                 "an epoch at the new size", proc=run.proc)
        run.proc.send_signal(signal.SIGTERM)                          # (the rest of the run adds nothing)
        rc = run.wait(60)
        assert rc == 0, run.tail()
    finally:
        run.close()
    evs = events(efs)
    start = next(e for e in evs if e["event"] == "resize_start")
    assert start["added"] == [B] and start["warm_wait_s"] == 0       # warm at the edit: no wait for an import
    assert [e["hosts"] for e in evs if e["event"] == "warm_request"] == [[B]]
    assert read_warm_requests(JobFiles(efs)) == {}                    # done once B is a member
    gens = [e for e in evs if e["event"] == "generation_start"]
    assert [g["membership"] for g in gens] == [[A, M], [A, B, M]] and gens[1]["servers"] == [A, B, M]
    meta = latest_meta(efs)
    assert meta["world"] == 3 and audit_check(meta["audit"], meta["num_samples"]) == []
