"""Several torch processes per node (``--procs-per-node``: one per GPU, ``LOCAL_RANK``), as torchrun runs them.

The launcher keeps one process per host (the child wrapper); the wrapper runs the node's N processes
with their own ``RANK``/``LOCAL_RANK`` and merges their messages into the host's.  The pure parts
(the environment, the merge, the option), the wrapper with a stand-in script, and one real torch job
(CPU, gloo) of 2 hosts x 2 processes: a host added (world 6), a local process killed (its host lost,
the survivors' state resumed), every sample used exactly once.  Every wait is bounded.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import LauncherRun, events, latest_meta, log_lines, wait_for, write_hosts

from dynatrain_runtime.launcher.localgroup import Merge, exit_status, route
from dynatrain_runtime.launcher.torchenv import local_env, node_gpus, procs_per_node, torch_worker_env
from dynatrain_runtime.contract.protocol import EXIT_STOPPED
from test_recovery import committed_once, failure_records, status_step
from test_torch_engine import EPOCHS, audit_ok, resize_ends, status, torch_python  # noqa: F401  pylint: disable=unused-import

M, A, B = "127.0.14.1", "127.0.14.2", "127.0.14.3"
PER_NODE = ["--engine", "torch", "--procs-per-node", "2"]


# ---------------------------------------------------------------------- the environment (pure)
def test_each_local_process_gets_torchruns_ranks():
    env = torch_worker_env([A, B, M], M, 9007, 3, procs=2)
    assert {h: (e["RANK"], e["GROUP_RANK"]) for h, e in env.items()} == {M: ("0", "0"), A: ("2", "1"), B: ("4", "2")}
    for e in env.values():
        assert (e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["GROUP_WORLD_SIZE"], e["ROLE_WORLD_SIZE"]) == ("6", "2", "3", "6")
        assert e["MASTER_ADDR"] == M and e["MASTER_PORT"] == "9007" and e["LOCAL_RANK"] == "0"
    ranks = [(int(local_env(env[h], i)["RANK"]), h, i) for h in (M, A, B) for i in (0, 1)]
    assert [r for r, _h, _i in ranks] == list(range(6))            # the master's local rank 0 is RANK 0
    one = local_env(env[B], 1)
    assert (one["RANK"], one["ROLE_RANK"], one["LOCAL_RANK"], one["GROUP_RANK"]) == ("5", "5", "1", "2")
    assert env[B]["RANK"] == "4" and env[B]["LOCAL_RANK"] == "0"   # the node's own is left alone
    # one process per node: exactly the environment of before
    single = torch_worker_env([A, M], M, 9001, 1)
    assert {h: (e["RANK"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]) for h, e in single.items()} == \
        {M: ("0", "2", "1"), A: ("1", "2", "1")}
    # a pre-started process (no RANK yet): its local rank and size only
    assert local_env({"DT_ASSIGN": "stdin"}, 1, 2) == {"DT_ASSIGN": "stdin", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}


def test_procs_per_node_auto_is_the_usable_gpu_count_and_mxnet_always_one():
    assert procs_per_node("auto", "torch", gpus=8) == 8
    assert procs_per_node("auto", "torch", gpus=0) == 1               # a CPU node
    assert procs_per_node(3, "torch", gpus=0) == 3                    # N on CPU: gloo
    assert procs_per_node("auto", "mxnet", gpus=8) == procs_per_node(4, "mxnet") == 1

    class Smi(object):
        def __init__(self, n, rc=0):
            self.stdout, self.returncode = "".join("GPU %d: NVIDIA H100 (UUID: x)\n" % i for i in range(n)), rc

    assert node_gpus({"DT_NODE_ENV_FILE": "/nonexistent"}, run=lambda *a, **k: Smi(8)) == 8
    assert node_gpus({"DEEPLEARNING_WORKER_GPU_COUNT": "4"}, run=lambda *a, **k: Smi(8)) == 4
    assert node_gpus({"DEEPLEARNING_WORKER_GPU_COUNT": "8", "CUDA_VISIBLE_DEVICES": "0,1"},
                     run=lambda *a, **k: Smi(8)) == 2
    assert node_gpus({"DEEPLEARNING_WORKER_GPU_COUNT": "8"}, run=lambda *a, **k: Smi(8, rc=9)) == 0

    def missing(*_a, **_k):
        raise FileNotFoundError("nvidia-smi")
    assert node_gpus({"DEEPLEARNING_WORKER_GPU_COUNT": "8"}, run=missing) == 0


def test_the_option_and_the_launchers_generation(tmp_path):
    from dynatrain_runtime.launcher import loop, parse_args
    from test_torch_engine import FakeProc
    with pytest.raises(SystemExit):
        parse_args(["--script", "x.py", "--engine", "mxnet", "--procs-per-node", "2"])
    with pytest.raises(SystemExit):
        parse_args(["--script", "x.py", "--engine", "torch", "--procs-per-node", "0"])
    assert parse_args(["--script", "x.py"]).procs_per_node == "auto"
    la = loop.Launcher(parse_args(["--efs-mount", str(tmp_path), "--script", "train.py", "--transport", "local",
                                   "--master", M, "--port-base", "9000"] + PER_NODE))
    assert la.procs == 2
    taken = []
    la.spares.take = lambda host, kind: taken.append(FakeProc(host, kind)) or taken[-1]
    g = la.strategy.start([A, B, M])
    assert g.world == 6 and la._snapshot()["world_size"] == 6 and la._snapshot()["procs_per_node"] == 2
    env = {p.host: p.assigned[2] for p in taken}
    assert [env[h]["RANK"] for h in (M, A, B)] == ["0", "2", "4"] and env[A]["WORLD_SIZE"] == "6"
    start = [e for e in events(str(tmp_path)) if e["event"] == "generation_start"]
    assert start[0]["world"] == 6 and start[0]["procs_per_node"] == 2
    cmd = la.transport.command(A, ["python", "train.py"], {}, procs=la.procs)
    assert cmd[cmd.index("--procs") + 1] == "2"
    assert "--procs" not in la.transport.command(A, ["python", "-m", "dynatrain_runtime.engines.mxnet_serve"], {})
    mx = loop.Launcher(parse_args(["--efs-mount", str(tmp_path), "--script", "train.py", "--transport", "local"]))
    assert mx.procs == 1


# ---------------------------------------------------------------------- the wrapper's merge (pure)
def test_the_host_says_stopped_and_done_only_once_every_local_process_did():
    m = Merge(2)
    assert m.take(1, {"kind": "ready"}) == [] and m.take(0, {"kind": "ready"}) == [{"kind": "ready"}]
    assert m.take(0, {"kind": "alive"}) == [] and m.take(0, {"kind": "alive"}) == []
    assert m.take(1, {"kind": "alive"}) == [{"kind": "alive"}] and m.take(1, {"kind": "alive"}) == []
    assert m.take(1, {"kind": "hb", "rank": 3, "step": 4}) == []                       # local rank 0's only
    assert m.take(0, {"kind": "hb", "rank": 2, "step": 4}) == [{"kind": "hb", "rank": 2, "step": 4}]
    assert m.take(0, {"kind": "stop_ack", "rank": 2, "step": 7}) == []
    assert m.take(1, {"kind": "stop_ack", "rank": 3, "step": 8}) == [{"kind": "stop_ack", "rank": 2, "step": 8}]
    stopped = {"kind": "hb", "state": "stopped", "rank": 2, "step": 9}
    assert m.take(0, stopped) == [{"kind": "alive", "by": "wrapper"}]       # local 1 was alive since the last
    assert m.take(0, {"kind": "hb", "rank": 2, "step": 9}) == []
    assert m.take(1, dict(stopped, rank=3)) == [stopped]
    # the master's rank 1 stopped (it may exit) while its rank 0 still writes the stop checkpoint: alive
    m = Merge(2)
    assert m.take(0, {"kind": "alive"}) == [] and m.take(1, dict(stopped, rank=1))[0]["kind"] == "alive"
    assert m.take(0, {"kind": "alive"}) == [{"kind": "alive"}] and m.take(0, {"kind": "alive"}) == [{"kind": "alive"}]
    assert m.take(0, dict(stopped, rank=0)) == [dict(stopped, rank=0)]
    m = Merge(2)
    assert m.take(1, {"kind": "done", "step": 9}) == [] and m.take(0, {"kind": "done", "step": 8})[0]["step"] == 9
    assert m.take(0, {"kind": "checkpoint", "path": "p"}) == [{"kind": "checkpoint", "path": "p"}]
    assert [i for i, _line in route(b'{"kind": "recover", "generation": 1}\n', 2)] == [0]      # one writer
    assert [i for i, _line in route(b'{"kind": "stop", "generation": 1}\n', 2)] == [0, 1]
    assigned = [json.loads(line)["env"] for _i, line in route(
        (json.dumps({"kind": "assign", "env": torch_worker_env([A, M], M, 1, 1, 2)[A]}) + "\n").encode(), 2)]
    assert [(e["RANK"], e["LOCAL_RANK"]) for e in assigned] == [("2", "0"), ("3", "1")]
    assert exit_status([0, None]) == (False, None) and exit_status([0, EXIT_STOPPED]) == (True, EXIT_STOPPED)
    assert exit_status([None, 3]) == (True, 3) and exit_status([-9, None]) == (True, 137)
    assert exit_status([0, 0]) == (True, 0)


# ---------------------------------------------------------------------- the wrapper, a stand-in script
FAKE = r"""
import json, os, sys, time
def emit(**m):
    sys.stdout.write("@@DT " + json.dumps(m) + "\n"); sys.stdout.flush()
