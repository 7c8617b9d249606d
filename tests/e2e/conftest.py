"""End-to-end fixtures: the embedded local cloud, shared by the e2e tests."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import demo  # noqa: E402  (scripts/demo.py: one home for driving the playbooks)


def _podman_ready():
    env = dict(os.environ, CONTAINERS_CONF=os.path.join(ROOT, "localcloud", "containers.conf"))
    try:
        return subprocess.run(["podman", "image", "exists", "localhost/dynatrain-node:bookworm"],
                              env=env, timeout=60, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def cloud():
    """`python -m localcloud up` (idempotent); the environment to reach it."""
    if not _podman_ready():
        pytest.fail("the node image is missing: run `make setup` (podman + localcloud build-image)")
    subprocess.run([sys.executable, "-m", "localcloud", "up"], cwd=ROOT, check=True, timeout=300)
    return demo.localcloud_env()


def playbook(env, name, extra, timeout=1200):
    """Run playbooks/<name>.yml; returns (rc, output)."""
    import json
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"),
           os.path.join(ROOT, "playbooks", name + ".yml"), "-e", json.dumps(extra)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)
    return proc.returncode, proc.stdout
