"""`python -m localcloud <command>`: build-image, wheelhouse, up, down, status, env, interrupt, spot-capacity,
no-start-capacity, quota."""

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from . import config, node_image, podman

UP_TIMEOUT_S = 60
DOWN_TIMEOUT_S = 90


def _err(msg):
    print("localcloud: %s" % msg, file=sys.stderr)
    return 1


def _control(path, body=None, timeout=10):
    req = urllib.request.Request(config.control_endpoint() + path)
    if body is not None:
        req.data = json.dumps(body).encode()
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _health():
    try:
        status, body = _control("/health", timeout=2)
        return body if status == 200 else None
    except (OSError, ValueError):
        return None


def _log_tail(n=30):
    try:
        with open(config.logfile()) as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


# -- build-image / wheelhouse ------------------------------------------------
def cmd_build_image(args):
    return node_image.build(force=args.force)


def _wanted_wheels(req_file):
    """name==version pins of a requirements file (normalised like wheel names)."""
    pins = []
    with open(req_file) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            m = re.match(r"^([A-Za-z0-9_.\-]+)===?([^\s;]+)", line)
            if m:
                pins.append((re.sub(r"[-_.]+", "_", m.group(1)).lower(), m.group(2)))
    return pins


def _missing_wheels(req_file, wheel_dir, python="3.11"):
    have = [f.lower() for f in os.listdir(wheel_dir)] if os.path.isdir(wheel_dir) else []
    tag = "-cp%s-" % python.replace(".", "")

    def present(name, version):
        files = [h for h in have if h.startswith("%s-%s-" % (name, version))]
        # a binary wheel of another CPython does not count; pure ones (py3-none) fit every Python
        return any(tag in h or "-py3-" in h or "-py2.py3-" in h for h in files)

    return [(n, v) for n, v in _wanted_wheels(req_file) if not present(n, v)]


# PyTorch's wheels (and their CUDA libraries) are manylinux_2_17 .. 2_28 builds: pip takes only the
# platform tags it is given, so the torch downloads name each (Debian 12 has glibc 2.36, a DLAMI 2.35).
TORCH_PLATFORMS = ["manylinux2014_x86_64"] + ["manylinux_2_%d_x86_64" % minor for minor in range(17, 29)]


def _requirement_sets(args):
    """[(requirement files, platforms, extra pip args)] the wheelhouse downloads, each in one pip call.

    Always requirements-node.txt (MXNet and the pins every node shares) -- what make setup and the MXNet
    path fetch, unchanged; --gpu adds the chosen engine's GPU part. --engine torch adds PyTorch's CPU build
    (192 MB) and its pins in a call of its own (its platforms), and with --gpu PyPI's CUDA 13 build.
    """
    repo = config.REPO_DIR
    engine = getattr(args, "engine", None) or "mxnet"
    gpu = getattr(args, "gpu", False)
    base = [os.path.join(repo, "requirements-node.txt")]
    if gpu and engine == "mxnet":
        base.append(os.path.join(repo, "requirements-node-gpu.txt"))
    sets = [(base, ["manylinux2014_x86_64"], [])]
    if engine == "torch":
        index = getattr(args, "torch_index_url", "") or ""
        extra = ["--extra-index-url", index] if index else []
        sets.append(([os.path.join(repo, "requirements-node-torch.txt")], TORCH_PLATFORMS, extra))
        if gpu:
            sets.append(([os.path.join(repo, "requirements-node-torch-gpu.txt")], TORCH_PLATFORMS, []))
    return sets


def _download(reqs, platforms, extra, python, dest):
    missing = [m for req in reqs for m in _missing_wheels(req, dest, python)]
    wanted = sum(len(_wanted_wheels(req)) for req in reqs)
    names = ", ".join(os.path.basename(req) for req in reqs)
    if not missing:
        print("wheelhouse: all %d pinned wheels of %s for Python %s present in %s" % (wanted, names, python, dest))
        return 0
    print(
        "wheelhouse: downloading %d missing for Python %s (%s) into %s"
        % (len(missing), python, ", ".join(n for n, _version in missing), dest),
        flush=True,
    )
    os.makedirs(dest, exist_ok=True)
    # Nodes run Debian's Python 3.11 (or a DLAMI's 3.10) on x86_64, whatever the controller runs.
    cmd = [sys.executable, "-m", "pip", "download", "-q"]
    for req in reqs:
        cmd += ["-r", req]
    cmd += ["--only-binary=:all:", "--python-version", python]
    for platform in platforms:
        cmd += ["--platform", platform]
    cmd += ["--implementation", "cp"] + extra + ["-d", dest]
    return subprocess.call(cmd)


