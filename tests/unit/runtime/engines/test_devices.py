"""Device selection (dynatrain_runtime.engines.devices, Elastic.ctx), the example's split across devices, gpu_check's CPU path."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dynatrain_runtime.engines import devices

from conftest import ROOT  # the repository root (the runtime tests' conftest.py, one home for its depth)


@pytest.mark.parametrize("available, limit, visible, want", [
    (0, None, None, []),                 # CPU node
    (4, None, None, [0, 1, 2, 3]),       # every GPU of the node
    (4, 2, None, [0, 1]),                # DEEPLEARNING_WORKER_GPU_COUNT caps it
    (4, 0, None, []),                    # ... 0 means the CPU
    (2, 8, None, [0, 1]),                # a limit above what exists changes nothing
    (8, None, 3, [0, 1, 2]),             # CUDA_VISIBLE_DEVICES names 3
    (8, 2, 3, [0, 1]),
])
def test_plan_devices(available, limit, visible, want):
    assert devices.plan_devices(available, limit, visible) == want


def test_gpu_limit_from_env_then_node_file(tmp_path):
    env_file = tmp_path / "deeplearning.sh"
    env_file.write_text("export EFS_MOUNT=/myEFSvolume\nexport DEEPLEARNING_WORKER_GPU_COUNT=2\n")
    # a worker started over non-login SSH has no profile: the node's file answers
    assert devices.gpu_limit({"DT_NODE_ENV_FILE": str(env_file)}) == 2
    assert devices.gpu_limit({"DT_NODE_ENV_FILE": str(env_file), "DEEPLEARNING_WORKER_GPU_COUNT": "1"}) == 1
    assert devices.gpu_limit({"DT_NODE_ENV_FILE": str(tmp_path / "missing")}) is None
    assert devices.gpu_limit({"DT_NODE_ENV_FILE": "/nonexistent", "DEEPLEARNING_WORKER_GPU_COUNT": "x"}) is None


@pytest.mark.parametrize("value, want", [(None, None), ("", 0), ("0,1", 2), ("GPU-abc,GPU-def,GPU-0", 3),
                                         ("-1", 0), ("0,-1,2", 1)])
def test_visible_gpus(value, want):
    env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    assert devices.visible_gpus(env) == want


class _FakeMx:
    """Just what devices.contexts uses."""

    def __init__(self, n, fail=False):
        self._n, self._fail = n, fail
        self.context = self

    def num_gpus(self):
        if self._fail:
            raise RuntimeError("CUDA: no driver")
        return self._n

    @staticmethod
    def gpu(i):
        return f"gpu({i})"

    @staticmethod
    def cpu():
        return "cpu(0)"


def test_contexts():
    env = {"DT_NODE_ENV_FILE": "/nonexistent"}
    assert devices.contexts(_FakeMx(2), env) == ["gpu(0)", "gpu(1)"]
    assert devices.contexts(_FakeMx(2), dict(env, DEEPLEARNING_WORKER_GPU_COUNT="0")) == ["cpu(0)"]
    assert devices.contexts(_FakeMx(0), env) == ["cpu(0)"]
    assert devices.contexts(_FakeMx(4, fail=True), env) == ["cpu(0)"]


def test_device_shares_pad_with_weight_zero():
    from dynatrain_runtime.examples.mxnet_digits import device_shares
    idx, w = device_shares([7, 9], [1.0, 1.0], 4)
    assert list(idx) == [7, 9, 7, 7] and list(w) == [1, 1, 0, 0]
    idx, w = device_shares([3, 4, 5], [1.0] * 3, 2)
    assert list(idx) == [3, 4, 5] and list(w) == [1, 1, 1]


SPLIT_CHECK = r"""
import numpy as np, mxnet as mx
from mxnet import gluon
from dynatrain_runtime.examples.mxnet_digits import build_net, device_shares, train_step
from dynatrain_runtime import Elastic

rng = np.random.RandomState(0)
x, y = rng.rand(5, 64).astype("float32"), rng.randint(0, 10, 5).astype("float32")
def grads(ctx, idx, weights):
    mx.random.seed(1)
    net = build_net("mlp", 16)
    net.initialize(mx.init.Xavier(), ctx=ctx)
    i, w = device_shares(idx, weights, len(ctx))
    loss, correct = train_step(net, gluon.loss.SoftmaxCrossEntropyLoss(), ctx, x[i], y[i], w)
    g = sum(p.list_grad()[k].asnumpy().sum() for p in net.collect_params().values() for k in range(len(ctx)))
    return float(loss.asscalar()), float(correct.asscalar()), g
