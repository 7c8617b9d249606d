"""The one background process of the local cloud.

It hosts moto's server (the control plane: all API state lives in this
process's memory), the reconciler loop (the data plane) with the IMDS
emulators, and a small control endpoint on 127.0.0.1 for `status`,
`interrupt`, `spot-capacity` and `no-start-capacity`. When it stops, the cloud is gone: containers are removed and
moto's state is lost, like closing an AWS account.
"""

import json
import logging
import os
import shutil
import signal
import socket
import sys
import threading

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
from botocore.config import Config

from . import baked_images, config, moto_compat, quotas, request_log
from .reconciler import Reconciler, remove_all_containers

log = logging.getLogger("localcloud.daemon")
TICK_S = 1.0


def client(service, region=config.REGION):
    return boto3.client(
        service,
        region_name=region,
        endpoint_url=config.endpoint(),
        aws_access_key_id=config.ACCESS_KEY,
        aws_secret_access_key=config.SECRET_KEY,
        # the mark keeps the cloud's own bookkeeping out of the product's recorded calls (request_log)
        config=Config(retries={"max_attempts": 2}, connect_timeout=5, read_timeout=30,
                      user_agent_extra=request_log.INTERNAL_MARK),
    )


def moto_regions():
    """Regions in which anything touched EC2 (moto creates backends lazily)."""
    from moto.ec2.models import ec2_backends

    regions = {config.REGION}
    for _account, backends in list(ec2_backends.items()):
        regions.update(list(backends.keys()))
    return sorted(regions)


AMI_DESCRIPTION = "Debian 12 (bookworm) node for the dynatrain local cloud: %s" % config.IMAGE


def register_node_ami(backend):
    """The node AMI in one region's moto EC2 backend, registered once (owner: the account); returns its id.

    AWS has Debian's AMIs in every region, each with its own id: so here, so that a cluster
    (dt_ami_name + dt_ami_owner) finds its base AMI in whatever region it is made.
    """
    from moto.ec2.models.amis import Ami
    from moto.ec2.utils import random_ami_id

    for ami in list(backend.amis.values()):
        if ami.name == config.AMI_NAME and ami.owner_id == backend.account_id:
            return ami.id
    ami = Ami(backend, random_ami_id(), name=config.AMI_NAME, description=AMI_DESCRIPTION,
              architecture="x86_64", virtualization_type="hvm", root_device_name="/dev/xvda",
              root_device_type="ebs", region_name=backend.region_name + "a")
    backend.amis[ami.id] = ami
    return ami.id


def node_ami_in_every_region(enabled=True):
    """Give every region's EC2 backend the node AMI when moto makes it (lazily: a region's first
    call), or stop doing so (enabled=False; tests). Idempotent."""
    from moto.ec2.models.amis import AmiBackend

    original = getattr(AmiBackend, "_dt_original_load_amis", None)
    if not enabled:
        if original is not None:
            AmiBackend._load_amis = original
            del AmiBackend._dt_original_load_amis
        return
    if original is not None:
        return
    original = AmiBackend._load_amis

    def _load_amis(self):
        original(self)
        register_node_ami(self)

    AmiBackend._dt_original_load_amis = original
    AmiBackend._load_amis = _load_amis


BOUNDARY_NAME = "dynatrain-master-boundary"
BOUNDARY_FILE = os.path.join(config.REPO_DIR, "files", "iam", "master-boundary-policy.json")


def ensure_boundary_policy(iam=None, sts=None):
    """The master role's permissions boundary, as an account's administrator creates it once
    (files/iam/README.md): IAM refuses a role whose boundary does not exist (moto_compat), so
    the local cloud's account has it, made by the cloud, not by the product. Returns its ARN."""
    iam = iam or client("iam")
    account = (sts or client("sts")).get_caller_identity()["Account"]
    arn = "arn:aws:iam::%s:policy/%s" % (account, BOUNDARY_NAME)
    try:
        iam.get_policy(PolicyArn=arn)
        return arn
    except iam.exceptions.NoSuchEntityException:
        pass
    with open(BOUNDARY_FILE) as handle:
        document = handle.read().replace("ACCOUNT_ID", account)
    iam.create_policy(PolicyName=BOUNDARY_NAME, PolicyDocument=document,
                      Description="dynatrain: the most a cluster's master role may ever do")
    return arn


def ensure_ami(ec2=None):
    """Register the node AMI once (idempotent); returns its id. (With node_ami_in_every_region,
    as the daemon runs, each region has it already: this finds us-east-1's.)"""
    ec2 = ec2 or client("ec2")
    found = ec2.describe_images(Owners=["self"], Filters=[{"Name": "name", "Values": [config.AMI_NAME]}])["Images"]
    if found:
        return found[0]["ImageId"]
    return ec2.register_image(
        Name=config.AMI_NAME,
        Description=AMI_DESCRIPTION,
        Architecture="x86_64",
        VirtualizationType="hvm",
        EnaSupport=True,
        RootDeviceName="/dev/xvda",
        BlockDeviceMappings=[{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 8, "VolumeType": "gp3"}}],
    )["ImageId"]


def port_free(port, host=config.HOST):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


