"""The torch engine (``--engine torch``): real PyTorch (CPU build, gloo) jobs on 127.x "hosts" with the local
transport, plus its gradient semantics and checkpoint loading.

Every wait is bounded; the resize and recovery tests print their latencies (``pytest -s`` shows them).
"""
import json
import os
import subprocess
import textwrap
import time

import pytest

from conftest import (ROOT, LauncherRun, audit_ok, events, latest_meta, log_lines, torch_python,  # noqa: F401  pylint: disable=unused-import
                      wait_for, write_hosts)

from dynatrain_runtime.contract.shared_volume import JobFiles, write_warm_request
from test_local_runs import final
from test_recovery import committed_once, status_step

EPOCHS = ["--epochs", "5", "--seed", "42", "--global-batch", "64", "--lr", "0.1"]
TORCH = ["--engine", "torch"]
M, A, B = "127.0.12.1", "127.0.12.2", "127.0.12.3"


def status(efs):
    try:
        with open(os.path.join(efs, "status.json")) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def spares_warm(efs, generation):
    """Generation ``generation`` trains and every spare it wants is warm (the next change is a reconnect)."""
    s = status(efs)
    members_ready = s.get("spares_ready", 0) - len(s.get("joiners_warm") or [])   # a joiner's is no member's
    return (s.get("generation") == generation and s.get("state") == "running"
            and s.get("spares_wanted", 0) > 0 and members_ready >= s["spares_wanted"])


def settle(efs, generation, timeout, before_step, proc):
    """Wait (bounded) until generation ``generation``'s spares are warm, so the next change measures a
    reconnect, not an import of torch; go on regardless after ``timeout`` s or once ``before_step`` is
    reached (a busy machine: the change must still come mid-run).  Returns whether they were warm."""
    deadline = time.time() + timeout
    while time.time() < deadline and status_step(efs) < before_step:
        assert proc.poll() is None, "launcher exited while the spares warmed"
        if spares_warm(efs, generation):
            return True
        time.sleep(0.2)
    return spares_warm(efs, generation)


def resize_ends(efs):
    return [e for e in events(efs) if e["event"] == "resize_end"]


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory, torch_python, digits_npz):
    efs = str(tmp_path_factory.mktemp("efs_torch"))
    write_hosts(efs, [A, B, M])
    run = LauncherRun(efs, torch_python, digits_npz, EPOCHS, launcher_args=TORCH, port_base=21000)
    try:
        rc = run.wait(180)
        assert rc == 0, run.tail()
    finally:
        run.close()
    return efs


def test_torch_job_on_three_hosts_reaches_90_percent_with_a_clean_audit(torch_run):
    efs = torch_run
    res = final(efs)
    assert res["val_acc"] >= 0.90, res
    assert res["engine"] == "torch" and res["epochs"] == 5 and res["world_at_end"] == 3
    assert [l[1:3] for l in log_lines(efs)] == [["ADDED", A], ["ADDED", B], ["ADDED", M]]
    meta = latest_meta(efs)
    audit_ok(meta)
    committed_once(meta)
    assert meta["engine"] == "torch" and {r["world"] for r in meta["audit"]["steps"]} == {3}
    evs = events(efs)
    assert next(e for e in evs if e["event"] == "launcher_start")["engine"] == "torch"
    gen = next(e for e in evs if e["event"] == "generation_start")
    assert gen["engine"] == "torch" and gen["servers"] == [] and gen["membership"] == [A, B, M]
    assert [e["epoch"] for e in evs if e["event"] == "epoch"] == list(range(5))
    assert not [e for e in evs if e["event"] == "worker_failed"]
    st = status(efs)
    assert st["engine"] == "torch" and st["state"] == "finished"
    ckpt = os.path.join(efs, "checkpoints", "ckpt-%010d" % meta["step"])
    assert {"model.pt", "optimizer.pt", "meta.json"} <= set(os.listdir(ckpt))


