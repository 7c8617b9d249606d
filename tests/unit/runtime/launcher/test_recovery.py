"""A lost worker costs at most the step in flight: recovery from a survivor's state, and the fallback.

Real runs (--transport local, 127.x addresses) of both engines' restart path (the torch engine's in place
recovery: test_inplace) plus the launcher's decisions with fake processes.
"""
import json
import os
import signal
import subprocess
import textwrap
import time

import pytest

from conftest import LauncherRun, audit_ok, events, latest_meta, log_lines, pids_of_host, wait_for, write_hosts
from test_local_runs import final

from dynatrain_runtime.launcher import loop, parse_args
from dynatrain_runtime.launcher.generation import Generation

EPOCHS = ["--epochs", "5", "--seed", "42", "--global-batch", "64", "--lr", "0.1"]
M, A, B = "127.0.9.61", "127.0.9.62", "127.0.9.63"


def status_step(efs):
    try:
        with open(os.path.join(efs, "status.json")) as handle:
            return json.load(handle).get("step") or 0
    except (OSError, ValueError):
        return 0


def failure_records(efs):
    evs = events(efs)
    start = [e for e in evs if e["event"] == "resize_start" and e.get("reason") == "failure"]
    end = [e for e in evs if e["event"] == "resize_end" and e.get("reason") == "failure"]
    return evs, start, end


def committed_once(meta):
    steps = [r["step"] for r in meta["audit"]["steps"]]
    assert steps == list(range(len(steps)))              # every step committed exactly once


# One scenario, both engines' restart path: what differs is the run's shape (torch: a longer job, so the kill
# comes mid-run after its warm spares are ready; slower start-up) -- the assertions are the same.
LOST_WORKER = {
    "mxnet": {"python": "node_python", "epochs": 5, "launcher": [], "port_base": 19800, "start": 60, "run": 120},
    "torch": {"python": "torch_python", "epochs": 12, "launcher": ["--engine", "torch", "--resize-mode", "restart"],
              "port_base": 22000, "start": 90, "run": 180},
}


@pytest.mark.parametrize("engine", sorted(LOST_WORKER))
def test_lost_worker_resumes_from_a_survivor(engine, request, tmp_path, digits_npz):
    shape = LOST_WORKER[engine]
    python = request.getfixturevalue(shape["python"])
    efs = str(tmp_path)
    write_hosts(efs, [A, B, M])
    # a checkpoint every 20 steps: a rollback would redo up to 19 steps, a survivor's state none
    run = LauncherRun(efs, python, digits_npz,
                      EPOCHS + ["--epochs", str(shape["epochs"]), "--step-sleep", "0.1", "--checkpoint-every", "20"],
                      launcher_args=shape["launcher"] + ["--status-interval", "0.3"], port_base=shape["port_base"])
    try:
        wait_for(lambda: len(log_lines(efs)) >= 3, shape["start"], "initial ADDED lines", proc=run.proc)
        if engine == "torch":
            from test_torch_engine import settle     # pylint: disable=import-outside-toplevel
            settle(efs, 1, 60, 150, run.proc)       # spares warm: the kill measures recovery, not an import
        wait_for(lambda: status_step(efs) >= 27, 60, "step 27", proc=run.proc)
        wait_for(lambda: status_step(efs) % 20 not in (0, 19), 10, "a step between checkpoints", proc=run.proc)
        pids = wait_for(lambda: pids_of_host(B, efs), 20, "worker processes of %s" % B)
        for pid in pids:                                                 # the worker host dies
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: len(log_lines(efs)) >= 4, 20, "FAILED", proc=run.proc)
        rc = run.wait(shape["run"])
        assert rc == 0, run.tail()
    finally:
        run.close()
    assert [l[1:3] for l in log_lines(efs)] == [["ADDED", A], ["ADDED", B], ["ADDED", M], ["FAILED", B]]
    evs, start, end = failure_records(efs)
    wrote = [e for e in evs if e["event"] == "recovery_checkpoint"]
    assert len(wrote) == 1 and wrote[0]["failed"] == [B] and wrote[0]["writer"] in (A, M), wrote
    assert len(start) == 1 and start[0]["recovered_from"] == "survivor", start
    assert start[0]["resume_step"] == wrote[0]["step"] >= 27
    assert len(end) == 1 and end[0]["recovered_from"] == "survivor", end
    assert end[0]["recomputed_steps"] <= 1 and end[0]["first_step"] == end[0]["resume_step"] + 1
    print("%s lost worker: survivor wrote step %d in %.3f s; failure to first step %.2f s, %d step(s) recomputed"
          % (engine, wrote[0]["step"], wrote[0]["seconds"], end[0]["total_s"], end[0]["recomputed_steps"]))
    gens = [e for e in evs if e["event"] == "generation_start"]
    assert gens[-1]["resume_step"] == wrote[0]["step"] and gens[-1]["membership"] == [A, M]
    assert not [e for e in evs if e["event"] == "worker_failed" and e["ip"] != B]
    meta = latest_meta(efs)
    audit_ok(meta, epochs=shape["epochs"])                               # the lost step's samples redone once
    committed_once(meta)
    worlds = [r["world"] for r in meta["audit"]["steps"]]
    assert worlds.count(3) == wrote[0]["step"] and set(worlds[wrote[0]["step"]:]) == {2}
    assert final(efs)["val_acc"] >= 0.90


