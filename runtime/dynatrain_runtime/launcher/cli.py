"""``dt-launcher`` / ``python -m dynatrain_runtime.launcher``: the elastic launcher's command line."""

from __future__ import annotations

import argparse
import os
import sys

from ..engines import ENGINES
from ..contract.protocol import RESIZE_AT, RESIZE_MODES, SCRIPT_APIS
from .child import child_main
from .config import LauncherConfig
from .loop import Launcher


def servers_arg(value):
    """``--num-servers``: a positive count (on the master) or ``per-node``."""
    if value == "per-node":
        return value
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count or 'per-node': {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError("at least 1 server")
    return n


def procs_arg(value):
    """``--procs-per-node``: ``auto`` or a positive count."""
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count or 'auto': {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError("at least 1 process per node")
    return n


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        prog="dt-launcher",
        description="Elastic training launcher of dynatrain.elastic (runs on the master): MXNet parameter-server "
                    "jobs or PyTorch torch.distributed jobs.",
        epilog="Arguments after -- go to the training script.")
    # the groups say what each option is for; the options are added in their historical order (the usage line)
    job = ap.add_argument_group("the job", "what runs: the training script, its engine, its environment")
    hosts = ap.add_argument_group("the hosts", "where the processes run and how they connect")
    changes = ap.add_argument_group("membership changes", "how host_worker edits, warm requests and drains apply")
    failures = ap.add_argument_group("failure detection and recovery",
                                     "when a worker counts as lost, and what the job resumes from")
    records = ap.add_argument_group("records", "status.json and the Prometheus metrics")
    job.add_argument("--efs-mount", default=os.environ.get("EFS_MOUNT", "/myEFSvolume"),
                     help="shared volume with host_worker, host_worker_log, checkpoints/ [%(default)s]")
    job.add_argument("--python", default=sys.executable,
                     help="node Python with the engine's framework and dynatrain_runtime, the same path on every "
                          "node [%(default)s]")
    job.add_argument("--engine", choices=ENGINES, default="mxnet",
                     help="mxnet: scheduler + servers + one worker per host (dist_sync); torch: --procs-per-node "
                          "workers per host with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR="
                          "master, a fresh MASTER_PORT per generation), no servers [%(default)s]")
    job.add_argument("--procs-per-node", type=procs_arg, default="auto",
                     help="torch: worker processes per node, LOCAL_RANK 0..N-1; auto: one per usable GPU of the "
                          "launcher's node (nvidia-smi, at most DEEPLEARNING_WORKER_GPU_COUNT and "
                          "CUDA_VISIBLE_DEVICES; the nodes are alike), 1 on a CPU node; N > 1 on CPU nodes runs "
                          "N gloo processes. mxnet: always 1 (its worker uses every GPU) [%(default)s]")
    job.add_argument("--script", required=True,
                     help="training script: a path (the same on every node) or a module name run with -m")
    job.add_argument("--script-api", choices=SCRIPT_APIS, default="elastic",
                     help="elastic: the script uses the helper API (warm spares, step-boundary resizes, survivor "
                          "recovery); torchrun: a script written for torchrun, run unchanged (torch engine): each "
                          "change ends it and starts it again with the new environment, and it resumes from its "
                          "own checkpoint, as torchrun does [%(default)s]")
    hosts.add_argument("--transport", choices=("ssh", "local"), default="ssh",
                       help="ssh to the workers, or run every 'host' as a local process (tests) [%(default)s]")
    hosts.add_argument("--ssh-user", default="admin")
    hosts.add_argument("--ssh-key", default="~/.ssh/dynatrain_cluster")
    hosts.add_argument("--known-hosts", default="~/.ssh/known_hosts_dynatrain")
    hosts.add_argument("--ssh-connect-timeout", type=int, default=10)
    hosts.add_argument("--local-ip", action="append", default=[],
                       help="addresses of this machine, run without ssh (the master always is)")
    hosts.add_argument("--master", default=None, help="master IP [last line of host_worker]")
    records.add_argument("--metrics-port", type=int, default=0,
                         help="serve Prometheus metrics at http://METRICS_ADDRESS:PORT/metrics (0 = off) [%(default)s]")
    records.add_argument("--metrics-address", default="127.0.0.1",
                         help="the address the metrics listen on: the master's private one on a cluster [%(default)s]")
    changes.add_argument("--resize-at", choices=RESIZE_AT, default="step")
    changes.add_argument("--resize-mode", choices=RESIZE_MODES, default="auto",
                         help="in-place: a change keeps the survivors' processes and state (the process group is "
                              "re-formed in them, a joiner gets the state from live peers, no checkpoint); restart: "
                              "every process exits and the next generation resumes from a checkpoint; auto: in-place "
                              "for --engine torch with the helper API and one process per node, else restart "
                              "[%(default)s]")
    changes.add_argument("--regroup-timeout", type=float, default=30.0,
                         help="in place: a re-formed group must make its first step within this, s, else the job "
                              "goes on by the restart path (from a survivor's boundary state) [%(default)s]")
    hosts.add_argument("--port-base", type=int, default=9091,
                       help="scheduler (torch: MASTER_PORT) port = base + generation %% 500")
    hosts.add_argument("--num-servers", "--servers", dest="num_servers", type=servers_arg, default=1,
                       help="parameter servers: N on the master, or 'per-node' (one on every member host, next to "
                            "its worker: MXNet's usual layout; all restart with each generation) [%(default)s]")
    job.add_argument("--checkpoint-dir", default=None, help="[EFS_MOUNT/checkpoints]")
    job.add_argument("--omp-threads", type=int, default=0, help="OMP/MKL/MXNet CPU threads per process (0 = unset)")
    job.add_argument("--env", action="append", default=[], help="extra KEY=VALUE for every process")
    changes.add_argument("--no-warm-spares", dest="warm_spares", action="store_false",
                         help="start processes only when needed (slower resizes)")
    changes.add_argument("--spare-depth", type=int, default=1,
                         help="pre-warmed process sets per host; 2 keeps a second change soon after one fast "
                              "(frequent spot churn) at the memory of one more idle process per role [%(default)s]")
    changes.add_argument("--poll-interval", type=float, default=0.2,
                         help="host_worker poll period, s (a read of one small file and two listings) [%(default)s]")
    failures.add_argument("--dead-timeout", type=float, default=6.0,
                          help="silence before a worker is FAILED, s (its liveness thread says 'alive' every second, "
                               "whatever the step time) [%(default)s]")
    failures.add_argument("--stall-timeout", type=float, default=12.0,
                          help="no step progress before a stall, s: the floor of --timeout-steps x the step time "
                               "[%(default)s]")
    failures.add_argument("--start-timeout", type=float, default=60.0,
                          help="generation start to first step, s: the floor of twice the last generation's start "
                               "plus --timeout-steps x the step time [%(default)s]")
    failures.add_argument("--timeout-steps", type=float, default=20.0,
                          help="stall and start limits are at least this many observed step times (a slow model "
                               "is not declared stalled between two of its steps) [%(default)s]")
    failures.add_argument("--stop-timeout", type=float, default=30.0, help="stop request to all workers stopped, s")
    failures.add_argument("--recovery", choices=("survivor", "checkpoint"), default="survivor",
                          help="after a lost worker resume from a survivor's state of the last completed step, or from "
                               "the last checkpoint [%(default)s]")
    failures.add_argument("--recover-timeout", type=float, default=10.0,
                          help="wait this long for a survivor's state before using the last checkpoint, s [%(default)s]")
    changes.add_argument("--join-warm-timeout", type=float, default=120.0,
                         help="an added host joins once its process has imported MXNet (training goes on meanwhile), "
                              "or after this long, s; 0 = at the next boundary at once [%(default)s]")
    failures.add_argument("--max-restarts", type=int, default=5, help="consecutive failed generations before giving up")
    changes.add_argument("--wait-host-worker", type=float, default=300.0, help="wait this long for a valid host_worker")
    records.add_argument("--status-interval", type=float, default=2.0)
    job.add_argument("script_args", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    if args.script_api == "torchrun" and args.engine != "torch":
        ap.error("--script-api torchrun runs a script written for torchrun: it needs --engine torch")
    if args.resize_mode == "in-place" and (args.engine != "torch" or args.script_api != "elastic"):
        ap.error("--resize-mode in-place keeps the processes of a torch job that uses the helper API: it needs "
                 "--engine torch and --script-api elastic (MXNet's ps-lite cannot change its worker count in place)")
    if args.engine != "torch" and args.procs_per_node not in ("auto", 1):
        ap.error("--procs-per-node: MXNet runs one worker per node (it uses every GPU of the node): torch only")
    if args.script_args and args.script_args[0] == "--":
        args.script_args = args.script_args[1:]
    if args.transport == "local" and os.path.exists(args.script):
        args.script = os.path.abspath(args.script)
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "child":
        return child_main(argv[1:])
    return Launcher(LauncherConfig.from_args(parse_args(argv))).run()