def test_torch_resize_up_and_down_continues_from_the_same_step(tmp_path, torch_python, digits_npz):
    efs = str(tmp_path)
    write_hosts(efs, [A, M])
    # 690 steps of >= 0.1 s: room for the spares to warm between the changes on 2 busy cores
    run = LauncherRun(efs, torch_python, digits_npz, EPOCHS + ["--epochs", "30", "--step-sleep", "0.1",
                                                               "--checkpoint-every", "0"],
                      launcher_args=TORCH + ["--status-interval", "0.3"], port_base=21500)
    try:
        write_warm_request(JobFiles(efs), B)           # as add_workers does: B's process starts before its edit
        wait_for(lambda: len(log_lines(efs)) >= 2, 90, "initial ADDED lines", proc=run.proc)
        warm = [settle(efs, 1, 60, 250, run.proc)]
        write_hosts(efs, [A, B, M])                                       # add one
        wait_for(lambda: len(log_lines(efs)) >= 3, 90, "ADDED of the new worker", proc=run.proc)
        warm.append(settle(efs, 2, 60, 550, run.proc))
        write_hosts(efs, [B, M])                                          # remove an original one
        wait_for(lambda: len(log_lines(efs)) >= 4, 60, "REMOVED", proc=run.proc)
        rc = run.wait(180)
        assert rc == 0, run.tail()
    finally:
        run.close()
    assert [l[1:3] for l in log_lines(efs)] == [["ADDED", A], ["ADDED", M], ["ADDED", B], ["REMOVED", A]]
    ends = resize_ends(efs)
    assert [(e["from_world"], e["world"]) for e in ends] == [(2, 3), (3, 2)], ends
    for e, was_warm in zip(ends, warm):
        assert e["recomputed_steps"] == 0 and e["first_step"] == e["resume_step"] + 1 > 1, e
        print("torch resize %d -> %d: stop %.2f s + restart %.2f s = %.2f s (change to first step %.2f s, "
              "of which waiting for the joiner to warm %.2f s; spares %s); phases %s"
              % (e["from_world"], e["world"], e["stop_s"], e["first_step_s"], e["stop_s"] + e["first_step_s"],
                 e["total_s"], e.get("warm_wait_s", 0.0), "warm" if was_warm else "NOT warm (busy machine)",
                 e.get("phases")))
    meta = latest_meta(efs)
    audit_ok(meta, epochs=30)
    committed_once(meta)                                                  # 0 recomputed steps
    worlds = [r["world"] for r in meta["audit"]["steps"]]
    assert worlds[:ends[0]["resume_step"]] == [2] * ends[0]["resume_step"]
    assert set(worlds[ends[0]["resume_step"]:ends[1]["resume_step"]]) == {3}
    assert set(worlds[ends[1]["resume_step"]:]) == {2}
    assert final(efs)["val_acc"] >= 0.90


def test_torch_spot_drain_leaves_at_the_next_step_with_nothing_recomputed(tmp_path, torch_python, digits_npz):
    from dynatrain_runtime.contract.shared_volume import read_drain_requests, write_drain_request
    efs = str(tmp_path)
    write_hosts(efs, [A, B, M])
    run = LauncherRun(efs, torch_python, digits_npz, EPOCHS + ["--epochs", "8", "--step-sleep", "0.1",
                                                               "--checkpoint-every", "0"],
                      launcher_args=TORCH + ["--status-interval", "0.3"], port_base=22500)
    try:
        wait_for(lambda: len(log_lines(efs)) >= 3, 90, "initial ADDED lines", proc=run.proc)
        wait_for(lambda: status_step(efs) >= 30, 60, "step 30", proc=run.proc)
        settle(efs, 1, 60, 120, run.proc)
        write_drain_request(JobFiles(efs), B, "spot", notice={"action": "terminate"})
        asked = time.time()
        wait_for(lambda: len(log_lines(efs)) >= 4, 60, "REMOVED of the drained worker", proc=run.proc)
        drained_s = time.time() - asked
        rc = run.wait(180)
        assert rc == 0, run.tail()
    finally:
        run.close()
    assert [l[1:3] for l in log_lines(efs)] == [["ADDED", A], ["ADDED", B], ["ADDED", M], ["REMOVED", B]]
    assert drained_s < 60, drained_s                                      # well inside the two-minute notice
    assert read_drain_requests(JobFiles(efs)) == {}
    evs = events(efs)
    removed = [e for e in evs if e["event"] == "host_worker_log" and e["log_event"] == "REMOVED"]
    assert removed[0]["ip"] == B and removed[0]["reason"] == "spot"
    end = next(e for e in evs if e["event"] == "resize_end" and e.get("reason") == "drain")
    assert end["recomputed_steps"] == 0 and end["first_step"] == end["resume_step"] + 1 > 1
    print("torch spot drain: notice to REMOVED %.2f s, stop %.2f s + restart %.2f s"
          % (drained_s, end["stop_s"], end["first_step_s"]))
    meta = latest_meta(efs)
    audit_ok(meta, epochs=8)
    committed_once(meta)