def test_frozen_survivor_falls_back_to_the_last_checkpoint(tmp_path, node_python, digits_npz):
    efs = str(tmp_path)
    write_hosts(efs, [A, M])
    # no spares: the master's only training process is the generation's worker, which we freeze
    run = LauncherRun(efs, node_python, digits_npz, EPOCHS + ["--step-sleep", "0.1", "--checkpoint-every", "10"],
                      launcher_args=["--status-interval", "0.3", "--recover-timeout", "2", "--no-warm-spares"],
                      port_base=19900)
    frozen = []
    try:
        wait_for(lambda: len(log_lines(efs)) >= 2, 60, "initial ADDED lines", proc=run.proc)
        wait_for(lambda: status_step(efs) >= 15, 60, "step 15", proc=run.proc)
        frozen = wait_for(lambda: pids_of_host(M, efs), 20, "worker process of %s" % M)
        for pid in frozen:                                               # the survivor cannot answer
            os.kill(pid, signal.SIGSTOP)
        for pid in wait_for(lambda: pids_of_host(A, efs), 20, "worker process of %s" % A):
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: len(log_lines(efs)) >= 3, 20, "FAILED", proc=run.proc)
        rc = run.wait(120)
        assert rc == 0, run.tail()
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        run.close()
    assert [l[1:3] for l in log_lines(efs)] == [["ADDED", A], ["ADDED", M], ["FAILED", A]]
    evs, start, end = failure_records(efs)
    assert not [e for e in evs if e["event"] == "recovery_checkpoint"]
    gave_up = [e for e in evs if e["event"] == "recovery_unavailable"]
    assert len(gave_up) == 1 and gave_up[0]["tried"] == [M] and gave_up[0]["seconds"] < 4, gave_up
    assert start[0]["recovered_from"] == "checkpoint" and start[0]["resume_step"] % 10 == 0, start
    # the steps done since that checkpoint are redone (none when the freeze landed on a checkpoint step)
    assert end[0]["recovered_from"] == "checkpoint" and end[0]["stop_step"] >= 15, end
    assert end[0]["recomputed_steps"] == end[0]["stop_step"] - end[0]["resume_step"] >= 0, end
    meta = latest_meta(efs)
    audit_ok(meta)
    committed_once(meta)


# ---------------------------------------------------------------------- the launcher's side, fake processes
class FakeWorker(object):
    def __init__(self, host, rank, msgq, answer=None, alive=True):
        self.host, self.msgq, self.answer, self._alive = host, msgq, answer, alive
        self.last_hb = {"rank": rank}
        self.sent = []

    def alive(self):
        return self._alive

    def poll(self):
        return None if self._alive else 1

    def send(self, msg):
        self.sent.append(msg)
        if self.answer is not None:
            self.msgq.put((self, dict(self.answer, kind="recovery", generation=msg["generation"])))
        return True


def launcher(efs, *extra):
    return loop.Launcher(parse_args(["--efs-mount", str(efs), "--script", "/bin/true", "--transport", "local",
                                     "--master", M, *extra]))


