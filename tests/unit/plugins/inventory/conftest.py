"""Fixtures for the ec2_elastic inventory plugin tests (moto in-process, no network)."""
from __future__ import annotations

import os
import botocore.client
import pytest


@pytest.fixture(autouse=True)
def aws_env(monkeypatch, tmp_path):
    """Fake credentials, no real config files, no IMDS, no endpoint overrides."""
    for name in list(os.environ):
        if name.startswith("AWS_") or name.startswith("ANSIBLE_CACHE"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    from ansible_collections.dynatrain.elastic.plugins.inventory import ec2_elastic

    ec2_elastic.InventoryModule._gpu_memo.clear()
    yield
    ec2_elastic.InventoryModule._gpu_memo.clear()


@pytest.fixture
def api_calls(monkeypatch):
    """Every AWS API call made, as (service, operation, region) tuples."""
    calls = []
    real = botocore.client.BaseClient._make_api_call

    def counting(self, operation_name, api_params):
        calls.append((self.meta.service_model.service_name, operation_name, self.meta.region_name))
        return real(self, operation_name, api_params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", counting)
    return calls
