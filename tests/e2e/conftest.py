"""End-to-end fixtures: the embedded local cloud, shared by the e2e tests.

A run leaves nothing behind: at the end of the session every cluster a test
named is torn down with playbooks/teardown.yml (a no-op for one already gone)
and the local cloud is stopped (`python -m localcloud down`: daemon,
containers, file systems). DT_KEEP_CLOUD=1 keeps the cloud (and its clusters)
up for a look afterwards.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import demo  # noqa: E402  (scripts/demo.py: one home for driving the playbooks)

# Every cluster a test named (dt_cluster_name of a playbook run), with the extra vars
# that locate it; torn down at the end of the session.
CLUSTERS = {}


def pytest_collection_modifyitems(items):
    """The IAM check (test_iam_calls.py) compares the controller's policy with every call the e2e made: it runs
    after every other e2e test, whatever the files' names (the others keep their order)."""
    items.sort(key=lambda item: item.path.name == "test_iam_calls.py")


def _podman_ready():
    env = dict(os.environ, CONTAINERS_CONF=os.path.join(ROOT, "localcloud", "containers.conf"))
    try:
        return subprocess.run(["podman", "image", "exists", "localhost/dynatrain-node:bookworm"],
                              env=env, timeout=60, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _keep_cloud():
    return os.environ.get("DT_KEEP_CLOUD", "") not in ("", "0", "false", "no")


@pytest.fixture(scope="session")
def cloud():
    """`python -m localcloud up` (idempotent); the environment to reach it. Stopped at the end."""
    if not _podman_ready():
        pytest.fail("the node image is missing: run `make setup` (podman + localcloud build-image)")
    subprocess.run([sys.executable, "-m", "localcloud", "up"], cwd=ROOT, check=True, timeout=300)
    env = demo.localcloud_env()
    try:
        yield env
    finally:
        _clean_up(env)


def _clean_up(env):
    if _keep_cloud():
        print("\nDT_KEEP_CLOUD set: the local cloud and clusters %s stay up (`python -m localcloud down`)"
              % sorted(CLUSTERS))
        return
    failures = []
    for name, extra in sorted(CLUSTERS.items()):
        if _cluster_exists(env, name):
            rc, out = playbook(env, "teardown", extra, timeout=600)
            if rc != 0:
                failures.append("teardown of %s failed:\n%s" % (name, out[-2000:]))
        # the controller-side key and pinned host keys (teardown removes them too)
        shutil.rmtree(os.path.join(env["DT_STATE_DIR"], name), ignore_errors=True)
    down = subprocess.run([sys.executable, "-m", "localcloud", "down"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    if down.returncode != 0:
        failures.append("localcloud down failed:\n%s%s" % (down.stdout, down.stderr))
    assert not failures, "\n".join(failures)


def _cluster_exists(env, name):
    import boto3
    ec2 = boto3.client("ec2", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_DEFAULT_REGION"],
                       aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
    filters = [{"Name": "tag:dynatrain:cluster", "Values": [name]}]
    running = [i for r in ec2.describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]
               if i["State"]["Name"] not in ("terminated", "shutting-down")]
    return bool(running or ec2.describe_vpcs(Filters=filters)["Vpcs"])


def user_env():
    """A user's shell after `source .venv/bin/activate` and nothing else: no AWS_*, no
    ANSIBLE_*, no CONTAINERS_CONF. The playbooks find the local cloud through the
    local inventory's settings (inventories/local), as the README promises."""
    env = {k: os.environ[k] for k in ("HOME", "LANG", "LC_ALL", "TERM", "TMPDIR") if k in os.environ}
    venv_bin = os.path.dirname(sys.executable)
    env.update(PATH=venv_bin + os.pathsep + "/usr/local/bin:/usr/bin:/bin", VIRTUAL_ENV=os.path.dirname(venv_bin))
    return env


def _playbook_cmd(name, extra):
    if "dt_cluster_name" in extra:
        CLUSTERS[extra["dt_cluster_name"]] = {k: v for k, v in extra.items()
                                              if k in ("dt_cluster_name", "dt_region", "dt_vpc_cidr", "dt_subnet_cidr")}
    # `ansible-playbook <name>.yml -e ...` at the repository root, exactly as a user types it.
    return ["ansible-playbook", name + ".yml", "-e", json.dumps(extra)]


def playbook(env, name, extra, timeout=1200):
    """Run `ansible-playbook <name>.yml` at the root in a user's shell (user_env(); `env`
    is the test's own environment, for its boto3 and podman calls); returns (rc, output)."""
    t0 = time.monotonic()
    proc = subprocess.run(_playbook_cmd(name, extra), cwd=ROOT, env=user_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)
    # where an e2e's time goes (pytest -s, or the captured output of a failure)
    print("e2e: %s.yml rc=%d %.1f s" % (name, proc.returncode, time.monotonic() - t0), flush=True)
    return proc.returncode, proc.stdout


def start_playbook(env, name, extra):
    """Start `ansible-playbook <name>.yml` in the background; the caller collects it (communicate)."""
    return subprocess.Popen(_playbook_cmd(name, extra), cwd=ROOT, env=user_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)


def task_results(out, task):
    """{host: ok|changed|skipping|failed} of the task named ``task`` in a playbook's output (its last run)."""
    chunks = [chunk for chunk in out.split("\nTASK [") if chunk.startswith(task + "]")]
    found = re.findall(r"^(ok|changed|skipping|failed|fatal): \[([^\]]+)\]", chunks[-1] if chunks else "", re.M)
    return {host: state for state, host in found}


def resizes(job, reason):
    """The job's finished resizes for ``reason`` (failure, drain, ...), oldest first. The launcher records a
    resize's end at the new group's first step, after its status and its log already name the new membership:
    wait for this, not for them, before reading one."""
    return [e for e in job.events() if e.get("event") == "resize_end" and e.get("reason") == reason]


def _projects(req_file):
    with open(req_file, encoding="utf-8") as fh:
        return {re.sub(r"[-_.]+", "_", m.group(1)).lower() for m in
                (re.match(r"^([A-Za-z0-9_.\-]+)==", line.split("#", 1)[0].strip()) for line in fh) if m}


@pytest.fixture
def setup_wheelhouse(tmp_path):
    """The wheelhouse `make setup` leaves (MXNet's wheels and the node runtime, none of PyTorch's): the
    checkout's, less the wheels only PyTorch needs, as hard links (the checkout's own is never changed).
    A playbook is pointed at it with -e dt_wheelhouse_controller_dir."""
    source = os.path.join(ROOT, ".localcloud", "wheelhouse")
    torch_only = _projects(os.path.join(ROOT, "requirements-node-torch.txt"))
    torch_only -= _projects(os.path.join(ROOT, "requirements-node.txt"))
    dest = tmp_path / "wheelhouse"
    dest.mkdir()
    for name in os.listdir(source):
        if name.endswith(".whl") and re.sub(r"[-_.]+", "_", name.split("-", 1)[0]).lower() not in torch_only:
            try:
                os.link(os.path.join(source, name), dest / name)
            except OSError:  # another file system than the checkout's
                shutil.copy2(os.path.join(source, name), dest / name)
    assert not list(dest.glob("torch-*.whl"))
    assert list(dest.glob("mxnet-*.whl")) and list(dest.glob("dynatrain_runtime-*.whl"))
    return dest
