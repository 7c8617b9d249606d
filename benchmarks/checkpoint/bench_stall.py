#!/usr/bin/env python3
"""The periodic checkpoint's stall on the training thread: synchronous (before) vs the background writer (after).

One worker of the helper API (``Elastic``, torch engine, a world of one: no launcher) trains the digits MLP
(64 inputs -> hidden -> 10, SGD with momentum) and checkpoints every ``--every`` steps, in three modes, each
in a fresh process of the node venv:

* ``none``   -- no checkpoint: the step time the others are compared with;
* ``sync``   -- ``DT_CHECKPOINT_ASYNC=0``: written, digested and fsynced on the training thread (before);
* ``async``  -- the default: a boundary snapshot on the training thread, the rest on the writer's thread.

Per checkpoint it prints the training thread's stall -- the time the step that checkpoints spends in the
helper API beyond an ordinary step's (measured around ``el.batches()``'s ``next``, not taken from the
runtime's own report) -- next to the median ordinary step of the same run (a background write shares the
machine's cores with training: compare it with the ``none`` run's), the write's own seconds (the runtime's
``checkpoint`` message), the wait at exit for the write in flight and the checkpoints skipped because one
was still being written.  Recovery snapshots are off (``DT_RECOVERY=checkpoint``) so only the checkpoint is
measured.  The first background checkpoint of a run allocates its host memory (page faults); later ones
reuse it (``engines.torch.HostBuffers``).

    .localcloud/node-venv/bin/python benchmarks/checkpoint/bench_stall.py            # ~1 MB and ~780 MB
    .localcloud/node-venv/bin/python benchmarks/checkpoint/bench_stall.py --hidden 1700 --steps 40

State bytes = 4 * 2 * (75 * hidden + 10) (parameters + momentum): hidden 1700 ~ 1 MB, 1300000 ~ 780 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("none", "sync", "async")


def state_mb(hidden):
    return 4 * 2 * (75 * hidden + 10) / 1e6


def child(args):
    """One run: train ``args.steps`` steps, print one JSON line with the per-step timings."""
    os.environ["DT_RECOVERY"] = "checkpoint"
    os.environ["DT_CHECKPOINT_ASYNC"] = "0" if args.mode == "sync" else "1"
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch import nn

    from dynatrain_runtime import Elastic

    torch.set_num_threads(max(1, args.threads))
    try:
        from sklearn.datasets import load_digits
        digits = load_digits()
        x_all, y_all = digits.data.astype("float32") / 16.0, digits.target.astype("int64")
    except ImportError:                     # the shapes are what matters here
        rng = np.random.default_rng(0)
        x_all, y_all = rng.random((1797, 64), dtype=np.float32), rng.integers(0, 10, 1797)
    every = args.every if args.mode != "none" else 0
    el = Elastic(num_samples=len(x_all), global_batch=64, epochs=10 ** 6, seed=0, lr=0.01, engine="torch",
                 checkpoint_every=every, efs_mount=args.efs, keep_checkpoints=2)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model, opt = el.wrap(model, opt)
    xs, ys = torch.from_numpy(x_all), torch.from_numpy(y_all)
    steps, commits = [], []            # per step: the script's body; the helper API's time after it
    batches = el.batches()
    t_start = time.perf_counter()
    batch = next(batches)
    for _step in range(args.steps):
        t0 = time.perf_counter()
        idx = torch.as_tensor(batch.indices)
        out = model(xs[idx])
        per_sample = F.cross_entropy(out, ys[idx], reduction="none")
        opt.zero_grad(set_to_none=True)
        batch.weighted_loss(per_sample).backward()
        opt.step()
        t1 = time.perf_counter()
        batch = next(batches)          # commits the step: a due checkpoint is taken here
        steps.append(t1 - t0)
        commits.append(time.perf_counter() - t1)
    wall = time.perf_counter() - t_start
    t_wait = time.perf_counter()
    el.finish()                         # waits for the write in flight
    drain = time.perf_counter() - t_wait
    events = []
    if el._events is not None:          # pylint: disable=protected-access
        el._events.flush(timeout=30)    # pylint: disable=protected-access
    try:
        with open(el.files.events) as handle:
            events = [json.loads(line) for line in handle if line.strip()]
    except OSError:
        pass
    print("@@RESULT " + json.dumps({
        "mode": args.mode, "hidden": args.hidden, "steps": steps, "commits": commits, "wall": wall,
        "drain": drain, "every": every,
        "skipped": [e["step"] for e in events if e.get("event") == "checkpoint_skipped"],
        "ckpts": sorted(os.listdir(el.store.directory)) if os.path.isdir(el.store.directory) else []}),
        flush=True)
    return 0


def run_child(python, mode, hidden, args):
    efs = tempfile.mkdtemp(prefix=f"bench-stall-{mode}-", dir=args.tmp)
    cmd = [python, os.path.abspath(__file__), "--child", "--mode", mode, "--hidden", str(hidden),
           "--steps", str(args.steps), "--every", str(args.every), "--efs", efs, "--threads", str(args.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=args.timeout)
    writes = []
    for line in out.stdout.splitlines():
        if line.startswith("@@DT ") and '"kind": "checkpoint"' in line:
            writes.append(json.loads(line[len("@@DT "):])["seconds"])
    for line in out.stdout.splitlines():
        if line.startswith("@@RESULT "):
            return dict(json.loads(line[len("@@RESULT "):]), writes=writes)
    raise RuntimeError(f"no result from {cmd}: {out.stdout[-2000:]} {out.stderr[-2000:]}")


def summarise(run):
    """One run: its median ordinary step, the stall of each checkpointing step, the writes' median seconds."""
    n = len(run["steps"])
    due = [i for i in range(n) if run["every"] and (i + 1) % run["every"] == 0]     # step i+1 checkpoints
    ordinary = [i for i in range(1, n) if i not in due]
    usual = statistics.median(run["commits"][i] for i in ordinary)
    stalls = [run["commits"][i] - usual for i in due]
    return {"step": statistics.median(run["steps"][i] + run["commits"][i] for i in ordinary),
            "stalls": stalls, "median_stall": statistics.median(stalls) if stalls else 0.0,
            "write": statistics.median(run["writes"]) if run["writes"] else 0.0,
            "drain": run["drain"], "skipped": len(run["skipped"])}


