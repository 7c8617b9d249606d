"""Denormals flushed to zero (dynatrain_runtime.engines.denormals): on the calling thread, on the threads it starts
afterwards, on MXNet's engine threads and on torch's calling and later threads through the engines; kept with
DYNATRAIN_FLUSH_DENORMALS=0.  Each case runs in a process of its own: the setting is the process's floating-point
environment."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from conftest import node_python_or_skip  # the runtime tests' conftest.py

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.machine() != "x86_64",
                                reason="the flush is x86-64 Linux's (MXCSR)")

# 1e-40 is a float32 denormal: multiplied by one it stays 1e-40, or reads as zero once DAZ is set
PURE = """
import threading, numpy as np
from dynatrain_runtime.engines.denormals import flush_denormals
tiny = np.array([1e-40], dtype=np.float32)
before = float((tiny * np.float32(1))[0])
done = flush_denormals()
seen = []
t = threading.Thread(target=lambda: seen.append(float((tiny * np.float32(1))[0])))
t.start(); t.join()
print(before, done, float((tiny * np.float32(1))[0]), seen[0])
np.finfo(np.float32), np.finfo(np.float64)   # numpy's limits, read after the bits are set
"""

ENGINE = """
from dynatrain_runtime.engines.mxnet import MXNetEngine
engine = MXNetEngine()                      # no DMLC_ROLE: the local kvstore
mx = engine.mx
print(float((mx.nd.array([1e-40]) * 1.0).asnumpy()[0]))
"""

TORCH = """
import threading, torch
from dynatrain_runtime.engines.torch import TorchEngine
engine = TorchEngine()                      # no torch.distributed environment: one process
seen = []
t = threading.Thread(target=lambda: seen.append(float(torch.tensor([1e-40]) * 1.0)))
t.start(); t.join()
print(float(torch.tensor([1e-40]) * 1.0), seen[0])
"""


def _run(python, code, **env):
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300, check=False,
                          env=dict(os.environ, OMP_NUM_THREADS="1", MXNET_CPU_WORKER_NTHREADS="1", **env))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split(), proc.stderr


def test_the_calling_thread_and_its_later_threads_flush_and_numpy_does_not_warn():
    out, err = _run(node_python_or_skip(), PURE)      # the workers' numpy (the node venv's: it would warn)
    before, done, after, in_thread = out
    assert float(before) > 0                  # a denormal, before
    assert done == "True"
    assert float(after) == 0.0 and float(in_thread) == 0.0
    assert "subnormal" not in err             # numpy's warning when its limits are first computed under DAZ


def test_turned_off_by_the_job_environment():
    out, _err = _run(sys.executable, PURE, DYNATRAIN_FLUSH_DENORMALS="0")   # (no framework needed)
    assert out[1] == "False" and float(out[2]) > 0 and float(out[3]) > 0


def test_mxnets_engine_threads_flush_once_the_engine_is_created():
    python = node_python_or_skip()
    out, _err = _run(python, ENGINE)
    assert float(out[0]) == 0.0               # computed on MXNet's engine thread, started after the flush
    out, _err = _run(python, ENGINE, DYNATRAIN_FLUSH_DENORMALS="0")
    assert float(out[0]) > 0


def test_the_torch_engine_flushes_on_its_thread_and_later_ones(torch_python):
    out, _err = _run(torch_python, TORCH)
    assert [float(v) for v in out] == [0.0, 0.0]      # the training thread, and a thread started after the engine
    out, _err = _run(torch_python, TORCH, DYNATRAIN_FLUSH_DENORMALS="0")
    assert all(float(v) > 0 for v in out)