emit(kind="ready", pid=os.getpid())
os.environ.update(json.loads(sys.stdin.readline())["env"])
r, lr = int(os.environ["RANK"]), os.environ["LOCAL_RANK"]
print("seen", r, lr, os.environ["WORLD_SIZE"], os.environ["LOCAL_WORLD_SIZE"], flush=True)
emit(kind="alive"); emit(kind="hb", state="running", rank=r, step=5)
if os.environ.get("SLEEP_" + lr):
    time.sleep(60)
for line in sys.stdin:
    kind = json.loads(line)["kind"]
    print("got", kind, flush=True)
    if kind == "stop":
        emit(kind="stop_ack", rank=r, step=10 + r)
    if kind == "end":
        break
emit(kind="hb", state="stopped", rank=r, step=11)
emit(kind="done", step=20 + r)
sys.exit(int(os.environ.get("EXIT_" + lr, "0")))
"""


def wrapper(*env):
    cmd = [sys.executable, "-m", "dynatrain_runtime.launcher", "child", "--procs", "2"]
    for item in env:
        cmd += ["--env", item]
    return subprocess.Popen(cmd + ["--", sys.executable, "-c", FAKE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def send(proc, *msgs):
    for msg in msgs:
        proc.stdin.write((json.dumps(msg) + "\n").encode())
    proc.stdin.flush()


def test_the_wrapper_runs_the_nodes_processes_as_one_host():
    node_env = torch_worker_env([A, M], M, 9001, 1, procs=2)[A]
    proc = wrapper()
    try:
        send(proc, {"kind": "assign", "env": node_env}, {"kind": "stop", "generation": 1},
             {"kind": "recover", "generation": 1}, {"kind": "end"})
        rc = proc.wait(timeout=30)
        out = proc.stdout.read().decode().splitlines()
    finally:
        proc.kill()
        proc.wait()
    assert rc == 0, out
    msgs = [json.loads(line[5:]) for line in out if line.startswith("@@DT ")]
    kinds = [m["kind"] for m in msgs]                                 # (local 0's hb may come before 1's ready)
    assert sorted(k for k in kinds if k != "alive") == ["done", "hb", "hb", "ready", "stop_ack"], msgs
    assert "alive" in kinds, msgs
    hbs = [m for m in msgs if m["kind"] == "hb"]
    assert [(m["rank"], m["state"]) for m in hbs] == [(2, "running"), (2, "stopped")]     # local rank 0's
    assert [m["step"] for m in msgs if m["kind"] in ("stop_ack", "done")] == [13, 23]    # the most steps
    assert "[local 0] seen 2 0 4 2" in out and "[local 1] seen 3 1 4 2" in out
    assert "[local 0] got recover" in out and "[local 1] got recover" not in out       # one writer of the state


def test_one_failed_local_process_ends_the_host():
    proc = wrapper("EXIT_1=3", "SLEEP_0=1")
    try:
        send(proc, {"kind": "assign", "env": torch_worker_env([A, M], M, 9001, 1, procs=2)[A]}, {"kind": "end"})
        t0 = time.time()
        rc = proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert rc == 3 and time.time() - t0 < 10                          # the sleeping one was ended


# ---------------------------------------------------------------------- a real torch job, 2 processes per node
PROBE = r"""
import json, os, sys
from dynatrain_runtime.script import elastic
from dynatrain_runtime.contract import protocol

