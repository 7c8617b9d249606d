"""Fixtures for the local cloud's tests (the repo root is on sys.path through tests/unit/conftest.py)."""

import socket
import threading
from http.server import ThreadingHTTPServer

import boto3
import pytest
from botocore.config import Config


@pytest.fixture(scope="module")
def ec2(moto_endpoint):
    """EC2 on the session's moto server with the local cloud's patches (moto_compat), one try per call
    (a refused request fails at once instead of being retried)."""
    from localcloud import moto_compat

    moto_compat.apply()
    return boto3.client(
        "ec2", region_name="us-east-1", endpoint_url=moto_endpoint,
        aws_access_key_id="localcloud", aws_secret_access_key="localcloud",
        config=Config(retries={"total_max_attempts": 1}),
    )


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def control(monkeypatch):
    """The daemon's control endpoint alone, on free ports (no moto, no podman); the cli module that talks to it.
    The capacity limits it sets (spot, start) are lifted at the end."""
    from localcloud import cli, daemon, moto_compat

    port = _free_port()
    while not daemon.port_free(port - 1):
        port = _free_port()
    monkeypatch.setenv("DT_LOCALCLOUD_PORT", str(port))
    server = ThreadingHTTPServer(("127.0.0.1", port - 1), daemon._Control)
    server.daemon_state = {"ready": True}
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(cli, "_daemon_pid", lambda: 1)
    yield cli
    server.shutdown()
    moto_compat.set_spot_capacity(None)
    moto_compat.set_no_start_capacity([])
