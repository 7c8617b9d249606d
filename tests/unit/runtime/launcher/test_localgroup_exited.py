"""The multi-process wrapper (``child --procs N``) of a script written for torchrun says "exited", as the
one-process wrapper does: after its processes' last output lines, with their exit status, so the
launcher's restart of the script reads the end of the old processes before it starts the next ones."""
import queue
import sys
import time

import pytest

from dynatrain_runtime.launcher.proc import Proc

A = "127.0.0.1"
# two local processes: each says where it is, then waits (a torchrun script, no helper API); on
# SIGTERM each writes one last line before it exits with status 3
SCRIPT = ("import os, signal, sys, time\n"
          "def end(*_):\n"
          "    print('last line of', os.environ['LOCAL_RANK'], flush=True); sys.exit(3)\n"
          "signal.signal(signal.SIGTERM, end)\n"
          "print('started', os.environ['LOCAL_RANK'], flush=True)\n"
          "time.sleep(float(sys.argv[1]))\n")


def run_wrapper(tmp_path, sleep, alive="0.3", end_it=False):
    """``(messages, output lines)`` of a wrapper of 2 processes, in the order the launcher reads them."""
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "dynatrain_runtime.launcher", "child", "--procs", "2"]
    cmd += ["--alive", alive] if alive else []
    cmd += ["--", sys.executable, str(script), str(sleep)]
    seen = []
    msgq = queue.Queue()
    proc = Proc(A, "worker", cmd, msgq, lambda text: seen.append(("line", text)))
    proc.assigned_at = proc.started                 # its output lines are logged (as an assigned worker's)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and sum("started" in t for _k, t in seen) < 2:
        time.sleep(0.05)
    if end_it:
        proc.end()
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is not None
    proc.reader.join(timeout=10)
    messages = []
    while not msgq.empty():
        messages.append(msgq.get_nowait()[1])
    return proc, messages, seen


# ended by themselves: the wrapper exits with their status; ended by the launcher (``Proc.end``: SIGTERM
# to the wrapper, as the one-process wrapper, which exits 128 + 15) it still says theirs
@pytest.mark.parametrize("end_it,status,wrapper_rc", [(False, 0, 0), (True, 3, 143)])
def test_the_group_wrapper_says_exited_after_its_last_lines(tmp_path, end_it, status, wrapper_rc):
    proc, messages, seen = run_wrapper(tmp_path, 60 if end_it else 0.5, end_it=end_it)
    exited = [m for m in messages if m.get("kind") == "exited"]
    assert len(exited) == 1 and exited[0]["rc"] == status, messages
    assert messages[-1]["kind"] == "exited"             # its last word
    assert proc.poll() == wrapper_rc
    if end_it:                                          # each process's last line came before it
        assert sum("last line of" in t for _k, t in seen) == 2, seen


def test_without_alive_the_group_wrapper_says_nothing_more(tmp_path):
    """A helper-API script's group (no ``--alive``): its processes speak for themselves, as before."""
    _proc, messages, _seen = run_wrapper(tmp_path, 0.5, alive=None)
    assert [m for m in messages if m.get("kind") == "exited"] == []
