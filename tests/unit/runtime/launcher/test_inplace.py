"""In-place elasticity (``--resize-mode in-place``, the torch engine's default with the helper API): a change keeps
the survivors' processes and state.  Real PyTorch (CPU, gloo) processes on 127.x "hosts" with the local transport.

* the peer transfer alone (3 processes, no launcher): a chunk damaged on the wire is refused and fetched again;
  behind the first step at the new size (the joiner takes a placeholder, loads the state in its optimizer step's
  hook) the joiner holds the survivors' state bit for bit after that step;
* add and remove: a survivor's training process is the same before and after, no checkpoint is written for
  either change, the joiner gets the state from live peers (a damaged chunk refetched), the audit is clean
  and the DT log exact;
* a killed worker: the survivors re-form in place from their boundary state, no recovery checkpoint; killed after
  the step's gradient exchange (in its commit's collective), the survivors keep that step: nothing is redone.
"""
import json
import os
import signal
import subprocess

import pytest

from conftest import LauncherRun, events, latest_meta, log_lines, pids_of_host, wait_for, write_hosts

from dynatrain_runtime.contract.shared_volume import JobFiles, write_warm_request
from dynatrain_runtime.engines.torch_inplace import agree, chunk_plan
from dynatrain_runtime.launcher.inplace import resize_mode
from test_recovery import committed_once, status_step
from test_torch_engine import EPOCHS, audit_ok, resize_ends, settle, torch_python  # noqa: F401 (fixture)  pylint: disable=unused-import

HERE = os.path.dirname(os.path.abspath(__file__))
M, A, B = "127.0.13.1", "127.0.13.2", "127.0.13.3"
INPLACE = ["--engine", "torch", "--resize-mode", "in-place", "--status-interval", "0.3"]


def checkpoints(efs):
    return sorted(n for n in os.listdir(os.path.join(efs, "checkpoints")) if n.startswith("ckpt-"))


def test_the_resize_mode_is_in_place_only_where_the_processes_can_stay():
    assert resize_mode("auto", "torch", "elastic", 1) == "in-place"
    assert resize_mode("auto", "mxnet", "elastic", 1) == "restart"
    assert resize_mode("auto", "torch", "torchrun", 1) == "restart"
    assert resize_mode("auto", "torch", "elastic", 4) == "restart"
    assert resize_mode("auto", "torch", "elastic", 1, gpus=1) == "restart"      # NCCL: not validated yet
    assert resize_mode("in-place", "torch", "elastic", 1, gpus=1) == "in-place"
    assert resize_mode("restart", "torch", "elastic", 1) == "restart"
    with pytest.raises(ValueError):
        resize_mode("in-place", "mxnet", "elastic", 1)
    from dynatrain_runtime.launcher.cli import parse_args
    assert parse_args(["--script", "s.py", "--engine", "torch"]).resize_mode == "auto"
    for refused in (["--engine", "mxnet"], ["--engine", "torch", "--script-api", "torchrun"]):
        with pytest.raises(SystemExit):          # a clear error at the command line, nothing started
            parse_args(["--script", "s.py", "--resize-mode", "in-place"] + refused)


def test_chunks_are_spread_over_every_holder_and_the_newest_boundary_wins():
    plan = chunk_plan(10, 4, [0, 2])
    assert [(s, e) for _i, s, e, _r in plan] == [(0, 4), (4, 8), (8, 10)]
    assert [r for *_x, r in plan] == [0, 2, 0]
    assert agree([5, -1, 5]) == (5, [0, 2], [1])          # a joiner receives
    assert agree([4, 5, 5]) == (5, [1, 2], [0])           # a survivor with an older snapshot receives too


