"""Checkpoints off the training thread (``script/ckpt_writer.py``, issue 41 item 4).

The writer's rules with a fake job (no framework), then real torch workers of the helper API (a world of one,
the node venv): the training thread's stall is the snapshot only; one write in flight, a checkpoint due while
one is being written is an event in events.jsonl; a worker SIGKILLed mid-write leaves the previous checkpoint
the newest; the stop checkpoint, and a periodic one still being written, are complete when the process exits.

The workers' store is slowed where a test needs a write to last (``slow``: seconds after the payload is on
the volume, before its digests, fsync and rename): what a large checkpoint on a busy shared volume costs.
"""
import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from dynatrain_runtime.contract.checkpoint import CheckpointStore, load_meta
from dynatrain_runtime.contract.protocol import EXIT_STOPPED
from dynatrain_runtime.script.ckpt_writer import CheckpointWriteError, CheckpointWriter, background_wanted

WORKER = r'''
import json, os, sys, time
import torch
import torch.nn.functional as F
from torch import nn
from dynatrain_runtime import Elastic

cfg = json.loads(sys.argv[1])
torch.set_num_threads(1)


def say(line):                  # one write per line: the writer's thread prints too
    sys.stdout.flush()
    os.write(1, (line + "\n").encode())


el = Elastic(num_samples=512, global_batch=32, epochs=1000, seed=0, lr=0.01, engine="torch",
             checkpoint_every=cfg["every"], efs_mount=cfg["efs"], keep_checkpoints=10)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, cfg["hidden"]), nn.ReLU(), nn.Linear(cfg["hidden"], 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
model, opt = el.wrap(model, opt)
real_write, active, peak = el.store.write, [0], [0]

def slow_write(step, meta, write_files=None):
    active[0] += 1
    peak[0] = max(peak[0], active[0])
    def files(tmp):
        write_files(tmp)
        say("@@PAYLOAD %d" % step)
        time.sleep(cfg["slow"].get(str(step), cfg["slow"].get("*", 0)))
    try:
        return real_write(step, meta, files)
    finally:
        active[0] -= 1

el.store.write = slow_write
x, y = torch.randn(512, 64), torch.randint(0, 10, (512,))
commits, it = {}, el.batches()
batch = next(it)
while True:
    idx = torch.as_tensor(batch.indices)
    out = model(x[idx])
    opt.zero_grad()
    batch.weighted_loss(F.cross_entropy(out, y[idx], reduction="none")).backward()
    opt.step()
    t1 = time.perf_counter()
    try:
        batch = next(it)                   # commits the step (and takes a checkpoint that is due)
    except StopIteration:
        commits[el.step] = time.perf_counter() - t1
        break
    commits[el.step] = time.perf_counter() - t1
    if cfg.get("check_step") == el.step:   # the boundary's state; training goes on while it is written
        at_boundary = {k: v.clone() for k, v in el.module.state_dict().items()}
    if cfg.get("stop_after") == el.step:   # the launcher's stop / stop_at: stop at the next boundary
        el._on_stop({"generation": 0})
        el._on_stop_at({"generation": 0, "step": el.step + 1})
    if el.step >= cfg["steps"]:
        break
say("@@COMMITS " + json.dumps({"commits": commits, "peak": peak[0]}))
t0 = time.perf_counter()
rc = el.finish()
say("@@FINISHED " + json.dumps({"wait": time.perf_counter() - t0}))
if cfg.get("check_step"):
    saved = torch.load(os.path.join(el.store.path_for(cfg["check_step"]), "model.pt"), weights_only=True)
    now = el.module.state_dict()
    say("@@CONTENT " + json.dumps({"boundary": all(torch.equal(saved[k], v) for k, v in at_boundary.items()),
                                   "later": all(torch.equal(saved[k], v) for k, v in now.items())}))
sys.exit(rc)
'''