def probe():
    chan = protocol.receive_assignment()
    seen = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                           "DT_GENERATION", "DT_WORKER_IP")}
    seen["pid"] = os.getpid()
    with open(os.path.join(os.environ["EFS_MOUNT"], "seen.jsonl"), "a") as handle:
        handle.write(json.dumps(seen) + "\n")
    return chan

elastic.receive_assignment = probe
from dynatrain_runtime.examples.train_digits import main
sys.exit(main())
"""


def seen(efs):
    try:
        with open(os.path.join(efs, "seen.jsonl")) as handle:
            return [json.loads(line) for line in handle if line.strip()]
    except OSError:
        return []


def test_two_processes_per_node_resize_and_a_lost_local_process(tmp_path, torch_python, digits_npz):
    efs = str(tmp_path)
    probe = os.path.join(efs, "probe_digits.py")
    with open(probe, "w") as handle:
        handle.write(PROBE)
    write_hosts(efs, [A, M])
    run = LauncherRun(efs, torch_python, digits_npz, EPOCHS + ["--epochs", "4", "--step-sleep", "0.05",
                                                               "--checkpoint-every", "0"],
                      launcher_args=PER_NODE + ["--script", probe, "--status-interval", "0.3",
                                                "--no-warm-spares"], port_base=23000)
    try:
        wait_for(lambda: status_step(efs) >= 10, 120, "step 10 at world 4", proc=run.proc)
        write_hosts(efs, [A, B, M])                                       # add a host: world 6
        wait_for(lambda: status(efs).get("generation") == 2 and status_step(efs) >= 35, 120,
                 "generation 2 training", proc=run.proc)
        victim = wait_for(lambda: [s for s in seen(efs) if s["DT_GENERATION"] == "2" and s["DT_WORKER_IP"] == B
                                   and s["LOCAL_RANK"] == "1"], 10, "B's local rank 1")[0]
        os.kill(victim["pid"], signal.SIGKILL)                            # one process of B dies
        wait_for(lambda: len(log_lines(efs)) >= 4, 60, "FAILED", proc=run.proc)
        rc = run.wait(240)
        assert rc == 0, run.tail()
    finally:
        run.close()
    assert [line[1:3] for line in log_lines(efs)] == [["ADDED", A], ["ADDED", M], ["ADDED", B], ["FAILED", B]]
    by_gen = {}
    for s in seen(efs):
        by_gen.setdefault(s["DT_GENERATION"], []).append(s)
    assert sorted(by_gen) == ["1", "2", "3"], by_gen
    for gen, hosts in (("1", [M, A]), ("2", [M, A, B]), ("3", [M, A])):
        got = sorted((int(s["RANK"]), s["DT_WORKER_IP"], s["LOCAL_RANK"], s["GROUP_RANK"]) for s in by_gen[gen])
        assert got == [(2 * n + i, h, str(i), str(n)) for n, h in enumerate(hosts) for i in (0, 1)], (gen, got)
        assert {(s["WORLD_SIZE"], s["LOCAL_WORLD_SIZE"]) for s in by_gen[gen]} == {(str(2 * len(hosts)), "2")}
    evs = events(efs)
    assert next(e for e in evs if e["event"] == "launcher_start")["procs_per_node"] == 2
    assert [e["world"] for e in evs if e["event"] == "generation_start"] == [4, 6, 4]
    assert [(e["from_world"], e["world"]) for e in resize_ends(efs)] == [(4, 6), (6, 4)]
    _evs, start, end = failure_records(efs)
    wrote = [e for e in evs if e["event"] == "recovery_checkpoint"]
    assert len(wrote) == 1 and wrote[0]["failed"] == [B] and wrote[0]["writer"] in (A, M), wrote
    assert start[0]["recovered_from"] == "survivor" and end[0]["recomputed_steps"] <= 1
    assert not [e for e in evs if e["event"] == "worker_failed" and e["ip"] != B]
    meta = latest_meta(efs)
    audit_ok(meta, epochs=4)                                              # every sample once per epoch
    committed_once(meta)
    worlds = [r["world"] for r in meta["audit"]["steps"]]
    assert worlds[0] == 4 and 6 in worlds and worlds[-1] == 4
    st = status(efs)
    assert st["procs_per_node"] == 2 and st["world_size"] == 4 and st["state"] == "finished"


PLAIN = r"""
import json, os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
seen = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "DT_WORKER_IP")}
print(json.dumps(seen) + "|" + str(int(total.item())), flush=True)
dist.destroy_process_group()
"""


def test_a_torchrun_script_gets_a_process_per_local_rank(tmp_path, torch_python):
    from test_torchrun_script import ended, launch
    efs = str(tmp_path)
    script = os.path.join(efs, "plain.py")
    with open(script, "w") as handle:
        handle.write(PLAIN)
    write_hosts(efs, [A, M])
    proc, log = launch(efs, torch_python, script, [], 23500, extra=["--procs-per-node", "2"])
    rc = ended(proc, log, 120)
    with open(os.path.join(efs, "launcher.out")) as handle:
        out = handle.read()
    assert rc == 0, out[-3000:]
    got = sorted(line.split("] ", 2)[2] for line in out.splitlines() if "[local " in line and "|" in line)
    seen = [(json.loads(g.split("|")[0]), g.split("|")[1]) for g in got]
    assert sorted((int(s["RANK"]), s["DT_WORKER_IP"], s["LOCAL_RANK"]) for s, _t in seen) == \
        [(0, M, "0"), (1, M, "1"), (2, A, "0"), (3, A, "1")], out[-3000:]
    assert {(s["WORLD_SIZE"], s["LOCAL_WORLD_SIZE"], t) for s, t in seen} == {("4", "2", "6")}   # 0+1+2+3
    assert status(efs)["state"] == "finished" and status(efs)["world_size"] == 4
