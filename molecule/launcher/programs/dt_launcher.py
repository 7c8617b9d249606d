#!/usr/bin/env python3
"""Molecule stand-in for the elastic launcher: same command line, records it,
runs the training script, and on SIGTERM stops it and exits 0."""
import argparse
import json
import os
import signal
import subprocess
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--efs-mount", required=True)
parser.add_argument("--python", required=True)
parser.add_argument("--script", required=True)
parser.add_argument("--engine", choices=["mxnet", "torch"], default="mxnet")
parser.add_argument("--transport", choices=["ssh", "local"], default="ssh")
parser.add_argument("--ssh-user")
parser.add_argument("--ssh-key")
parser.add_argument("--known-hosts")
parser.add_argument("--resize-at", choices=["step", "epoch"], default="step")
parser.add_argument("--num-servers", default="1")
parser.add_argument("--script-api", choices=["elastic", "torchrun"], default="elastic")
parser.add_argument("--procs-per-node", default="auto")
parser.add_argument("--checkpoint-every")
parser.add_argument("script_args", nargs=argparse.REMAINDER)
args = parser.parse_args()

# Written aside and renamed: the verify polls this record and must never read it half-written.
record = os.path.join(args.efs_mount, "launcher_args.json")
with open(record + ".tmp", "w") as f:
    json.dump({"argv": sys.argv[1:], "pid": os.getpid(), "home": os.environ.get("HOME"),
               "efs_env": os.environ.get("EFS_MOUNT")}, f)
os.replace(record + ".tmp", record)
script_args = args.script_args[1:] if args.script_args[:1] == ["--"] else args.script_args
child = subprocess.Popen([args.python, args.script] + script_args)


STOPPED = []


def stop(signum, _frame):
    # Only flag and forward: the main thread's wait() returns once the child exits.
    STOPPED.append(signum)
    child.terminate()


signal.signal(signal.SIGTERM, stop)
print("launcher: started %s" % child.pid, flush=True)
child.wait()
if STOPPED:
    with open(os.path.join(args.efs_mount, "launcher_exit"), "w") as f:
        f.write("signal %d, checkpointed\n" % STOPPED[0])
    print("launcher: stopped on signal %d" % STOPPED[0], flush=True)
sys.exit(0)
