#!/usr/bin/env python3
"""Train the example (dt-train-digits) on this machine's GPUs and on its CPU; print samples/s and accuracy.

Run it with the node venv's Python on a GPU node (or any machine with a CUDA build
of the engine and a driver)::

    /opt/dynatrain/venv/bin/python scripts/gpu_check.py [--engine mxnet|torch] [--epochs 5] [--model conv]

Each run is the example itself (``python -m dynatrain_runtime.examples.train_digits``,
exact-once sampling, checkpoints in a scratch directory), once on the GPUs, once on
the CPU (``DEEPLEARNING_WORKER_GPU_COUNT=0``, the setting the helper API honours).
MXNet (``--engine mxnet``, the default): one process, local kvstore, every GPU
(``el.ctx``).  PyTorch (``--engine torch``): one process per GPU (``LOCAL_RANK``, as
the launcher and torchrun start them), DistributedDataParallel over NCCL across them
when there are several.  On a machine without a usable GPU it says so and exits 0;
a training run that fails exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile

EPOCH_RE = re.compile(r"^epoch (\d+) .* samples/s ([0-9.]+)")


def gpu_state(engine="mxnet"):
    """(number of GPUs the engine can use here, a line saying what this machine has)."""
    if engine == "torch":
        return torch_gpu_state()
    try:
        import mxnet as mx
    except ImportError as exc:
        return 0, f"MXNet is not importable with {sys.executable} ({exc}); run it with the node venv's Python"
    from dynatrain_runtime.engines import devices
    cuda = mx.runtime.Features().is_enabled("CUDA")
    n = devices.num_gpus(mx)
    if not cuda:
        return 0, f"MXNet {mx.__version__} here is the CPU build (no CUDA): CPU-only machine"
    if n == 0:
        return 0, f"MXNet {mx.__version__} has CUDA but sees no GPU (no driver, or no NVIDIA device): CPU-only machine"
    return n, f"MXNet {mx.__version__} (CUDA) sees {n} GPU(s)"


def torch_gpu_state():
    """(number of GPUs PyTorch can use here, a line saying what this machine has)."""
    try:
        import torch
    except ImportError as exc:
        return 0, f"PyTorch is not importable with {sys.executable} ({exc}); run it with the node venv's Python"
    if not torch.version.cuda:
        return 0, f"PyTorch {torch.__version__} here is the CPU build (no CUDA): CPU-only machine"
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n == 0:
        return 0, (f"PyTorch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU (no driver, or no NVIDIA "
                   "device): CPU-only machine")
    names = sorted({torch.cuda.get_device_name(i) for i in range(n)})
    nccl = "NCCL %s" % ".".join(map(str, torch.cuda.nccl.version())) if n > 1 else "one GPU: no NCCL needed"
    return n, f"PyTorch {torch.__version__} (CUDA {torch.version.cuda}) sees {n} GPU(s): {', '.join(names)}; {nccl}"


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_example(label, workdir, data, args, env_extra, processes=1):
    """One run of the example; returns dict(label, samples_per_s (last epoch), val_acc, devices).

    ``processes`` > 1 (torch): one process per GPU with torchrun's environment, rank 0 reports."""
    out = os.path.join(workdir, label)
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, EFS_MOUNT=out, DT_RESUME="none", **env_extra)
    env.pop("DT_ASSIGN", None)
    env.pop("DMLC_ROLE", None)
    result = os.path.join(out, "final.json")
    cmd = [sys.executable, "-m", "dynatrain_runtime.examples.train_digits", "--data", data,
           "--epochs", str(args.epochs), "--model", args.model, "--global-batch", str(args.global_batch),
           "--checkpoint-every", "0", "--result", result]
    cmd += ["--engine", "torch"] if args.engine == "torch" else ["--kvstore", "local"]
    envs = [env]
    if processes > 1:                   # a group on this machine, as the launcher starts one per GPU
        group = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(processes),
                     LOCAL_WORLD_SIZE=str(processes))
        envs = [dict(group, RANK=str(r), LOCAL_RANK=str(r)) for r in range(processes)]
    procs = [subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for e in envs]
    outputs = [p.communicate() for p in procs]
    for rank, (p, (_out, err)) in enumerate(zip(procs, outputs)):
        if p.returncode != 0:
            raise RuntimeError(f"{label} run failed (rank {rank}: {p.returncode}): {err[-2000:]}")
    proc = subprocess.CompletedProcess(cmd, 0, outputs[0][0], outputs[0][1])
    rates = [float(m.group(2)) for m in map(EPOCH_RE.match, proc.stdout.splitlines()) if m]
    devices = re.search(r"devices (\S+)", proc.stdout)
    with open(result, encoding="utf-8") as fh:
        acc = json.load(fh)["val_acc"]
    return {"label": label, "samples_per_s": rates[-1] if rates else 0.0, "val_acc": acc,
            "devices": devices.group(1) if devices else "?"}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--engine", choices=("mxnet", "torch"), default="mxnet",
                    help="the engine to check: MXNet (one process, every GPU) or PyTorch (a process per GPU, NCCL)")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--model", choices=("mlp", "conv"), default="conv")
    ap.add_argument("--global-batch", type=int, default=256)
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    n, what = gpu_state(args.engine)
    print(f"gpu_check: {what}", flush=True)
    if n == 0:
        print("gpu_check: no GPU to train on here - nothing to compare (run it on a GPU node); exit 0")
        return 0
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        data = os.path.join(work, "digits.npz")
        subprocess.run([sys.executable, "-m", "dynatrain_runtime.examples.prepare_digits", "--out", data],
                       check=True, stdout=subprocess.DEVNULL)
        try:
            gpu = run_example("gpu", work, data, args, {}, processes=n if args.engine == "torch" else 1)
            cpu = run_example("cpu", work, data, args, {"DEEPLEARNING_WORKER_GPU_COUNT": "0"})
        except RuntimeError as exc:
            print(f"gpu_check: {exc}", file=sys.stderr)
            return 1
    for r in (gpu, cpu):
        print(f"gpu_check: {r['label']} [{r['devices']}]: {r['samples_per_s']:.1f} samples/s, "
              f"val_acc {r['val_acc']:.4f}")
    ratio = gpu["samples_per_s"] / cpu["samples_per_s"] if cpu["samples_per_s"] else float("inf")
    print(f"gpu_check: GPU/CPU throughput {ratio:.2f}x ({args.engine}, {args.model}, global batch "
          f"{args.global_batch}, {args.epochs} epochs, {n} GPU(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
