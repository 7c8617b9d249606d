"""torchrun tuned, as benchmarks/torch runs it, at bench_resize's state sizes and changes.

Reuses ``benchmarks/torch/bench_torch_elastic.py`` by import (its ``TorchrunJob``: agents 127.0.1.21-23 on a
c10d rendezvous, ``--monitor-interval=0.05`` and the 1 s rendezvous timeouts, ``torchrun_digits.py`` with
rank 0 checkpointing every 20 steps and every start resuming from it); only the model's width is added
(``--hidden``).  Changes: add (agent 3 starts: 2 -> 3), remove (SIGTERM to agent 3: 3 -> 2), kill (SIGKILL
of agent 2 and its worker: 2 -> 1, as ours goes to one host).  Figures from the script's rank-0 timeline
(``timeline_change``): change -> first step at the new size, the gap in the steps less one step, steps
redone (back to the newest checkpoint); through the shared file system: every worker of the new round
reads the checkpoint (state x new world; the periodic writes are not counted).
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "torch"))
import bench_torch_elastic as bte  # noqa: E402  (one home for driving torchrun)


class Job(bte.TorchrunJob):
    def __init__(self, args, data, port, world, workdir, hidden):
        self.hidden = hidden
        super().__init__(args, data, port, world, workdir, tuned=True)

    def command(self, n):
        return super().command(n) + ["--hidden", str(self.hidden)]

    def step_time(self):
        steps = self.timeline.read().steps[-12:]
        gaps = [b["t"] - a["t"] for a, b in zip(steps, steps[1:]) if b["world"] == a["world"]]
        return statistics.median(gaps) if gaps else 0.0

    def settle(self, seconds):
        time.sleep(seconds)
        self.timeline.read()


def options(python, step_sleep, timeout, keep):
    """The ``args`` bench_torch_elastic's jobs read."""
    return argparse.Namespace(python=python, step_sleep=step_sleep, checkpoint_every=20, start_timeout=timeout,
                              event_timeout=timeout, keep=keep)


def row(res, step, mb, world):
    return {"total": res["first_s"], "pause": max(0.0, res["paused_s"] - step), "step": step,
            "recomputed": res["recomputed"], "fs_mb": mb * world, "moved_mb": 0.0, "transfer": None, "rate": None,
            "own_pause": None}


def run_job(args, data, hidden, mb, port, workdir):
    """2 agents, then add, remove, kill: ``{change: row}`` and the first error (earlier changes kept)."""
    out, error, job = {}, None, None
    try:
        job = Job(args, data, port, 2, workdir, hidden)
        job.settle(3.0)
        step = job.step_time()
        out["add"] = row(job.change("add"), step, mb, 3)
        job.settle(3.0)
        step = job.step_time()
        out["remove"] = row(job.change("remove"), step, mb, 2)
        job.settle(3.0)
        step = job.step_time()
        t0 = time.time()
        bte.kill_pids(bte.tagged_pids("DTBENCH_AGENT", "%s-2" % job.job))
        out["kill"] = row(bte.timeline_change(job, "torchrun: kill", 2, 1, t0, job.logpath(1)), step, mb, 1)
    except bte.BenchError as exc:
        error = str(exc)
    finally:
        if job is not None:
            job.close()
        bte.cleanup_all()
    return out, error
