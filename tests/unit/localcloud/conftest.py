"""Fixtures for the local cloud's tests (the repo root is on sys.path through tests/unit/conftest.py)."""

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