MX_WORKER = r'''
import json, os, sys, time
import mxnet as mx
from mxnet import autograd, gluon, nd
from dynatrain_runtime import Elastic

cfg = json.loads(sys.argv[1])
el = Elastic(num_samples=512, global_batch=32, epochs=1000, seed=0, lr=0.01, engine="mxnet",
             checkpoint_every=cfg["every"], efs_mount=cfg["efs"], keep_checkpoints=10)
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Dense(cfg["hidden"], activation="relu"), gluon.nn.Dense(10))
net.initialize(mx.init.Xavier(), ctx=el.ctx)
net(nd.zeros((1, 64), ctx=el.ctx[0]))
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9},
                        kvstore=el.kv, update_on_kvstore=False)
el.attach(net, trainer)
real_write = el.store.write

def slow_write(step, meta, write_files=None):
    def files(tmp):
        write_files(tmp)
        time.sleep(cfg["slow"].get(str(step), 0))
    return real_write(step, meta, files)

el.store.write = slow_write
x, y = nd.random.uniform(shape=(512, 64)), nd.array([i % 10 for i in range(512)])
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
commits, it = {}, el.batches()
batch = next(it)
while True:
    idx = nd.array(batch.indices)
    with autograd.record():
        loss = el.engine.weighted_loss(loss_fn(net(x.take(idx)), y.take(idx)), batch.weights)
    loss.backward()
    trainer.step(batch.global_size)
    t1 = time.perf_counter()
    batch = next(it)
    commits[el.step] = time.perf_counter() - t1
    if el.step == cfg["check_step"]:
        at_boundary = {k: p.data().copy() for k, p in net._collect_params_with_prefix().items()}
        nd.waitall()
    if el.step >= cfg["steps"]:
        break
rc = el.finish()
saved = nd.load(os.path.join(el.store.path_for(cfg["check_step"]), "params"))
now = {k: p.data() for k, p in net._collect_params_with_prefix().items()}
same = lambda a, b: all(float((a[k] - b[k]).abs().max().asscalar()) == 0.0 for k in b)
print("@@COMMITS " + json.dumps({"commits": commits, "peak": 1}), flush=True)
print("@@CONTENT " + json.dumps({"boundary": same(saved, at_boundary), "later": same(saved, now),
                                 "optimizer": sorted(os.listdir(el.store.path_for(cfg["check_step"])))}), flush=True)
sys.exit(rc)
'''


