#!/usr/bin/env python3
"""Train the example (dt-train-digits) on this machine's GPUs and on its CPU; print samples/s and accuracy.

Run it with the node venv's Python on a GPU node (or any machine with the CUDA
build of MXNet and a driver)::

    /opt/dynatrain/venv/bin/python scripts/gpu_check.py [--epochs 5] [--model conv]

Each run is the example itself (``python -m dynatrain_runtime.examples.train_digits``,
local kvstore, exact-once sampling, checkpoints in a scratch directory): once on
every GPU (``el.ctx``), once on the CPU (``DEEPLEARNING_WORKER_GPU_COUNT=0``, the
setting the helper API honours). On a machine without a usable GPU it says so and
exits 0; a training run that fails exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

EPOCH_RE = re.compile(r"^epoch (\d+) .* samples/s ([0-9.]+)")


def gpu_state():
    """(number of GPUs MXNet can use here, a line saying what this machine has)."""
    try:
        import mxnet as mx
    except ImportError as exc:
        return 0, f"MXNet is not importable with {sys.executable} ({exc}); run it with the node venv's Python"
    from dynatrain_runtime import devices
    cuda = mx.runtime.Features().is_enabled("CUDA")
    n = devices.num_gpus(mx)
    if not cuda:
        return 0, f"MXNet {mx.__version__} here is the CPU build (no CUDA): CPU-only machine"
    if n == 0:
        return 0, f"MXNet {mx.__version__} has CUDA but sees no GPU (no driver, or no NVIDIA device): CPU-only machine"
    return n, f"MXNet {mx.__version__} (CUDA) sees {n} GPU(s)"


def run_example(label, workdir, data, args, env_extra):
    """One run of the example; returns dict(label, samples_per_s (last epoch), val_acc, devices)."""
    out = os.path.join(workdir, label)
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, EFS_MOUNT=out, DT_RESUME="none", **env_extra)
    env.pop("DT_ASSIGN", None)
    env.pop("DMLC_ROLE", None)
    result = os.path.join(out, "final.json")
    cmd = [sys.executable, "-m", "dynatrain_runtime.examples.train_digits", "--data", data, "--kvstore", "local",
           "--epochs", str(args.epochs), "--model", args.model, "--global-batch", str(args.global_batch),
           "--checkpoint-every", "0", "--result", result]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{label} run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    rates = [float(m.group(2)) for m in map(EPOCH_RE.match, proc.stdout.splitlines()) if m]
    devices = re.search(r"devices (\S+)", proc.stdout)
    with open(result, encoding="utf-8") as fh:
        acc = json.load(fh)["val_acc"]
    return {"label": label, "samples_per_s": rates[-1] if rates else 0.0, "val_acc": acc,
            "devices": devices.group(1) if devices else "?"}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--model", choices=("mlp", "conv"), default="conv")
    ap.add_argument("--global-batch", type=int, default=256)
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    n, what = gpu_state()
    print(f"gpu_check: {what}", flush=True)
    if n == 0:
        print("gpu_check: no GPU to train on here - nothing to compare (run it on a GPU node); exit 0")
        return 0
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        data = os.path.join(work, "digits.npz")
        subprocess.run([sys.executable, "-m", "dynatrain_runtime.examples.prepare_digits", "--out", data],
                       check=True, stdout=subprocess.DEVNULL)
        try:
            gpu = run_example("gpu", work, data, args, {})
            cpu = run_example("cpu", work, data, args, {"DEEPLEARNING_WORKER_GPU_COUNT": "0"})
        except RuntimeError as exc:
            print(f"gpu_check: {exc}", file=sys.stderr)
            return 1
    for r in (gpu, cpu):
        print(f"gpu_check: {r['label']} [{r['devices']}]: {r['samples_per_s']:.1f} samples/s, "
              f"val_acc {r['val_acc']:.4f}")
    ratio = gpu["samples_per_s"] / cpu["samples_per_s"] if cpu["samples_per_s"] else float("inf")
    print(f"gpu_check: GPU/CPU throughput {ratio:.2f}x ({args.model}, global batch {args.global_batch}, "
          f"{args.epochs} epochs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