# ---------------------------------------------------------------------- the engine's parts, real torch
GRADIENT_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    from dynatrain_runtime.engines.torch import TorchEngine
    torch.manual_seed(0)
    x, y = torch.randn(3, 5), torch.tensor([0, 2, 1])
    def net():
        torch.manual_seed(1)
        return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    ref = net()                                           # one worker, the whole global batch: the mean
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    eng = TorchEngine()
    model = net()
    eng.bind(model, torch.optim.SGD(model.parameters(), lr=0.1))
    eng.after_load(3)
    # uneven shares of a global batch of 3: rank 0 two samples, rank 1 one, rank 2 a placeholder (weight 0)
    idx, w = {0: ([0, 1], [1.0, 1.0]), 1: ([2], [1.0]), 2: ([0], [0.0])}[eng.rank]
    per = torch.nn.functional.cross_entropy(eng.model(x[idx]), y[idx], reduction="none")
    eng.weighted_loss(per, w, eng.grad_scale(eng.world, 3)).backward()
    diff = max(float((a.grad - b.grad).abs().max()) for a, b in zip(model.parameters(), ref.parameters()))
    total = eng.allreduce([float(eng.rank), 1.0])
    print(json.dumps({"rank": eng.rank, "world": eng.world, "diff": diff, "ddp": type(eng.model).__name__,
                      "sum": [float(v) for v in total]}), flush=True)
    os._exit(0)       # (as a worker under the launcher: torch's teardown is slow and may abort at exit)
""")


def test_torch_gradient_is_the_mean_over_the_global_batch(torch_python, tmp_path):
    """DDP averages over the world; ``weighted_loss`` scales so uneven shares and a placeholder give the mean."""
    import socket
    with socket.socket() as probe:                                        # a free port for the store
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    procs = []
    for rank in range(3):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE="3",
                   LOCAL_RANK="0", OMP_NUM_THREADS="1", DT_PG_TIMEOUT="60")
        env.pop("DT_ASSIGN", None)
        procs.append(subprocess.Popen([torch_python, "-c", GRADIENT_SCRIPT], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, cwd=str(tmp_path)))
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err.decode()[-3000:]
            results.append(json.loads(out.decode().strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert sorted(r["rank"] for r in results) == [0, 1, 2]
    for r in results:
        assert r["world"] == 3 and r["ddp"] == "DistributedDataParallel", r
        assert r["diff"] < 1e-6, r
        assert r["sum"] == [3.0, 3.0], r                                  # the metrics all-reduce: a sum


CHECKPOINT_SCRIPT = textwrap.dedent("""
    import json, os, pickle, sys
    import torch
    from dynatrain_runtime.engines.torch import TorchEngine, TorchSnapshot, read_state, save_state
    from dynatrain_runtime.contract.checkpoint import CheckpointStore
    base, marker = sys.argv[1], sys.argv[2]

    class Payload(object):
        def __reduce__(self):                       # what an unpickling load would run
            return (os.system, ("touch " + marker,))

    def build():
        torch.manual_seed(3)
        model = torch.nn.Linear(4, 2)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    model, opt = build()
    model(torch.randn(5, 4)).pow(2).sum().backward()
    opt.step()
    eng = TorchEngine()                             # alone: a world of one, no process group
    good = os.path.join(base, "good")
    os.makedirs(good)
    save_state(good, model.state_dict(), opt.state_dict())
    m2, o2 = build()
    eng.bind(m2, o2)
    eng.load(good)
    same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), m2.state_dict().values()))
    momentum = torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], o2.state_dict()["state"][0]["momentum_buffer"])
    # the snapshot of a boundary is written in the same format and loads the same way
    snap = TorchSnapshot.take(m2, o2, {"step": 7, "epoch": 0, "pos": 35}, None)
    path = snap.write(CheckpointStore(os.path.join(base, "ckpts")), writer="127.0.0.1", rank=0, failed=["x"])
    m3, o3 = build()
    eng.bind(m3, o3)
    eng.load(path)
    snap_same = all(torch.equal(a, b) for a, b in zip(m2.state_dict().values(), m3.state_dict().values()))
    evil = os.path.join(base, "evil")
    os.makedirs(evil)
    state = opt.state_dict()
    state["extra"] = Payload()
    torch.save(model.state_dict(), os.path.join(evil, "model.pt"))
    torch.save(state, os.path.join(evil, "optimizer.pt"))
    try:
        eng.load(evil)
        refused = ""
    except pickle.UnpicklingError as exc:
        refused = str(exc)[:200]
    try:
        read_state(os.path.join(evil, "optimizer.pt"))
        direct = False
    except pickle.UnpicklingError:
        direct = True
    print(json.dumps({"same": same, "momentum": momentum, "snap_same": snap_same, "refused": refused,
                      "direct": direct, "ran": os.path.exists(marker),
                      "files": sorted(os.listdir(path))}))