def _peers(script, node_python, port, extra_env, rank_args=lambda rank: []):
    """Run ``script`` as the 3 members of a gloo group; their JSON lines, by rank."""
    env = dict(os.environ, DT_CHUNK_BYTES="20000", **extra_env)
    procs = [subprocess.Popen([node_python, os.path.join(HERE, script), str(r), str(port)] + rank_args(r), env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(3)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()[-3000:]
        outs.append(json.loads(out.decode().strip().splitlines()[-1]))
    return sorted(outs, key=lambda o: o["rank"])


def _transfer(node_python, port, extra_env):
    return _peers("inplace_peer.py", node_python, port, extra_env)


def test_a_joiner_gets_the_state_from_both_holders_and_a_damaged_chunk_is_fetched_again(torch_python):
    clean = _transfer(torch_python, 29741, {})
    assert clean[2]["stats"]["refetched"] == 0 and clean[2]["stats"]["chunks"] == 10
    damaged = _transfer(torch_python, 29751, {"DT_TEST_CORRUPT_CHUNK": "3"})     # holder 1's chunk 3, once
    joiner = damaged[2]
    assert joiner["stats"]["refetched"] == 1, joiner
    assert joiner["meta"] == {"step": 7, "epoch": 1, "pos": 64}
    assert joiner["tensors"] == 8                 # 4 parameters + their 4 momentum buffers
    assert len({o["digest"] for o in damaged}) == 1          # the joiner holds exactly the holders' state
    assert damaged[0]["stats"]["holders"] == [0, 1] and damaged[0]["stats"]["receivers"] == [2]
    # the joiner's received bytes are its first snapshot's memory (no first touch of fresh memory); holders keep none
    assert [o["kept_for_snapshot"] for o in damaged] == [0, 0, 1] and joiner["reused"] and joiner["snapshot_equal"]


def test_a_chunk_damaged_twice_fails_the_transfer_on_every_member_and_none_hangs(torch_python):
    outs = _transfer(torch_python, 29781, {"DT_TEST_CORRUPT_CHUNK": "3:2"})   # holder 1's chunk 3, sent twice damaged
    assert "chunk 3 from rank 1 failed its check twice" in outs[2]["error"], outs
    assert "refused twice by rank 2" in outs[1]["error"], outs
    assert "refused twice by rank 2" in outs[0]["error"], outs      # the other holder hears the verdict too


def test_the_overlap_is_asked_for_unless_turned_off_or_the_optimizer_cannot_wait(monkeypatch):
    from types import SimpleNamespace
    from dynatrain_runtime.script.inplace import InPlaceWorker
    engine = SimpleNamespace(optimizer=SimpleNamespace(register_step_pre_hook=lambda hook: None))
    worker = InPlaceWorker(SimpleNamespace(engine=engine), peer_wait=1)
    monkeypatch.delenv("DT_JOIN_OVERLAP", raising=False)
    assert worker._overlap_wanted()                      # pylint: disable=protected-access
    monkeypatch.setenv("DT_JOIN_OVERLAP", "0")           # the synchronous transfer, as before
    assert not worker._overlap_wanted()                  # pylint: disable=protected-access
    monkeypatch.setenv("DT_JOIN_OVERLAP", "1")
    engine.optimizer = object()                          # no step pre-hook to wait in
    assert not worker._overlap_wanted()                  # pylint: disable=protected-access
    assert worker.healing_ranks(7) == ()


def _overlapped(node_python, port, extra_env, no_overlap_rank=None):
    return _peers("inplace_overlap_peer.py", node_python, port, extra_env,
                  lambda rank: ["0" if rank == no_overlap_rank else "1"])


def test_the_transfer_behind_the_first_step_leaves_the_joiner_bit_equal_after_it(torch_python):
    outs = _overlapped(torch_python, 29761, {"DT_TEST_CORRUPT_CHUNK": "3"})
    holder, joiner = outs[0], outs[2]
    assert all(o["stats"]["overlap"] is True and o["healing"] == [2] for o in outs), outs
    assert joiner["weights"] == [0.0]                         # the joiner's first step: a placeholder
    assert sorted(outs[0]["indices"] + outs[1]["indices"]) == list(range(12))   # the survivors take it all
    assert all(o["global_size"] == 12 for o in outs)
    assert holder["mean_ok"] and outs[1]["mean_ok"]           # DDP's average: the mean over the global batch
    assert joiner["before"] != holder["before"] == outs[1]["before"]   # the state arrived in the step's hook
    assert len({o["after"] for o in outs}) == 1, outs         # after the step: the same state, bit for bit
    assert joiner["lr"] == 0.05                               # this step's LR, not the loaded boundary's
    assert joiner["meta"] == {"step": 7, "epoch": 1, "pos": 64} and joiner["stats"]["refetched"] == 1
    # a step pre-hook the script registered after the transfer's: it ran in both steps, and the transfer's
    # hook, removed at the commit (not inside the optimizer's loop over its hooks), is gone
    assert all(o["script_hook"] == 2 and o["hooks"] == 1 for o in outs), outs


def test_one_member_without_the_overlap_makes_every_member_take_the_synchronous_transfer(torch_python):
    outs = _overlapped(torch_python, 29771, {}, no_overlap_rank=1)     # as DT_JOIN_OVERLAP=0 on that host
    assert all(o["stats"]["overlap"] is False and o["healing"] == [] for o in outs), outs
    assert outs[2]["weights"] == [1.0] * 4 and outs[2]["before"] == outs[0]["before"]   # loaded before it trained
    assert len({o["after"] for o in outs}) == 1 and outs[0]["mean_ok"] and outs[1]["mean_ok"]


def test_in_place_add_and_remove_keep_the_survivors_and_write_no_checkpoint(tmp_path, torch_python, digits_npz):
    efs = str(tmp_path)
    write_hosts(efs, [A, M])
    run = LauncherRun(efs, torch_python, digits_npz,
                      EPOCHS + ["--epochs", "14", "--step-sleep", "0.05", "--checkpoint-every", "0"],
                      launcher_args=INPLACE + ["--env", "DT_TEST_CORRUPT_CHUNK=0", "--env", "DT_CHUNK_BYTES=8192"],
                      port_base=23000)
    try:
        write_warm_request(JobFiles(efs), B)           # as add_workers does: B's process starts before its edit
        wait_for(lambda: len(log_lines(efs)) >= 2, 90, "initial ADDED lines", proc=run.proc)
        settle(efs, 1, 60, 100, run.proc)
        before = {ip: set(pids_of_host(ip, efs)) for ip in (A, M)}
        write_hosts(efs, [A, B, M])                                       # add one
        wait_for(lambda: len(log_lines(efs)) >= 3, 90, "ADDED of the new worker", proc=run.proc)
        wait_for(lambda: len(resize_ends(efs)) >= 1, 60, "the add's first step", proc=run.proc)
        wait_for(lambda: status_step(efs) >= resize_ends(efs)[0]["first_step"] + 20, 60, "steps at world 3",
                 proc=run.proc)
        write_hosts(efs, [B, M])                                          # remove an original one
        wait_for(lambda: len(log_lines(efs)) >= 4, 60, "REMOVED", proc=run.proc)
        rc = run.wait(240)
        assert rc == 0, run.tail()
    finally:
        run.close()
    assert [l[1:3] for l in log_lines(efs)] == [["ADDED", A], ["ADDED", M], ["ADDED", B], ["REMOVED", A]]
    ends = resize_ends(efs)
    assert [(e["from_world"], e["world"]) for e in ends] == [(2, 3), (3, 2)], ends
    add, remove = ends
    for e in ends:
        assert e["mode"] == "in-place" and e["checkpoint_written"] is False, e
        assert e["recomputed_steps"] == 0 and e["first_step"] == e["resume_step"] + 1 > 1, e
    assert add["pids"][M] in before[M] and add["pids"][A] in before[A], (add["pids"], before)   # the same process
    assert remove["pids"][M] == add["pids"][M] and remove["pids"][B] == add["pids"][B]
    assert add["bytes_moved"] > 0 and add["refetched"] == 1 and add["chunks"] >= 2, add    # chunk 0 refused once
    assert add["transfer_overlapped"] is True and add["transfer_s"] > 0, add      # behind the first step
    assert remove["bytes_moved"] == 0 and remove["transfer_overlapped"] is False
    gens = [e for e in events(efs) if e["event"] == "generation_start"]
    assert [g.get("inplace", False) for g in gens] == [False, True, True]
    assert gens[1]["joiners"] == [B] and gens[2]["joiners"] == []
    meta = latest_meta(efs)
    assert checkpoints(efs) == ["ckpt-%010d" % meta["step"]], checkpoints(efs)    # only the final one
    audit_ok(meta, epochs=14)
    committed_once(meta)
    worlds = [r["world"] for r in meta["audit"]["steps"]]
    assert set(worlds[:add["resume_step"]]) == {2}
    assert set(worlds[add["resume_step"]:remove["resume_step"]]) == {3}
    assert set(worlds[remove["resume_step"]:]) == {2}
    print("in place: add %.3f s pause (%d bytes in %.3f s), remove %.3f s pause"
          % (add["pause_s"], add["bytes_moved"], add["transfer_s"], remove["pause_s"]))


def _b_lost_and_recovered_in_place(efs):
    """After worker B of A, B, M was lost: the DT log says so, no checkpoint was written for the recovery, and
    one in-place regroup took the job to world 2. (the events, that regroup's resize_end)"""
    assert [l[1:3] for l in log_lines(efs)] == [["ADDED", A], ["ADDED", B], ["ADDED", M], ["FAILED", B]]
    evs = events(efs)
    assert not [e for e in evs if e["event"] in ("recovery_checkpoint", "recovery_unavailable")]
    ends = resize_ends(efs)
    assert len(ends) == 1 and ends[0]["mode"] == "in-place" and ends[0]["world"] == 2, ends
    return evs, ends[0]


def test_in_place_a_killed_worker_is_recovered_by_the_survivors_in_their_processes(
        tmp_path, torch_python, digits_npz):
    efs = str(tmp_path)
    write_hosts(efs, [A, B, M])
    run = LauncherRun(efs, torch_python, digits_npz,
                      EPOCHS + ["--epochs", "10", "--step-sleep", "0.05", "--checkpoint-every", "0"],
                      launcher_args=INPLACE, port_base=23500)
    try:
        wait_for(lambda: len(log_lines(efs)) >= 3, 90, "initial ADDED lines", proc=run.proc)
        settle(efs, 1, 60, 100, run.proc)
        wait_for(lambda: status_step(efs) >= 40, 60, "step 40", proc=run.proc)
        before = {ip: set(pids_of_host(ip, efs)) for ip in (A, M)}
        for pid in pids_of_host(B, efs):                                  # the worker host dies
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: len(log_lines(efs)) >= 4, 30, "FAILED", proc=run.proc)
        rc = run.wait(240)
        assert rc == 0, run.tail()
    finally:
        run.close()
    evs, end = _b_lost_and_recovered_in_place(efs)
    starts = [e for e in evs if e["event"] == "resize_start"]
    assert len(starts) == 1 and starts[0]["recovered_from"] == "in-place", starts
    assert end["pids"][M] in before[M] and end["pids"][A] in before[A], (end["pids"], before)
    assert end["recomputed_steps"] <= 1 and end["first_step"] == end["resume_step"] + 1
    assert end["transfer_overlapped"] is False
    assert not [e for e in evs if e["event"] == "worker_failed" and e["ip"] != B]
    meta = latest_meta(efs)
    assert checkpoints(efs) == ["ckpt-%010d" % meta["step"]]
    audit_ok(meta, epochs=10)                                             # the step in flight redone once
    committed_once(meta)
    print("in place: kill -> first step at world 2 in %.3f s (pause %.3f s), %d step(s) redone"
          % (end["total_s"], end["pause_s"], end["recomputed_steps"]))


def test_a_worker_killed_after_the_gradient_exchange_costs_the_survivors_no_step(tmp_path, torch_python, digits_npz):
    """B dies after step DIE's update, before its commit's all-reduce (the audit's, every step): the survivors'
    exchange of that step completed, so they keep it instead of going back to a boundary snapshot."""
    die = 40
    efs = str(tmp_path)
    write_hosts(efs, [A, B, M])
    run = LauncherRun(efs, torch_python, digits_npz,
                      EPOCHS + ["--epochs", "6", "--step-sleep", "0.05", "--checkpoint-every", "0"],
                      launcher_args=INPLACE + ["--env", "DT_TEST_DIE_AFTER_UPDATE=%s:%d" % (B, die)],
                      port_base=23600)
    try:
        wait_for(lambda: len(log_lines(efs)) >= 4, 120, "FAILED", proc=run.proc)
        rc = run.wait(240)
        assert rc == 0, run.tail()
    finally:
        run.close()
    end = _b_lost_and_recovered_in_place(efs)[1]
    # the step B died in is committed by the survivors: they go on from the boundary after it, redo nothing
    assert end["resume_step"] == die + 1 and end["first_step"] == die + 2, end
    assert end["recomputed_steps"] == 0, end
    meta = latest_meta(efs)
    audit_ok(meta, epochs=6)                      # every sample once per epoch: the kept step counted once
    committed_once(meta)
    kept = [r for r in meta["audit"]["steps"] if r["step"] == die]
    assert len(kept) == 1 and kept[0]["world"] == 3, kept     # recorded as the old group's step
    print("in place: killed after step %d's exchange -> resumed at %d, %d step(s) redone, pause %.3f s"
          % (die, end["resume_step"], end["recomputed_steps"], end["pause_s"]))


def test_a_regroup_that_fails_falls_back_to_the_restart_path_from_a_survivors_state(
        tmp_path, torch_python, digits_npz):
    efs = str(tmp_path)
    write_hosts(efs, [A, M])
    run = LauncherRun(efs, torch_python, digits_npz,
                      EPOCHS + ["--epochs", "8", "--step-sleep", "0.05", "--checkpoint-every", "0"],
                      launcher_args=INPLACE + ["--env", "DT_TEST_REGROUP_FAIL=%s" % A], port_base=23700)
    try:
        write_warm_request(JobFiles(efs), B)
        wait_for(lambda: len(log_lines(efs)) >= 2, 90, "initial ADDED lines", proc=run.proc)
        settle(efs, 1, 60, 60, run.proc)
        write_hosts(efs, [A, B, M])                  # A's regroup fails: the job goes on by the restart path
        wait_for(lambda: len(log_lines(efs)) >= 3, 120, "ADDED of the new worker", proc=run.proc)
        rc = run.wait(240)
        assert rc == 0, run.tail()
    finally:
        run.close()
    assert [l[1:3] for l in log_lines(efs)] == [["ADDED", A], ["ADDED", M], ["ADDED", B]]   # nobody FAILED
    evs = events(efs)
    gens = [e for e in evs if e["event"] == "generation_start"]
    assert [g.get("inplace", False) for g in gens] == [False, True, False], gens
    wrote = [e for e in evs if e["event"] == "recovery_checkpoint"]
    assert len(wrote) == 1 and gens[2]["resume_path"] and gens[2]["resume_step"] == wrote[0]["step"], (wrote, gens)
    failed = [e for e in evs if e["event"] == "worker_failed"]
    assert len(failed) == 1 and failed[0]["ip"] == M and not failed[0]["dropped"]
    assert "regroup failed" in failed[0]["reason"]
    assert gens[2]["membership"] == [A, B, M]
    meta = latest_meta(efs)
    audit_ok(meta, epochs=8)
    committed_once(meta)


@pytest.mark.parametrize("overlap", ["1", "0"])
def test_a_holder_killed_while_it_sends_the_joiner_its_chunks_costs_the_job_only_that_worker(
        tmp_path, torch_python, digits_npz, overlap):
    """B joins A and M; A dies once it has posted 3 of its chunks (many small ones), behind the first step at world
    3 (the default) or before it (DT_JOIN_OVERLAP=0). The joiner's failed receive reaches the launcher before A's
    exit: A's death, not the group, is the failure (FAILED A, A dropped), and M's boundary state carries the job on
    with B (B's half-filled buffer never becomes its state; before the group's first step the fallback is the
    restart path from M's snapshot): every sample once per epoch, the DT log exact -- B is ADDED when it trains."""
    efs = str(tmp_path)
    write_hosts(efs, [A, M])
    run = LauncherRun(efs, torch_python, digits_npz,
                      EPOCHS + ["--epochs", "8", "--step-sleep", "0.05", "--checkpoint-every", "0"],
                      launcher_args=INPLACE + ["--env", "DT_TEST_DIE_SENDING=%s:3" % A, "--env", "DT_CHUNK_BYTES=4096",
                                               "--env", "DT_JOIN_OVERLAP=" + overlap],
                      port_base=23800 + 50 * int(overlap))
    try:
        write_warm_request(JobFiles(efs), B)
        wait_for(lambda: len(log_lines(efs)) >= 2, 90, "initial ADDED lines", proc=run.proc)
        settle(efs, 1, 60, 60, run.proc)
        write_hosts(efs, [A, B, M])                  # A dies sending B its part of the state
        wait_for(lambda: len(log_lines(efs)) >= 4, 120, "FAILED", proc=run.proc)
        rc = run.wait(240)
        assert rc == 0, run.tail()
    finally:
        run.close()
    assert [l[1:3] for l in log_lines(efs)] == [["ADDED", A], ["ADDED", M], ["FAILED", A], ["ADDED", B]]
    failed = [e for e in events(efs) if e["event"] == "worker_failed"]
    assert [(e["ip"], e["dropped"]) for e in failed] == [(A, True)], failed
    last = resize_ends(efs)[-1]
    assert last["world"] == 2 and last["removed"] == [A] and last["recomputed_steps"] <= 1, last
    meta = latest_meta(efs)
    audit_ok(meta, epochs=8)
    committed_once(meta)
    assert {r["world"] for r in meta["audit"]["steps"]} >= {2}


def test_the_metrics_show_the_bytes_moved_and_the_pause_of_in_place_changes():
    from dynatrain_runtime.launcher.metrics import Metrics
    m = Metrics()
    m.observe("resize_end", {"mode": "in-place", "bytes_moved": 1000, "pause_s": 0.3, "transfer_s": 0.1,
                             "transfer_mb_s": 0.01})
    m.observe("resize_end", {"mode": "in-place", "bytes_moved": 500, "pause_s": 0.2, "transfer_s": 0.05,
                             "transfer_mb_s": None})
    text = m.render({"state": "running"})
    assert "dynatrain_peer_transfer_bytes_total 1500" in text, text
    assert "dynatrain_resize_pause_seconds 0.2" in text
    assert "dynatrain_resize_transfer_mb_per_second 0" in text