def cmd_wheelhouse(args):
    """Download the node wheels for CPython ``--python`` (default 3.11); ``--gpu`` adds the CUDA build's.

    The GPU part (requirements-node-gpu.txt: mxnet-cu117 and the nvidia-*-cu11 runtime wheels,
    several GB) is opt-in: make setup and CI never download it. ``--python 3.10`` adds the cp310
    wheels an Ubuntu 22.04 Deep Learning AMI needs (both fit in one wheelhouse). ``--engine torch``
    adds PyTorch's (requirements-node-torch.txt, and requirements-node-torch-gpu.txt with --gpu):
    only a torch cluster (dt_engine=torch) needs them.
    """
    python = getattr(args, "python", None) or "3.11"
    # --dest: the wheelhouse a playbook's preflight found lacking (dt_wheelhouse_controller_dir), when it
    # is not this checkout's
    dest = os.path.abspath(getattr(args, "dest", None) or config.wheelhouse_dir())
    for reqs, platforms, extra in _requirement_sets(args):
        rc = _download(reqs, platforms, extra, python, dest)
        if rc != 0:
            return rc
    print("wheelhouse: %d wheels in %s" % (len([f for f in os.listdir(dest) if f.endswith(".whl")]), dest))
    return 0


# -- up / down -----------------------------------------------------------------
def cmd_up(args):
    try:
        podman.require("podman")
        podman.require("runc")
    except podman.PodmanError as e:
        return _err(str(e))
    if not podman.image_exists():
        return _err("node image %s missing: run `python -m localcloud build-image` (or `make setup`)" % config.IMAGE)
    if node_image.image_recipe() != node_image.recipe_digest():
        return _err(
            "node image %s was built from an older recipe (localcloud/node_image.py changed): "
            "run `python -m localcloud build-image` (or `make setup`)" % config.IMAGE
        )
    pid = _daemon_pid()
    if pid:
        h = _health()
        print("localcloud: already running (pid %s, %s, state %s)" % (pid, config.endpoint(), config.home()))
        return 0 if h else _err("daemon pid %s does not answer on %s" % (pid, config.control_endpoint()))
    home = config.home()
    os.makedirs(home, exist_ok=True)
    env = dict(config.podman_env(), DT_LOCALCLOUD_HOME=home, DT_LOCALCLOUD_PORT=str(config.port()))
    env["PYTHONPATH"] = os.pathsep.join([config.REPO_DIR] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    start = time.monotonic()
    with open(config.logfile(), "a") as logf:
        # A new session: the daemon outlives this command and its terminal.
        proc = subprocess.Popen(
            [sys.executable, "-m", "localcloud", "daemon"],
            cwd=config.REPO_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + UP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return _err("daemon exited (%d):\n%s" % (proc.returncode, _log_tail()))
        h = _health()
        if h and h.get("ready"):
            print(
                "localcloud: up in %.1f s: pid %d, endpoint %s, AMI %s (%s)"
                % (time.monotonic() - start, proc.pid, config.endpoint(), h.get("ami"), config.AMI_NAME)
            )
            print(
                'localcloud: state %s, log %s; `eval "$(python -m localcloud env)"` for the shell'
                % (home, config.logfile())
            )
            return 0
        time.sleep(0.2)
    _stop_pid(proc.pid)
    return _err("daemon did not become ready in %d s:\n%s" % (UP_TIMEOUT_S, _log_tail()))


def _daemon_pid():
    from .daemon import read_pid

    return read_pid()


def _stop_pid(pid, timeout=DOWN_TIMEOUT_S):
    from .daemon import pid_alive

    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    return False


def _orphans():
    """Labelled containers whose owning cloud (state dir) has no live daemon."""
    from .daemon import read_pid

    out = podman.run(["ps", "-a", "--filter", "label=%s=1" % config.LABEL, "--format", "json"]).stdout or "[]"
    names = []
    for c in json.loads(out):
        owner = (c.get("Labels") or {}).get(config.HOME_LABEL)
        if owner != config.home() and (not owner or not read_pid(owner)):
            names += (c.get("Names") or [])[:1]
    return names


def cmd_down(args):
    from .reconciler import remove_all_containers

    pid = _daemon_pid()
    if pid:
        print("localcloud: stopping daemon pid %s (removes its nodes) ..." % pid, flush=True)
        if not _stop_pid(pid):
            print("localcloud: daemon did not stop in %d s: killed" % DOWN_TIMEOUT_S)
    else:
        print("localcloud: daemon not running")
    removed = []
    if shutil.which("podman"):
        removed = remove_all_containers(config.home())
        for name in _orphans():
            podman.remove(name)
            removed.append(name)
    # The cloud is gone with moto's memory: so are its file systems, its nodes and its
    # clusters (their controller-side keys and pinned host keys would only make the next
    # cloud's nodes, on the same addresses with new host keys, fail the strict check).
    for d in (config.efs_dir(), os.path.join(config.home(), "instances"), config.clusters_dir()):
        shutil.rmtree(d, ignore_errors=True)
    for f in (config.pidfile(),):
        if os.path.exists(f):
            os.remove(f)
    if removed:
        print("localcloud: removed leftover containers: %s" % " ".join(removed))
    print("localcloud: down")
    return 0


# -- status / env / interrupt ------------------------------------------------------
def cmd_status(args):
    pid = _daemon_pid()
    if not pid:
        print("localcloud: not running (state %s)" % config.home())
        return 3 if args.check else 0
    try:
        code, snap = _control("/status")
    except OSError as e:
        return _err("daemon pid %s does not answer: %s" % (pid, e))
    if args.json:
        print(json.dumps(snap, indent=2, default=str))
        return 0
    print(
        "daemon     pid %s, endpoint %s, control %s"
        % (snap.get("pid"), snap.get("endpoint"), config.control_endpoint())
    )
    print("state      %s (log %s)" % (snap.get("home"), config.logfile()))
    print("ami        %s = %s" % (config.AMI_NAME, snap.get("ami")))
    cap = snap.get("spot_capacity")
    print("spot       capacity %s" % ("unlimited" if cap is None else cap))
    if snap.get("no_start_capacity"):
        print("starts     refused (InsufficientInstanceCapacity) for %s" % ", ".join(snap["no_start_capacity"]))
    rows = snap.get("instances", [])
    print("instances  %d" % len(rows))
    for i in rows:
        extra = []
        if i.get("lost"):
            extra.append("LOST: " + i["lost"])
        if i.get("halted"):
            extra.append("stopped by its instance: container kept")
        if i.get("interruption"):
            extra.append("spot interruption at " + i["interruption"]["time"])
        print(
            "  %-21s %-10s %-13s %-15s container=%-8s imds=%s efs=%s %s"
            % (
                i["id"],
                i["region"],
                i["state"],
                i.get("private_ip") or "-",
                i.get("container") or "-",
                "yes" if i.get("imds") else "no",
                ",".join(i.get("efs") or []) or "-",
                " ".join(extra),
            )
        )
    efs = snap.get("efs", {})
    print("efs        %d" % len(efs))
    for fs, vpcs in sorted(efs.items()):
        print("  %-21s %s  (mount targets in %s)" % (fs, config.efs_dir(fs), ",".join(vpcs) or "no VPC"))
    return 0


def cmd_env(args):
    env = dict(
        config.aws_env(),
        CONTAINERS_CONF=config.CONTAINERS_CONF,
        DT_STATE_DIR=config.clusters_dir(),
        DT_LOCALCLOUD_HOME=config.home(),
    )
    for k, v in env.items():
        print("export %s=%s" % (k, shlex.quote(v)))
    return 0


def cmd_interrupt(args):
    if not _daemon_pid():
        return _err("not running: `python -m localcloud up` first")
    code, body = _control("/interrupt", {"instance_id": args.instance_id, "after": args.after})
    if code != 200:
        return _err(body.get("error", "interrupt failed (%d)" % code))
    print(
        "localcloud: %s: spot interruption notice served now (rebalance noticeTime %s); terminated at %s"
        % (args.instance_id, body["noticeTime"], body["time"])
    )
    return 0


def cmd_spot_capacity(args):
    from .moto_compat import parse_spot_capacity

    if not _daemon_pid():
        return _err("not running: `python -m localcloud up` first")
    if args.capacity is None:
        code, body = _control("/spot-capacity")
    else:
        try:
            cap = parse_spot_capacity(args.capacity)
        except ValueError as e:
            return _err(str(e))
        code, body = _control("/spot-capacity", {"capacity": cap})
    if code != 200:
        return _err(body.get("error", "spot-capacity failed (%d)" % code))
    cap = body.get("capacity")
    print(
        "localcloud: spot capacity %s"
        % ("unlimited" if cap is None else "%d instance(s): a spot launch beyond it fails with "
           "InsufficientInstanceCapacity, like EC2's" % cap)
    )
    return 0


def cmd_no_start_capacity(args):
    """Show, arm or (--none) disarm the instances whose StartInstances fails for want of capacity."""
    if not _daemon_pid():
        return _err("not running: `python -m localcloud up` first")
    if args.none and args.instance_ids:
        return _err("either instance ids or --none, not both")
    if args.none or args.instance_ids:
        code, body = _control("/no-start-capacity", {"instance_ids": args.instance_ids})
    else:
        code, body = _control("/no-start-capacity")
    if code != 200:
        return _err(body.get("error", "no-start-capacity failed (%d)" % code))
    ids = body.get("instance_ids") or []
    print(
        "localcloud: %s"
        % ("every start gets capacity" if not ids else "no start capacity for %s: StartInstances of them fails with "
           "InsufficientInstanceCapacity, like EC2's" % ", ".join(ids))
    )
    return 0


def cmd_quota(args):
    """Set an EC2 vCPU quota (Service Quotas' GetServiceQuota answers it): localcloud/quotas.py."""
    if not _daemon_pid():
        return _err("not running: `python -m localcloud up` first")
    body = {"service": args.service, "code": args.code, "value": args.value, "region": args.region}
    code, body = _control("/quota", body)
    if code != 200:
        return _err(body.get("error", "quota failed (%d)" % code))
    print("localcloud: %s %s (%s) = %g vCPUs in %s" % (
        body["service"], body["code"], body["name"], body["value"],
        body.get("region") or "every region"))
    return 0


def cmd_daemon(args):
    from . import daemon

    return daemon.run()


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m localcloud", description="The embedded local cloud (moto + podman).")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build-image", help="build %s with debootstrap (cached)" % config.IMAGE)
    b.add_argument("--force", action="store_true", help="rebuild even when the image exists")
    b.set_defaults(func=cmd_build_image)
    w = sub.add_parser("wheelhouse", help="download node wheels (requirements-node.txt; --engine torch adds PyTorch's)")
    w.add_argument("--gpu", action="store_true", help="also the CUDA build's wheels (requirements-node-gpu.txt, GBs)")
    w.add_argument("--python", default="3.11", choices=("3.10", "3.11"), help="the nodes' CPython [%(default)s]")
    w.add_argument("--engine", default="mxnet", choices=("mxnet", "torch"),
                   help="the cluster's dt_engine: torch adds PyTorch's wheels (requirements-node-torch*.txt) "
                        "[%(default)s]")
    w.add_argument("--torch-index-url", default=os.environ.get("DT_TORCH_INDEX_URL", ""),
                   help="an index with PyTorch's CPU build (https://download.pytorch.org/whl/cpu) where pip's "
                        "configuration has none [$DT_TORCH_INDEX_URL]")
    w.add_argument("--dest", default="",
                   help="the wheelhouse to fill [the local cloud's: %s]" % os.path.join("$DT_LOCALCLOUD_HOME", "wheelhouse"))
    w.set_defaults(func=cmd_wheelhouse)
    sub.add_parser("up", help="start the cloud in the background").set_defaults(func=cmd_up)
    sub.add_parser("down", help="stop the cloud, remove every node (idempotent)").set_defaults(func=cmd_down)
    s = sub.add_parser("status", help="daemon, instances, containers, EFS")
    s.add_argument("--json", action="store_true")
    s.add_argument("--check", action="store_true", help="exit 3 when not running")
    s.set_defaults(func=cmd_status)
    sub.add_parser("env", help="print export lines for a shell").set_defaults(func=cmd_env)
    i = sub.add_parser("interrupt", help="schedule a spot interruption")
    i.add_argument("instance_id")
    i.add_argument("--after", type=float, default=120.0, help="seconds until termination (default 120, like EC2)")
    i.set_defaults(func=cmd_interrupt)
    c = sub.add_parser("spot-capacity", help="show or cap the spot instances EC2 can give (tests of spot shortage)")
    c.add_argument("capacity", nargs="?", help="N (pending/running spot instances at most) or 'unlimited'")
    c.set_defaults(func=cmd_spot_capacity)
    n = sub.add_parser("no-start-capacity", help="show or set the stopped instances EC2 has no capacity to start "
                                                 "(tests of a failed start)")
    n.add_argument("instance_ids", nargs="*", metavar="INSTANCE_ID",
                   help="their StartInstances fails with InsufficientInstanceCapacity (replaces the list)")
    n.add_argument("--none", action="store_true", help="every start gets capacity again")
    n.set_defaults(func=cmd_no_start_capacity)
    q = sub.add_parser("quota", help="set an EC2 vCPU quota, e.g. `quota [--region us-west-2] ec2 L-1216C47A 32` "
                                     "(preflight tests)")
    q.add_argument("--region", default=None,
                   help="only this region's quota (AWS's quotas are per region); default: every region")
    q.add_argument("service", choices=["ec2"])
    q.add_argument("code", help="quota code, e.g. L-1216C47A (Running On-Demand Standard instances)")
    q.add_argument("value", type=float, help="vCPUs")
    q.set_defaults(func=cmd_quota)
    sub.add_parser("daemon", help=argparse.SUPPRESS).set_defaults(func=cmd_daemon)
    args = p.parse_args(argv)
    try:
        return args.func(args) or 0
    except podman.PodmanError as e:
        return _err(str(e))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