@pytest.fixture(scope="module")
def torch_python(node_python):
    rc = subprocess.call([node_python, "-c", "import torch, dynatrain_runtime.script.ckpt_writer"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if rc != 0:
        pytest.skip("%s cannot import torch and the runtime's ckpt_writer (make runtime node-venv)" % node_python)
    return node_python


def start(torch_python, tmp_path, **cfg):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    cfg = dict({"efs": str(tmp_path), "hidden": 64, "every": 2, "steps": 4, "slow": {}}, **cfg)
    env = dict(os.environ, DT_RECOVERY="checkpoint")      # no recovery snapshots: the checkpoint's cost only
    env.pop("DT_ASSIGN", None)
    if cfg.pop("sync", False):
        env["DT_CHECKPOINT_ASYNC"] = "0"
    return subprocess.Popen([torch_python, str(script), json.dumps(cfg)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=str(tmp_path))


def finish(proc, timeout=120):
    out, _err = proc.communicate(timeout=timeout)
    messages, marks = [], {}
    for line in out.splitlines():
        if line.startswith("@@DT "):
            messages.append(json.loads(line[5:]))
        for mark in ("@@COMMITS ", "@@FINISHED ", "@@CONTENT "):
            if line.startswith(mark):
                marks[mark.strip("@ ")] = json.loads(line[len(mark):])
    return proc.returncode, out, messages, marks


def written(messages):
    return {m["step"]: m for m in messages if m.get("kind") == "checkpoint"}


def events(efs):
    path = os.path.join(str(efs), "events.jsonl")
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def store(efs):
    return CheckpointStore(os.path.join(str(efs), "checkpoints"))


# ----------------------------------------------------------------- the writer's rules (no framework)
def test_one_write_in_flight_and_its_error_raised_next_time():
    release, done = threading.Event(), []
    writer = CheckpointWriter(background=True, on_done=lambda path, s, info: done.append((path, info["step"])))

    assert writer.submit(lambda: release.wait(10) and "p1", {"step": 1})
    assert writer.busy() and writer.writing["step"] == 1
    assert writer.submit(lambda: "p2", {"step": 2}) is False            # refused: nothing queued behind it
    release.set()
    assert writer.wait(10) and not writer.busy()
    assert done == [("p1", 1)]

    def boom():
        raise OSError("No space left on device")
    assert writer.submit(boom, {"step": 3, "reason": "periodic"})
    writer._thread.join(10)                                             # pylint: disable=protected-access
    with pytest.raises(CheckpointWriteError, match="checkpoint 3 .*No space left"):
        writer.submit(lambda: "p4", {"step": 4})                         # raised on the training thread
    assert writer.submit(lambda: "p4", {"step": 4}) and writer.wait(10)  # once said, the next one runs
    assert done[-1] == ("p4", 4)


def test_write_now_waits_for_the_write_in_flight():
    order, release = [], threading.Event()
    writer = CheckpointWriter(background=True)
    writer.submit(lambda: (release.wait(10), order.append("periodic"))[1] or "p", {"step": 2})
    threading.Timer(0.3, release.set).start()
    assert writer.write_now(lambda: order.append("stop") or "s", {"step": 3}) == "s"
    assert order == ["periodic", "stop"]


def test_async_flag():
    assert background_wanted(environ={}) is True
    assert background_wanted(environ={"DT_CHECKPOINT_ASYNC": "0"}) is False
    assert background_wanted(False, environ={}) is False
    with pytest.raises(ValueError, match="DT_CHECKPOINT_ASYNC"):
        background_wanted(environ={"DT_CHECKPOINT_ASYNC": "maybe"})


# ----------------------------------------------------------------- real torch workers
def test_the_training_thread_waits_for_the_snapshot_only(torch_python, tmp_path):
    """~12 MB of state, a write that lasts >= 1.5 s: the checkpointing step returns within a fraction of it;
    the same worker with DT_CHECKPOINT_ASYNC=0 (the synchronous writer) stalls for the whole write."""
    stalls = {}
    for mode in ("async", "sync"):
        efs = tmp_path / mode
        efs.mkdir()
        rc, out, messages, marks = finish(start(torch_python, efs, hidden=20000, every=3, steps=5, check_step=3,
                                                slow={"3": 1.5}, sync=mode == "sync"))
        assert rc == 0, out[-3000:]
        assert marks["CONTENT"] == {"boundary": True, "later": False}   # step 3's state, not step 5's
        ckpt = written(messages)[3]
        assert ckpt["seconds"] >= 1.5, ckpt
        stalls[mode] = marks["COMMITS"]["commits"]["3"]
        assert load_meta(ckpt["path"])["step"] == 3                      # committed and verified
    print("stall per checkpoint: async %.3f s, sync %.3f s" % (stalls["async"], stalls["sync"]))
    assert stalls["sync"] >= 1.5
    assert stalls["async"] < 0.5


def test_mxnet_the_training_thread_waits_for_the_snapshot_only(node_python, tmp_path):
    """The MXNet engine: its boundary snapshot (copies queued on MXNet's engine) written by the writer; the
    checkpointing step returns long before the 1.5 s write ends, and the checkpoint holds that boundary."""
    script = tmp_path / "mx_worker.py"
    script.write_text(MX_WORKER)
    cfg = {"efs": str(tmp_path), "hidden": 2000, "every": 3, "steps": 5, "check_step": 3, "slow": {"3": 1.5}}
    env = dict(os.environ, DT_RECOVERY="checkpoint")
    env.pop("DT_ASSIGN", None)
    proc = subprocess.Popen([node_python, str(script), json.dumps(cfg)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=str(tmp_path))
    rc, out, messages, marks = finish(proc)
    assert rc == 0, out[-3000:]
    ckpt = written(messages)[3]
    assert ckpt["seconds"] >= 1.5 and ckpt["reason"] == "periodic", ckpt
    assert marks["COMMITS"]["commits"]["3"] < 0.5, marks
    assert marks["CONTENT"]["boundary"] is True and marks["CONTENT"]["later"] is False, marks
    assert {"optimizer.json", "optimizer.states", "params", "meta.json"} <= set(marks["CONTENT"]["optimizer"])
    assert load_meta(ckpt["path"])["step"] == 3


def test_a_checkpoint_due_while_one_is_written_is_an_event(torch_python, tmp_path):
    rc, out, messages, marks = finish(start(torch_python, tmp_path, every=2, steps=9, slow={"2": 2.0}))
    assert rc == 0, out[-3000:]
    assert marks["COMMITS"]["peak"] == 1                                 # never two writes at once
    skipped = [e for e in events(tmp_path) if e["event"] == "checkpoint_skipped"]
    assert [e["step"] for e in skipped] == [4, 6, 8], skipped
    assert all(e["writing"] == 2 for e in skipped)
    assert sorted(written(messages)) == [2]
    assert store(tmp_path).latest()[1]["step"] == 2


def test_a_worker_killed_mid_write_leaves_the_previous_checkpoint_newest(torch_python, tmp_path):
    """~90 MB of state: checkpoint 2 is committed, the worker is SIGKILLed while writing the next one (its
    payload on the volume, not yet digested and renamed into place): the newest verifying checkpoint is 2."""
    proc = start(torch_python, tmp_path, hidden=150000, every=2, steps=10 ** 6, slow={"2": 0, "*": 120})
    killed_at = None
    try:
        timer = threading.Timer(180, proc.kill)           # bounded, whatever the worker does
        timer.start()
        for line in proc.stdout:
            if line.startswith("@@PAYLOAD ") and int(line.split()[1]) > 2:
                killed_at = int(line.split()[1])
                os.kill(proc.pid, signal.SIGKILL)
                break
        timer.cancel()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    assert killed_at is not None, "the worker ended before writing a second checkpoint"
    ckpts = os.path.join(str(tmp_path), "checkpoints")
    partial = [n for n in os.listdir(ckpts) if n.startswith(".tmp-ckpt-%010d" % killed_at)]
    assert partial and os.path.getsize(os.path.join(ckpts, partial[0], "model.pt")) > 40e6    # mid-write
    path, meta = store(tmp_path).latest()
    assert meta["step"] == 2 and path.endswith("ckpt-0000000002")
    assert store(tmp_path).steps() == [2]


def test_the_stop_checkpoint_is_complete_at_exit(torch_python, tmp_path):
    """A stop at step 4 while periodic checkpoint 2 is still being written: the stop waits for it (an event),
    writes its own, and the process exits with both committed."""
    rc, out, messages, _marks = finish(start(torch_python, tmp_path, every=2, steps=50, stop_after=3,
                                             slow={"2": 1.5, "4": 1.0}))
    assert rc == EXIT_STOPPED, out[-3000:]
    ckpts = written(messages)
    assert ckpts[4]["reason"] == "stop" and ckpts[2]["reason"] == "periodic"
    waited = [e for e in events(tmp_path) if e["event"] == "checkpoint_waited"]
    assert [(e["step"], e["writing"]) for e in waited] == [(4, 2)]
    path, meta = store(tmp_path).latest()
    assert meta["step"] == 4 and load_meta(ckpts[2]["path"])["step"] == 2
    stopped = [i for i, m in enumerate(messages) if m.get("kind") == "hb" and m.get("state") == "stopped"]
    assert stopped and stopped[0] > messages.index(ckpts[4])           # "stopped" says it is written


def test_a_periodic_write_in_flight_is_complete_at_exit(torch_python, tmp_path):
    rc, out, messages, marks = finish(start(torch_python, tmp_path, every=2, steps=2, slow={"2": 2.0}))
    assert rc == 0, out[-3000:]
    assert marks["COMMITS"]["commits"]["2"] < 1.0                       # the script went on ...
    assert marks["FINISHED"]["wait"] >= 1.0                             # ... and finish() waited for it
    assert store(tmp_path).latest()[1]["step"] == 2
    assert 2 in written(messages)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
