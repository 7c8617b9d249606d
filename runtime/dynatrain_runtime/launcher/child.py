"""``python -m dynatrain_runtime.launcher child [--env K=V ...] [--env-stdin] [--alive S] [--procs N] -- CMD...``:
run CMD, die with our stdin.

Every process the launcher starts (locally or over ssh) runs under this wrapper, so
nothing outlives the launcher or its ssh session: stdin lines are forwarded to the
child; when stdin reaches EOF or we get SIGTERM/SIGHUP, the child's process group is
terminated (then killed).  Exits with the child's status.  With ``--env-stdin`` the first
stdin line is a JSON object of more environment (the job's secrets: never on a command line).
With ``--alive S`` the wrapper says "alive" every S seconds for a child that cannot (a script
written for torchrun, without the helper API): the child's output then passes through the
wrapper line by line, so a message never lands inside a line of the script's.
With ``--procs N`` (N > 1: a torch node's processes, one per GPU) it runs N copies of CMD as one
host's process (``localgroup``); with N = 1 (MXNet, a CPU node) all goes as above.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

from .localgroup import ALIVE_LINE, end_groups, exited_line, run_group


def _pump_stdin(proc, done):
    """Forward our stdin to the child; at EOF the launcher is gone: end the child."""
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline()
        if not line:
            break
        try:
            proc.stdin.write(line)
            proc.stdin.flush()
        except (OSError, ValueError):
            pass
    if not done.is_set():
        end_groups([proc])


def _alive_messages(proc, period, done):
    """``--alive``: pass the child's output through whole lines, and an "alive" line every ``period`` s."""
    lock = threading.Lock()

    def write(data):
        with lock:
            try:
                os.write(1, data)
            except OSError:
                pass

    def forward():
        for line in iter(proc.stdout.readline, b""):
            write(line if line.endswith(b"\n") else line + b"\n")

    def beat():
        while not done.wait(period):
            write(ALIVE_LINE)

    write(ALIVE_LINE)
    forwarder = threading.Thread(target=forward, daemon=True)
    forwarder.start()
    threading.Thread(target=beat, daemon=True).start()
    return forwarder


def _say_exited(forwarder, rc):
    """``--alive``: after the child's last lines, say "exited" (a torchrun script's stop waits for it)."""
    forwarder.join(timeout=2.0)
    try:
        os.write(1, exited_line(rc))
    except OSError:
        pass


def _read_env_line(line):
    """``{name: value}`` from the ``--env-stdin`` line, or None when it is not one."""
    try:
        extra = json.loads(line.decode("utf-8"))
    except ValueError:
        return None
    if not isinstance(extra, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in extra.items()):
        return None
    return extra


def child_main(argv):
    ap = argparse.ArgumentParser(prog="dynatrain_runtime.launcher child")
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--env-stdin", action="store_true")
    ap.add_argument("--alive", type=float, default=0.0,
                    help="say 'alive' every this many s for the child (0: the child says it itself)")
    ap.add_argument("--procs", type=int, default=1,
                    help="run this many copies of the command, LOCAL_RANK 0..N-1 (torch, one per GPU) [1]")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    if not cmd:
        print("launcher child: no command", file=sys.stderr)
        return 2
    env = dict(os.environ)
    for item in args.env:
        key, _sep, value = item.partition("=")
        env[key] = value
    if args.env_stdin:
        extra = _read_env_line(sys.stdin.buffer.readline())
        if extra is None:
            print("launcher child: --env-stdin: the first stdin line is not a JSON object of strings",
                  file=sys.stderr)
            return 2
        env.update(extra)
    if args.procs > 1:
        return run_group(cmd, env, args.procs, args.alive)
    try:
        piped = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if args.alive > 0 else {}
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, start_new_session=True, **piped)
    except OSError as exc:
        print(f"launcher child: cannot start {cmd[0]}: {exc}", file=sys.stderr)
        return 127
    done = threading.Event()
    forwarder = _alive_messages(proc, args.alive, done) if args.alive > 0 else None

    def on_signal(signum, _frame):
        end_groups([proc])
        if forwarder is not None:
            _say_exited(forwarder, proc.returncode)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    threading.Thread(target=_pump_stdin, args=(proc, done), daemon=True).start()
    # poll, not wait(): wait() holds the Popen's lock while blocked, and a signal handler (or the pump
    # thread) ending the child would never see it exit (poll() says None) and wait out every grace.
    while proc.poll() is None:
        time.sleep(0.05)
    rc = proc.returncode
    done.set()
    try:
        os.killpg(proc.pid, signal.SIGKILL)     # anything the child left behind in its group
    except OSError:
        pass
    if forwarder is not None:
        _say_exited(forwarder, rc)
    sys.stdout.flush()
    # os._exit: the pump thread is blocked in a buffered stdin read, and a normal interpreter
    # exit would abort ("_enter_buffered_busy") on Python 3.11.
    os._exit(rc if rc >= 0 else 128 - rc)
