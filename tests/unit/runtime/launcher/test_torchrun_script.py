"""A script written for torchrun, run unchanged by the launcher (``--engine torch --script-api torchrun``).

``benchmarks/torch/torchrun_digits.py`` imports nothing of dynatrain: plain DDP over ``env://``, rank 0
checkpointing every N steps, every start resuming from its newest checkpoint.  The launcher gives each
generation torchrun's environment, ends it at a change and starts it again with the new membership (as
torchrun restarts its workers); a host whose processes die is FAILED and dropped, while a script that
exits with an error of its own is restarted on the same hosts until ``--max-restarts``.
Every wait is bounded.
"""
import json
import os
import signal
import subprocess
import sys

from conftest import ROOT, events, host_pids, log_lines, wait_for, write_hosts
# the session fixture torch_python
from test_torch_engine import torch_python  # noqa: F401  # pylint: disable=unused-import

SCRIPT = os.path.join(ROOT, "benchmarks", "torch", "torchrun_digits.py")
M, A, B = "127.0.13.1", "127.0.13.2", "127.0.13.3"


def launch(efs, python, script, script_args, port_base, extra=()):
    log = open(os.path.join(efs, "launcher.out"), "ab")
    cmd = [python, "-m", "dynatrain_runtime.launcher", "--efs-mount", efs, "--python", python,
           "--engine", "torch", "--script-api", "torchrun", "--script", script, "--transport", "local",
           "--omp-threads", "1", "--port-base", str(port_base), "--poll-interval", "0.2"] + list(extra) + \
          ["--"] + list(script_args)
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=efs), log


def ended(proc, log, timeout):
    """The launcher's exit status within ``timeout`` s (killed after it, whatever happens); its log closed."""
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def timeline(path):
    try:
        with open(path) as handle:
            return [json.loads(line) for line in handle if line.strip()]
    except OSError:
        return []


def steps_at_world(path, world):
    """Steps rank 0 completed in a group of ``world`` processes."""
    return [r for r in timeline(path) if "step" in r and r.get("world") == world]


def test_a_torchrun_script_runs_unchanged_through_an_add_and_a_lost_host(tmp_path, torch_python, digits_npz):
    efs = str(tmp_path)
    tl = os.path.join(efs, "timeline.jsonl")
    write_hosts(efs, [A, M])
    proc, log = launch(efs, torch_python, SCRIPT,
                       ["--data", digits_npz, "--epochs", "8", "--step-sleep", "0.05", "--checkpoint-every", "10",
                        "--checkpoint-dir", os.path.join(efs, "script-ckpt"), "--timeline", tl], 21700)
    try:
        wait_for(lambda: len(steps_at_world(tl, 2)) >= 15, 120, "steps at world 2", proc=proc)
        write_hosts(efs, [A, B, M])                                   # add_workers' edit
        wait_for(lambda: len(steps_at_world(tl, 3)) >= 15, 120, "steps at world 3", proc=proc)
        wait_for(lambda: len(log_lines(efs)) >= 3, 30, "ADDED of the new host", proc=proc)
        pids = host_pids(efs, B)
        assert len(pids) >= 2, pids                                   # its wrapper and its script
        for pid in pids:                                              # the host is lost
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: len(log_lines(efs)) >= 4, 60, "FAILED of the lost host", proc=proc)
        rc = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    with open(os.path.join(efs, "launcher.out")) as handle:
        out = handle.read()
    assert rc == 0, out[-4000:]
    assert [l[1:3] for l in log_lines(efs)] == [["ADDED", A], ["ADDED", M], ["ADDED", B], ["FAILED", B]]
    with open(os.path.join(efs, "host_worker")) as handle:
        assert [l.strip() for l in handle if l.strip() and not l.startswith("#")] == [A, M]
    starts = [r for r in timeline(tl) if r.get("event") == "start"]
    assert [s["world"] for s in starts] == [2, 3, 2], starts           # restarted at each change
    assert starts[1]["resume_step"] > 0 and starts[2]["resume_step"] >= starts[1]["resume_step"]
    assert all(s["resume_step"] % 10 == 0 for s in starts)            # from the script's own checkpoints
    final = [json.loads(line[line.index("{"):]) for line in out.splitlines()
             if "] {" in line and '"val_acc"' in line]                        # rank 0's last line
    assert final and final[-1]["val_acc"] >= 0.9 and final[-1]["world"] == 2, out[-3000:]
    ev = events(efs)
    assert [e["engine"] for e in ev if e["event"] == "launcher_start"] == ["torch"]
    ends = [e for e in ev if e["event"] == "resize_end"]
    assert [(e["from_world"], e["world"]) for e in ends] == [(2, 3), (3, 2)], ends
    assert all(e["recomputed_steps"] is None for e in ends)          # the script's own checkpoints: unknown
    assert ends[0]["stop_s"] < 2.0, ends[0]                           # SIGTERM ends it at once
    for e in ends:
        print("torchrun script, world %d -> %d: %.2f s from the change to the new group in effect"
              % (e["from_world"], e["world"], e["total_s"]))


def test_a_failing_torchrun_script_is_restarted_on_the_same_hosts_then_given_up(tmp_path, torch_python):
    efs = str(tmp_path)
    script = os.path.join(efs, "fails.py")
    with open(script, "w") as handle:
        handle.write("import os, sys\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], "
                     "'restart', os.environ['TORCHELASTIC_RESTART_COUNT'], flush=True)\n"
                     "import time; time.sleep(0.5)\nsys.exit(3)\n")
    write_hosts(efs, [A, M])
    proc, log = launch(efs, torch_python, script, [], 21800, extra=["--max-restarts", "1"])
    rc = ended(proc, log, 90)
    assert rc == 1                                                    # EXIT_GAVE_UP: a person looks
    with open(os.path.join(efs, "host_worker")) as handle:            # nobody dropped: the script failed
        assert [l.strip() for l in handle if l.strip() and not l.startswith("#")] == [A, M]
    failed = [e for e in events(efs) if e["event"] == "worker_failed"]
    assert failed and not any(e["dropped"] for e in failed), failed
    assert "status 3" in failed[0]["reason"]
    with open(os.path.join(efs, "status.json")) as handle:
        assert json.load(handle)["exit"]["reason"] == "too_many_failures"
    assert not any(l[1] == "FAILED" for l in log_lines(efs))


def test_the_torchrun_script_api_needs_the_torch_engine(tmp_path):
    res = subprocess.run([sys.executable, "-m", "dynatrain_runtime.launcher", "--efs-mount", str(tmp_path),
                          "--script", "x.py", "--script-api", "torchrun"], capture_output=True, text=True,
                         check=False, timeout=60)
    assert res.returncode == 2 and "needs --engine torch" in res.stderr