one = grads([mx.cpu(0)], [0, 1, 2], [1.0] * 3)
three = grads([mx.cpu(0), mx.cpu(1), mx.cpu(2)], [0, 1, 2], [1.0] * 3)
five = grads([mx.cpu(i) for i in range(5)], [0, 1, 2], [1.0] * 3)      # 2 padding samples, weight 0
assert abs(one[0] - three[0]) < 1e-4 and abs(one[0] - five[0]) < 1e-4, (one, three, five)
assert one[1] == three[1] == five[1], (one, three, five)
assert abs(one[2] - three[2]) < 1e-4 and abs(one[2] - five[2]) < 1e-4, (one, three, five)
el = Elastic(num_samples=10, global_batch=4, epochs=1, kvstore="local")
print("ctx", el.ctx)
"""


def test_split_across_devices_gives_the_single_device_result(node_python, tmp_path):
    """Several CPU contexts stand in for GPUs: the same loss, accuracy and summed gradient as one device."""
    env = dict(os.environ, EFS_MOUNT=str(tmp_path), DEEPLEARNING_WORKER_GPU_COUNT="4")
    env.pop("DT_ASSIGN", None)
    out = subprocess.run([node_python, "-c", SPLIT_CHECK], capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "ctx [cpu(0)]"     # the CPU build: no GPU, whatever the limit


def test_gpu_check_on_a_cpu_only_machine(node_python):
    out = subprocess.run([node_python, os.path.join(ROOT, "scripts", "gpu_check.py")], capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "CPU build (no CUDA): CPU-only machine" in out.stdout
    assert "no GPU to train on here" in out.stdout
    assert "samples/s" not in out.stdout


def test_gpu_check_without_mxnet_says_so():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_check.py")], capture_output=True,
                         text=True, check=False, env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "runtime")))
    if "sees" in out.stdout:            # this Python has MXNet after all: nothing to check here
        pytest.skip("the controller Python imports MXNet")
    assert out.returncode == 0 and "MXNet is not importable" in out.stdout


def test_gpu_check_torch_on_a_cpu_only_machine(node_python):
    out = subprocess.run([node_python, os.path.join(ROOT, "scripts", "gpu_check.py"), "--engine", "torch"],
                         capture_output=True, text=True, check=False)
    if "PyTorch is not importable" in out.stdout:
        pytest.skip("the node venv has no torch (make node-venv installs requirements-node-torch.txt)")
    assert out.returncode == 0, out.stderr
    assert "PyTorch 2.13.0+cpu here is the CPU build (no CUDA): CPU-only machine" in out.stdout
    assert "no GPU to train on here" in out.stdout and "samples/s" not in out.stdout


GROUP_RUN = """
import argparse, json, sys, tempfile
sys.path.insert(0, %r)
import gpu_check
args = argparse.Namespace(engine="torch", epochs=2, model="mlp", global_batch=64)
with tempfile.TemporaryDirectory() as work:
    import subprocess
    data = work + "/digits.npz"
    subprocess.run([sys.executable, "-m", "dynatrain_runtime.examples.prepare_digits", "--out", data], check=True,
                   stdout=subprocess.DEVNULL)
    print(json.dumps(gpu_check.run_example("group", work, data, args, {"DEEPLEARNING_WORKER_GPU_COUNT": "0"},
                                           processes=2)))
"""


def test_gpu_check_runs_one_torch_process_per_device_as_one_group(node_python):
    """What the GPU run does with N GPUs (a process each, LOCAL_RANK, one DDP group), here on the CPU (gloo)."""
    out = subprocess.run([node_python, "-c", GROUP_RUN % os.path.join(ROOT, "scripts")], capture_output=True,
                         text=True, check=False, timeout=300)
    if "No module named 'torch'" in out.stderr:
        pytest.skip("the node venv has no torch")
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["samples_per_s"] > 0 and result["val_acc"] >= 0.8, result