def main(argv=None):
    # the runs' default python is this one: the node venv's, where torch is
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts"))
    import project_python  # pylint: disable=import-outside-toplevel
    project_python.require("node", "torch", "dynatrain_runtime")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, nargs="+", default=[1700, 1300000],
                    help="hidden widths (1700 ~ 1 MB of state, 1300000 ~ 780 MB)")
    ap.add_argument("--steps", type=int, default=16, help="steps per run")
    ap.add_argument("--every", type=int, default=4, help="checkpoint every N steps")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (leave a core for the writer)")
    ap.add_argument("--python", default=sys.executable, help="the node venv's python (torch, the runtime)")
    ap.add_argument("--tmp", default=None, help="where the runs' checkpoint directories go (default: $TMPDIR)")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--efs", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        args.hidden = args.hidden[0]
        return child(args)
    print(f"# {os.cpu_count()} cores; {args.steps} steps, a checkpoint every {args.every}; torch threads "
          f"{args.threads}; recovery snapshots off")
    print(f"{'state MB':>9} {'mode':>6} {'step s':>7} {'stall s':>8} {'write s':>8} {'exit wait s':>12} "
          f"{'skipped':>8}  stall of each checkpoint, s")
    for hidden in args.hidden:
        for mode in MODES:
            row = summarise(run_child(args.python, mode, hidden, args))
            each = ", ".join(f"{s:.3f}" for s in row["stalls"]) if mode != "none" else "-"
            stall, write = (f"{row['median_stall']:8.3f}", f"{row['write']:8.3f}") if mode != "none" else \
                (f"{'-':>8}", f"{'-':>8}")
            print(f"{state_mb(hidden):9.1f} {mode:>6} {row['step']:7.3f} {stall} {write} {row['drain']:12.3f} "
                  f"{row['skipped']:8d}  {each}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