""")


def test_torch_checkpoints_load_weights_only_and_refuse_pickled_objects(torch_python, tmp_path):
    marker = tmp_path / "payload-ran"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for key in ("DT_ASSIGN", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        env.pop(key, None)
    out = subprocess.run([torch_python, "-c", CHECKPOINT_SCRIPT, str(tmp_path), str(marker)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120, check=False)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    res = json.loads(out.stdout.decode().strip().splitlines()[-1])
    assert res["same"] and res["momentum"] and res["snap_same"], res
    assert res["refused"] and res["direct"], res                         # weights_only: the object is refused
    assert not res["ran"] and not marker.exists()                         # ... and nothing of it ran
    assert {"model.pt", "optimizer.pt", "meta.json"} <= set(res["files"])


# ---------------------------------------------------------------------- the launcher's side, no torch needed
class FakeProc(object):
    def __init__(self, host, kind):
        self.host, self.kind, self.assigned = host, kind, None

    def assign(self, role, generation, env):
        self.assigned = (role, generation, env)
        return True


def test_a_torch_generation_gets_torchruns_environment_and_no_servers(tmp_path):
    from dynatrain_runtime.launcher import loop, parse_args
    from dynatrain_runtime.launcher.torchenv import torch_ranks
    la = loop.Launcher(parse_args(["--efs-mount", str(tmp_path), "--script", "train.py", "--transport", "local",
                                   "--master", M, "--engine", "torch", "--port-base", "9000"]))
    taken = []
    la.spares.take = lambda host, kind: taken.append(FakeProc(host, kind)) or taken[-1]
    la.intake.gen_counter = 6
    g = la.strategy.start([A, B, M])
    assert [p.kind for p in taken] == ["worker"] * 3 and g.servers == []       # no scheduler, no servers
    env = {p.host: p.assigned[2] for p in taken}
    assert [env[h]["RANK"] for h in (M, A, B)] == ["0", "1", "2"]               # the master hosts the store
    for host, e in env.items():
        assert e["WORLD_SIZE"] == "3" and e["LOCAL_RANK"] == "0" and e["LOCAL_WORLD_SIZE"] == "1"
        assert e["MASTER_ADDR"] == M and e["MASTER_PORT"] == str(9000 + 7) and e["DT_GENERATION"] == "7"
        assert e["GROUP_RANK"] == e["RANK"] and e["DT_RESUME"] == "none" and "DMLC_ROLE" not in e
    assert la.static_env(A)["DT_ENGINE"] == "torch"
    g2 = la.strategy.start([A, M])
    assert g2.port == 9008 and torch_ranks([A, M], M) == {M: 0, A: 1}
    assert la.spares.wanted_count() == 0 or all(k[1] == "worker" for k in la.spares.want)
    start = [json.loads(l) for l in open(os.path.join(str(tmp_path), "events.jsonl"))]
    assert [e["engine"] for e in start if e["event"] == "generation_start"] == ["torch", "torch"]


def test_the_runtime_wheel_ships_the_engines_and_a_pinned_torch_extra(tmp_path):
    import sys
    import zipfile
    wheel = subprocess.run([sys.executable, os.path.join(ROOT, "runtime", "build.py"), "--out", str(tmp_path)],
                           check=True, text=True, stdout=subprocess.PIPE).stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        metadata = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    for module in ("engines/__init__", "engines/mxnet", "engines/torch", "launcher/torchenv",
                   "examples/torch_digits"):
        assert f"dynatrain_runtime/{module}.py" in names, module
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    torch_reqs = [line for line in requires if line.startswith("Requires-Dist: torch")]
    assert torch_reqs == ['Requires-Dist: torch==2.13.0; extra == "torch"'], torch_reqs   # exact, extra only
    assert not [line for line in requires if "torch" in line and 'extra == "torch"' not in line]


def test_a_rank_waits_for_the_rendezvous_store_in_steps_of_milliseconds_not_torchs_backoff():
    """A rank other than 0 looks for rank 0's store every 10 ms (torch's own client backs off to ~0.5 s: a
    store up 50 ms late cost its client 0.58 s, the slow first steps of some resizes)."""
    import socket
    import threading
    from dynatrain_runtime.engines.torch import wait_for_store
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    started = threading.Event()

    def store_up_late(late=0.15):
        time.sleep(late)
        with socket.socket() as srv:
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            srv.bind(("127.0.0.1", port))
            srv.listen(4)
            started.set()
            srv.settimeout(2.0)
            try:
                srv.accept()[0].close()
            except OSError:
                pass

    t = threading.Thread(target=store_up_late, daemon=True)
    t0 = time.monotonic()
    t.start()
    assert wait_for_store(env, timeout=5.0) is True
    waited = time.monotonic() - t0
    assert started.is_set() and 0.14 <= waited < 0.4, waited
    t.join(3)
    # nothing listens: it gives up at its timeout (init_process_group then reports the error itself)
    t0 = time.monotonic()
    assert wait_for_store(env, timeout=0.2) is False
    assert time.monotonic() - t0 < 1.0
