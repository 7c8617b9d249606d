"""Shared helpers for the node runtime's tests (the dynatrain_runtime package).

The pure parts are imported from the controller venv (``make runtime`` installs the
wheel there); the real MXNet runs use the node venv ``make node-venv`` builds
(``.localcloud/node-venv``; ``DT_NODE_PYTHON`` names another).
"""
import contextlib
import os
import re
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from localjob import events, host_pids, log_lines, write_hosts  # noqa: E402,F401  pylint: disable=wrong-import-position,unused-import
from dynatrain_runtime.contract.checkpoint import audit_check  # noqa: E402  pylint: disable=wrong-import-position
NODE_PYTHON = os.environ.get("DT_NODE_PYTHON") or os.path.join(ROOT, ".localcloud", "node-venv", "bin", "python")


@contextlib.contextmanager
def mock_bucket(monkeypatch, bucket):
    """moto's in-process S3 with ``bucket`` made; the s3sync daemon's own client on it (no endpoint,
    profile or real credentials reach it)."""
    import moto                                                   # pylint: disable=import-outside-toplevel
    from dynatrain_runtime.daemons import s3sync                  # pylint: disable=import-outside-toplevel
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with moto.mock_aws():
        client = s3sync.make_client()
        client.create_bucket(Bucket=bucket)
        yield client


def node_python_or_skip():
    if not os.access(NODE_PYTHON, os.X_OK):
        pytest.skip("node Python with MXNet not found at %s (set DT_NODE_PYTHON)" % NODE_PYTHON)
    rc = subprocess.call([NODE_PYTHON, "-c", "import mxnet, sklearn, dynatrain_runtime"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    if rc != 0:
        pytest.skip("%s cannot import mxnet, sklearn and dynatrain_runtime (make node-venv, or set DT_NODE_PYTHON)"
                    % NODE_PYTHON)
    return NODE_PYTHON


@pytest.fixture(scope="session")
def node_python():
    return node_python_or_skip()


@pytest.fixture(scope="session")
def torch_python(node_python):
    rc = subprocess.call([node_python, "-c", "import torch, torch.distributed as d; assert d.is_gloo_available()"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if rc != 0:
        pytest.skip("%s cannot import torch with gloo (make node-venv installs requirements-node-torch.txt)"
                    % node_python)
    return node_python


def audit_ok(meta, epochs=5):
    """Finished, and every epoch used every sample exactly once."""
    assert meta["finished"], meta
    assert audit_check(meta["audit"], meta["num_samples"]) == []
    assert sorted(meta["audit"]["completed_epochs"]) == list(range(epochs))
    per_epoch = {}
    for rec in meta["audit"]["steps"]:
        per_epoch.setdefault(rec["epoch"], []).extend(rec["idx"])
    assert sorted(per_epoch) == list(range(epochs))
    for epoch, idx in per_epoch.items():
        assert sorted(idx) == list(range(meta["num_samples"])), epoch


@pytest.fixture(scope="session")
def digits_npz(tmp_path_factory, node_python):
    out = tmp_path_factory.mktemp("data") / "digits.npz"
    subprocess.check_call([node_python, "-m", "dynatrain_runtime.examples.prepare_digits", "--out", str(out)])
    return str(out)


def wait_for(pred, timeout, what, interval=0.1, proc=None):
    """Poll ``pred`` until truthy or fail after ``timeout`` s (every wait is bounded)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            value = pred()
            if value:
                return value
            raise AssertionError("launcher exited (%s) while waiting for %s" % (proc.returncode, what))
        time.sleep(interval)
    raise AssertionError("timed out after %.0f s waiting for %s" % (timeout, what))


class LauncherRun(object):
    """A ``python -m dynatrain_runtime.launcher --transport local`` process on a temp EFS directory."""

    def __init__(self, efs, node_python, data, script_args=(), launcher_args=(), port_base=19100):
        self.efs = str(efs)
        self.logfile = open(os.path.join(self.efs, "launcher.out"), "ab")
        cmd = [node_python, "-m", "dynatrain_runtime.launcher", "--efs-mount", self.efs,
               "--python", node_python, "--script", "dynatrain_runtime.examples.train_digits",
               "--transport", "local", "--omp-threads", "1", "--port-base", str(port_base),
               "--poll-interval", "0.2"] + list(launcher_args) + \
              ["--", "--data", data, "--audit-samples"] + list(script_args)
        self.proc = subprocess.Popen(cmd, stdout=self.logfile, stderr=subprocess.STDOUT, cwd=self.efs)

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("launcher did not exit within %.0f s; log tail:\n%s" % (timeout, self.tail()))

    def tail(self, n=60):
        self.logfile.flush()
        with open(os.path.join(self.efs, "launcher.out"), "rb") as handle:
            return b"\n".join(handle.read().splitlines()[-n:]).decode("utf-8", "replace")

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.logfile.close()


def latest_meta(efs):
    from dynatrain_runtime.contract.checkpoint import CheckpointStore
    latest = CheckpointStore(os.path.join(efs, "checkpoints")).latest()
    return latest[1] if latest else None


def pids_of_host(ip, efs=None):
    """The training processes (workers and spares, not wrappers or servers) started for ``ip``; with
    ``efs``, only those of the job on that shared directory (other jobs may use the same address)."""
    return host_pids(efs, ip, command_has=b"train_digits")


# The Prometheus text format the launcher serves; the metrics and the sync-health tests read it (one home).
SAMPLE = re.compile(r'^dynatrain_[a-z_]+(\{[a-z]+="[^"]*"(,[a-z]+="[^"]*")*\})? -?[0-9.e+-]+$')


def parse(text):
    """{name{labels}: value} of the samples; every line is a HELP, a TYPE or a well-formed sample."""
    out = {}
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        assert SAMPLE.match(line), line
        key, value = line.rsplit(" ", 1)
        out[key] = float(value)
    return out
