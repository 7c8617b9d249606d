"""The real thing: up, launch instances, ssh in, EFS, IMDSv2, interrupt, terminate, down.

Runs a second, private cloud (temp state dir, ports 4699/4698, subnet
127.78.1.0/24) so it never disturbs a `make demo` cloud on this machine.
Skipped when podman or the node image is missing (`make setup` builds it).
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from localcloud import config

REPO = config.REPO_DIR
PORT = 4699
pytestmark = pytest.mark.e2e


def _have_image():
    if not shutil.which("podman") or not shutil.which("ssh") or not shutil.which("ssh-keyscan"):
        return False
    env = dict(os.environ, CONTAINERS_CONF=config.CONTAINERS_CONF)
    return subprocess.run(["podman", "image", "exists", config.IMAGE], env=env, check=False).returncode == 0


def wait_for(what, fn, timeout, interval=0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))


def ssh_banner(ip):
    try:
        with socket.create_connection((ip, 22), timeout=2) as s:
            s.settimeout(2)
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


@pytest.fixture
def cloud(tmp_path):
    if not _have_image():
        pytest.skip("podman/ssh or %s missing (make setup)" % config.IMAGE)
    home = tmp_path / "lc"
    env = dict(
        os.environ, DT_LOCALCLOUD_HOME=str(home), DT_LOCALCLOUD_PORT=str(PORT), CONTAINERS_CONF=config.CONTAINERS_CONF
    )

    def lc(*args, timeout=120):
        return subprocess.run(
            [sys.executable, "-m", "localcloud"] + list(args),
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    r = lc("up")
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        yield lc, home, env
    finally:
        r = lc("down")
        log = (home / "localcloud.log").read_text() if (home / "localcloud.log").exists() else ""
        assert r.returncode == 0, r.stdout + r.stderr + log


def podman_names(env, home):
    out = subprocess.run(
        ["podman", "ps", "-a", "--format", "json", "--filter", "label=%s=%s" % (config.HOME_LABEL, home)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout
    return [c["Names"][0] for c in json.loads(out or "[]")]


def test_instance_lifecycle(cloud, tmp_path):
    import boto3

    lc, home, env = cloud
    assert "already running" in lc("up").stdout  # idempotent
    kw = dict(
        endpoint_url="http://127.0.0.1:%d" % PORT,
        region_name="us-east-1",
        aws_access_key_id="localcloud",
        aws_secret_access_key="localcloud",
    )
    ec2, efs = boto3.client("ec2", **kw), boto3.client("efs", **kw)
    ami = ec2.describe_images(Owners=["self"], Filters=[{"Name": "name", "Values": [config.AMI_NAME]}])["Images"]
    assert len(ami) == 1
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=30)
    ec2.import_key_pair(KeyName="e2e", PublicKeyMaterial=(tmp_path / "id_ed25519.pub").read_bytes())
    vpc = ec2.create_vpc(CidrBlock="127.78.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="127.78.1.0/24")["Subnet"]["SubnetId"]
    fs = efs.create_file_system(CreationToken="e2e", Encrypted=True)["FileSystemId"]
    efs.create_mount_target(FileSystemId=fs, SubnetId=subnet)

    t0 = time.monotonic()
    res = ec2.run_instances(
        ImageId=ami[0]["ImageId"],
        MinCount=2,
        MaxCount=2,
        InstanceType="c5.large",
        SubnetId=subnet,
        KeyName="e2e",
        MetadataOptions={"HttpTokens": "required"},
    )
    nodes = [(i["InstanceId"], i["PrivateIpAddress"]) for i in res["Instances"]]
    for _iid, ip in nodes:
        wait_for("sshd on %s" % ip, lambda: ssh_banner(ip), timeout=60)
    print("2 nodes answering ssh after %.1f s" % (time.monotonic() - t0))

    (iid, ip), (iid2, ip2) = nodes
    known_hosts = tmp_path / "known_hosts"
    scan = subprocess.run(["ssh-keyscan", "-T", "5", ip], capture_output=True, text=True, timeout=30, check=False)
    assert scan.stdout.strip(), scan.stderr
    known_hosts.write_text(scan.stdout)

    def ssh(cmd, host=ip):
        return subprocess.run(
            [
                "ssh",
                "-i",
                str(key),
                "-o",
                "StrictHostKeyChecking=yes",
                "-o",
                "UserKnownHostsFile=%s" % known_hosts,
                "-o",
                "BatchMode=yes",
                "-o",
                "ConnectTimeout=10",
                "admin@%s" % host,
                cmd,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    imds = (
        "E=$(cat /etc/localcloud/imds_endpoint); "
        "curl -s -o /dev/null -w '%{http_code}\\n' ${E}latest/meta-data/instance-id; "
        "T=$(curl -s -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' ${E}latest/api/token); "
        "for p in instance-id local-ipv4 spot/instance-action; do "
        "curl -s -w ' %{http_code}\\n' -H \"X-aws-ec2-metadata-token: $T\" ${E}latest/meta-data/$p; done"
    )
    r = ssh(
        "hostname; sudo -n true && echo SUDO; mountpoint -q /localcloud/efs/%s && echo EFS; "
        "echo hello | sudo tee /localcloud/efs/%s/from-node >/dev/null; grep AWS_EC2 /etc/environment; %s"
        % (fs, fs, imds)
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "ip-" + ip.replace(".", "-")
    assert "SUDO" in lines and "EFS" in lines
    assert "AWS_EC2_METADATA_SERVICE_ENDPOINT=http://%s:1338/" % ip in lines
    assert "401" in lines  # IMDSv2 required
    assert "%s 200" % iid in lines and "%s 200" % ip in lines
    assert any(line.endswith(" 404") for line in lines)  # no interruption yet
    assert (home / "efs" / fs / "from-node").read_text() == "hello\n"

    # A host key we did not pin is refused (StrictHostKeyChecking=yes means it).
    assert ssh("true", host=ip2).returncode != 0

    # Spot interruption: notice now, termination after --after seconds.
    r = lc("interrupt", iid, "--after", "3")
    assert r.returncode == 0, r.stderr
    r = ssh(imds)
    assert '"action": "terminate"' in r.stdout, r.stdout + r.stderr
    # The other node goes the ordinary way.
    ec2.terminate_instances(InstanceIds=[iid2])
    wait_for("containers removed", lambda: not podman_names(env, home), timeout=60)
    states = {
        i["InstanceId"]: i["State"]["Name"] for r_ in ec2.describe_instances()["Reservations"] for i in r_["Instances"]
    }
    assert states == {iid: "terminated", iid2: "terminated"}
    status = lc("status")
    assert status.returncode == 0 and "terminated" in status.stdout

    pid = int((home / "localcloud.pid").read_text())
    r = lc("down")
    assert r.returncode == 0, r.stderr
    assert not podman_names(env, home)
    assert not os.path.exists("/proc/%d" % pid) or "Z" in open("/proc/%d/stat" % pid).read().split(") ")[1][:1]
    assert not (home / "localcloud.pid").exists()
    assert lc("down").returncode == 0  # twice is fine
