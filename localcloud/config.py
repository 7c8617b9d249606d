"""Where the local cloud keeps things and which ports it uses (one place).

Paths and ports are read from the environment at call time (not import time)
so tests can point a second cloud at a temporary state dir and other ports.
"""

import os

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(PACKAGE_DIR)
CONTAINERS_CONF = os.path.join(PACKAGE_DIR, "containers.conf")

IMAGE = "localhost/dynatrain-node:bookworm"
AMI_NAME = "debian-12-amd64-localcloud"
REGION = "us-east-1"
# Not secrets: the local endpoint accepts any credentials (INTERNALS.md).
ACCESS_KEY = "localcloud"
SECRET_KEY = "localcloud"

HOST = "127.0.0.1"
DEFAULT_PORT = 4599  # moto server (EC2/EFS/S3/IAM/SSM/STS)
IMDS_PORT = 1338  # per instance, bound to the instance's private IP

LABEL = "dynatrain.localcloud"  # =1 on every container we create
HOME_LABEL = "dynatrain.localcloud.home"  # which state dir (cloud) owns it

# Inside every node: where EFS file systems and per-instance data appear.
EFS_MOUNT_ROOT = "/localcloud/efs"
INSTANCE_MOUNT = "/localcloud/instance"

# Debian packages that provide the tools we shell out to.
HOST_PACKAGES = {"podman": "podman", "runc": "runc", "debootstrap": "debootstrap"}


def home():
    return os.path.abspath(os.environ.get("DT_LOCALCLOUD_HOME") or os.path.join(REPO_DIR, ".localcloud"))


def port():
    return int(os.environ.get("DT_LOCALCLOUD_PORT") or DEFAULT_PORT)


def control_port():
    # The daemon's control endpoint (interrupt/status) sits right below moto's.
    return port() - 1


def endpoint():
    return "http://%s:%d" % (HOST, port())


def control_endpoint():
    return "http://%s:%d" % (HOST, control_port())


def pidfile():
    return os.path.join(home(), "localcloud.pid")


def logfile():
    return os.path.join(home(), "localcloud.log")


def efs_dir(fs_id=None):
    base = os.path.join(home(), "efs")
    return os.path.join(base, fs_id) if fs_id else base


def instance_dir(instance_id):
    return os.path.join(home(), "instances", instance_id)


def wheelhouse_dir():
    return os.path.join(home(), "wheelhouse")


def clusters_dir():
    return os.path.join(home(), "clusters")


def podman_env():
    """Environment for every podman call: our containers.conf, always."""
    env = dict(os.environ)
    env["CONTAINERS_CONF"] = CONTAINERS_CONF
    return env


def aws_env():
    return {
        "AWS_ENDPOINT_URL": endpoint(),
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": REGION,
    }