class _Control(BaseHTTPRequestHandler):
    def _reply(self, status, obj):
        data = json.dumps(obj, default=str).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        d = self.server.daemon_state
        if self.path == "/health":
            return self._reply(
                200, {"pid": os.getpid(), "ready": d["ready"], "home": config.home(), "ami": d.get("ami")}
            )
        if self.path == "/spot-capacity":
            return self._reply(200, {"capacity": moto_compat.spot_capacity()})
        if self.path == "/no-start-capacity":
            return self._reply(200, {"instance_ids": moto_compat.no_start_capacity()})
        if self.path == "/status":
            snap = d["reconciler"].snapshot() if d.get("reconciler") else {}
            snap.update(pid=os.getpid(), endpoint=config.endpoint(), ami=d.get("ami"), home=config.home(),
                        spot_capacity=moto_compat.spot_capacity(), no_start_capacity=moto_compat.no_start_capacity())
            return self._reply(200, snap)
        self._reply(404, {"error": "not found"})

    def do_POST(self):
        d = self.server.daemon_state
        if self.path == "/spot-capacity":
            return self._spot_capacity()
        if self.path == "/no-start-capacity":
            return self._no_start_capacity()
        if self.path == "/quota":  # localcloud/quotas.py: set an EC2 vCPU quota
            try:
                body = self._body()
            except ValueError as e:
                return self._reply(400, {"error": "bad request: %s" % e})
            return self._reply(*quotas.handle_post(body))
        if self.path != "/interrupt":
            return self._reply(404, {"error": "not found"})
        try:
            body = self._body()
            iid, after = body["instance_id"], float(body.get("after", 120))
        except (ValueError, KeyError) as e:
            return self._reply(400, {"error": "bad request: %s" % e})
        intr = d["reconciler"].interrupt(iid, after)
        if intr is None:
            return self._reply(404, {"error": "%s is not a pending/running instance" % iid})
        self._reply(200, {"instance_id": iid, **intr.instance_action(), **intr.rebalance()})

    def _spot_capacity(self):
        """POST {"capacity": N|null|"unlimited"}: cap the pending/running spot instances."""
        try:
            body = self._body()
            cap = moto_compat.set_spot_capacity(body.get("capacity"))
        except (ValueError, AttributeError) as e:
            return self._reply(400, {"error": "bad request: %s" % e})
        log.info("spot capacity: %s", "unlimited" if cap is None else cap)
        self._reply(200, {"capacity": cap})

    def _no_start_capacity(self):
        """POST {"instance_ids": [...]}: the stopped instances whose StartInstances EC2 refuses ([]: none)."""
        try:
            body = self._body()
            ids = moto_compat.set_no_start_capacity(body.get("instance_ids") or [])
        except (ValueError, AttributeError) as e:
            return self._reply(400, {"error": "bad request: %s" % e})
        log.info("no start capacity for: %s", ", ".join(ids) or "none")
        self._reply(200, {"instance_ids": ids})

    def _body(self):
        """The request's JSON body ({} when empty); ValueError when it is not JSON."""
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")

    def log_message(self, fmt, *args):
        log.debug("control: " + fmt, *args)


def _clean_stale_state():
    """Anything left by a previous daemon belongs to a cloud that no longer exists."""
    stale = remove_all_containers(config.home())
    if stale:
        log.info("removed %d stale container(s) of a previous run", len(stale))
    for d in (config.efs_dir(), os.path.join(config.home(), "instances")):
        shutil.rmtree(d, ignore_errors=True)


def run():
    home = config.home()
    os.makedirs(home, exist_ok=True)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per API call is noise
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: (stop.set(), moto_compat.state_changed()))
    for p in (config.port(), config.control_port()):
        if not port_free(p):
            log.error("port %s:%d is in use; another local cloud? (DT_LOCALCLOUD_PORT picks others)", config.HOST, p)
            return 1
    with open(config.pidfile(), "w") as f:
        f.write("%d\n" % os.getpid())
    state = {"ready": False}
    control = ThreadingHTTPServer((config.HOST, config.control_port()), _Control)
    control.daemon_threads = True
    control.daemon_state = state
    threading.Thread(target=control.serve_forever, name="control", daemon=True).start()

    moto_compat.apply()
    # Our reconciler settles stopping -> stopped and pending -> running once the node did.
    moto_compat.use_transitions(True)
    quotas.apply()
    node_ami_in_every_region()
    baked_images.apply(home)  # CreateImage -> podman commit (localcloud/baked_images.py)
    # A new cloud is a new account: its record of API calls starts empty.
    calls = request_log.log_path(home)
    open(calls, "w").close()
    server = request_log.logging_server(config.HOST, config.port(), calls)
    server.start()
    reconciler = None
    try:
        log.info("moto server on %s (pid %d, state %s)", config.endpoint(), os.getpid(), home)
        _clean_stale_state()
        state["ami"] = ensure_ami()
        state["boundary"] = ensure_boundary_policy()
        log.info("AMI %s = %s", config.AMI_NAME, state["ami"])
        reconciler = Reconciler(client, moto_regions, home)
        state["reconciler"] = reconciler
        state["ready"] = True
        failures = 0
        while not stop.is_set():
            try:
                reconciler.tick()
                failures = 0
            except Exception as e:  # a bad tick must not kill the cloud
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.exception("reconcile failed (%d in a row): %s", failures, e)
            moto_compat.wait_for_change(TICK_S)     # a launch, start, stop or terminate wakes it at once
        log.info("stopping: removing nodes")
        return 0
    finally:
        if reconciler:
            reconciler.shutdown()
        else:
            remove_all_containers(home)
        control.shutdown()
        server.stop()
        try:
            os.remove(config.pidfile())
        except FileNotFoundError:
            pass
        log.info("stopped")


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours (tests) counts as gone.
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def read_pid(home=None):
    path = os.path.join(home, "localcloud.pid") if home else config.pidfile()
    try:
        with open(path) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) else None