def test_recover_asks_survivors_in_rank_order_and_reports(tmp_path):
    la = launcher(tmp_path, "--recover-timeout", "1")
    g = Generation(3, [A, B, M], 9000, None)
    la.gen = g
    silent = FakeWorker(M, 0, la.msgq)                                   # rank 0, never answers
    good = FakeWorker(A, 2, la.msgq, {"ok": True, "step": 7, "path": "/x/ckpt-7", "rank": 2})
    g.workers = {A: good, B: FakeWorker(B, 1, la.msgq, alive=False), M: silent}
    assert la.failures.recover(g, {B: "lost"}) is None and silent.sent == []   # no step yet: at the resume point
    g.first_step_at = time.time()
    t0 = time.time()
    answer = la.failures.recover(g, {B: "worker process exited with status 137"})
    assert answer is None and time.time() - t0 < 2          # rank 0 took the whole timeout: fall back
    assert silent.sent and silent.sent[0]["kind"] == "recover" and silent.sent[0]["failed"] == [B]
    assert good.sent == []
    silent.answer = {"ok": False, "reason": "no completed step to give"}
    answer = la.failures.recover(g, {B: "lost"})
    assert answer["ok"] and answer["step"] == 7 and good.sent
    evs = [json.loads(l) for l in open(os.path.join(str(tmp_path), "events.jsonl"))]
    recovery = [e["event"] for e in evs if e["event"].startswith("recovery")]
    assert recovery == ["recovery_unavailable", "recovery_checkpoint"]
    assert loop.Launcher(parse_args(["--efs-mount", str(tmp_path), "--script", "x", "--recovery",
                                     "checkpoint"])).failures.recover(g, {B: "lost"}) is None


# ---------------------------------------------------------------------- the snapshot format, real MXNet
SNAPSHOT_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import mxnet as mx
    from mxnet import autograd, gluon, nd
    from dynatrain_runtime.contract.checkpoint import CheckpointStore
    from dynatrain_runtime.engines.mxnet import MXNetEngine, MXNetSnapshot

    def build():
        mx.random.seed(1)
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Dense(8, activation="relu"), gluon.nn.Dense(3))
        net.initialize(mx.init.Xavier())
        net(nd.zeros((1, 4)))
        tr = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9},
                           kvstore="local", update_on_kvstore=False)
        return net, tr

    def step(net, tr, seed):
        x = nd.arange(20).reshape((5, 4)) / 20.0 + seed
        with autograd.record():
            loss = (net(x) ** 2).sum()
        loss.backward()
        tr.step(5)

    net, tr = build()
    step(net, tr, 0)
    audit = {"steps": [{"step": 0, "epoch": 0, "idx": [1, 2]}], "completed_epochs": []}
    snap = MXNetSnapshot.take(net, tr, {"step": 1, "epoch": 0, "pos": 5, "audit": audit}, audit)
    want = {k: v.data().asnumpy().tolist() for k, v in net._collect_params_with_prefix().items()}
    audit["steps"].append({"step": 1, "epoch": 0, "idx": [3]})          # the next step commits ...
    step(net, tr, 1)                                                     # ... and moves the weights on
    path = snap.write(CheckpointStore(sys.argv[1]), writer="127.0.0.1", rank=0, failed=["127.0.0.2"])
    net2, tr2 = build()
    engine = MXNetEngine(kvstore="local")          # the engine's load: params, then the pickle-free states
    engine.bind(net2, tr2)
    engine.load(path)
    got = {k: v.data().asnumpy().tolist() for k, v in net2._collect_params_with_prefix().items()}
    meta = json.load(open(os.path.join(path, "meta.json")))
    # the resumed trainer continues exactly like the original from the boundary
    step(net2, tr2, 1)
    same = all(abs(a - b) < 1e-6 for k in want
               for a, b in zip(net2._collect_params_with_prefix()[k].data().asnumpy().ravel(),
                               net._collect_params_with_prefix()[k].data().asnumpy().ravel()))
    print(json.dumps({"equal": got == want, "meta": meta, "same_next_step": same,
                      "num_update": tr2._optimizer.num_update, "files": sorted(os.listdir(path))}))
""")


def test_boundary_snapshot_is_a_regular_checkpoint(tmp_path, node_python):
    out = subprocess.run([node_python, "-c", SNAPSHOT_SCRIPT, str(tmp_path / "ckpts")], check=True,
                         stdout=subprocess.PIPE, timeout=120).stdout.decode().strip().splitlines()[-1]
    res = json.loads(out)
    assert res["equal"] and res["same_next_step"] and res["num_update"] == 2, res
    assert res["files"] == ["meta.json", "optimizer.json", "optimizer.states", "params"]     # no pickle
    meta = res["meta"]
    assert meta["step"] == 1 and meta["pos"] == 5
    assert meta["audit"] == {"steps": [{"step": 0, "epoch": 0, "idx": [1, 2]}], "completed_epochs": []}
    assert meta["recovery"]["writer"] == "127.0.0.1" and meta["recovery"]["failed"] == ["127.0.0.2"]
