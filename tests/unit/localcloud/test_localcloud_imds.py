"""IMDSv2 token rules, metadata paths and spot-interruption notices (no containers)."""

import json
import urllib.error
import urllib.request

import pytest

from localcloud.imds import ImdsRegistry, ImdsServer, InstanceMetadata, TokenStore, respond

PUT_TTL = {"X-aws-ec2-metadata-token-ttl-seconds": "60"}


@pytest.fixture
def meta():
    return InstanceMetadata(
        "i-0123456789abcdef0",
        "127.0.0.1",
        instance_type="c5.xlarge",
        region="us-east-1",
        availability_zone="us-east-1b",
        public_key="ssh-ed25519 AAAAC3Nza test\n",
        key_name="cluster-key",
        tags={"dynatrain:cluster": "demo"},
    )


def token(meta, tokens, now=1000.0):
    status, _ctype, tok = respond(meta, tokens, "PUT", "/latest/api/token", PUT_TTL, now=now)
    assert status == 200
    return tok


def get(meta, tokens, path, tok, now=1000.0):
    return respond(meta, tokens, "GET", path, {"X-aws-ec2-metadata-token": tok} if tok else {}, now=now)


def test_get_without_token_is_401(meta):
    assert get(meta, TokenStore(), "/latest/meta-data/instance-id", None)[0] == 401


def test_get_with_unknown_token_is_401(meta):
    assert get(meta, TokenStore(), "/latest/meta-data/instance-id", "made-up")[0] == 401


def test_token_then_get(meta):
    tokens = TokenStore()
    tok = token(meta, tokens)
    assert get(meta, tokens, "/latest/meta-data/instance-id", tok) == (200, "text/plain", "i-0123456789abcdef0")


def test_token_expires_after_ttl(meta):
    tokens = TokenStore()
    tok = token(meta, tokens, now=1000.0)
    assert get(meta, tokens, "/latest/meta-data/local-ipv4", tok, now=1059.0)[0] == 200
    assert get(meta, tokens, "/latest/meta-data/local-ipv4", tok, now=1060.5)[0] == 401


def test_tokens_are_per_instance(meta):
    other = InstanceMetadata("i-other", "127.0.0.2")
    tok = token(meta, TokenStore())
    assert get(other, TokenStore(), "/latest/meta-data/instance-id", tok)[0] == 401


@pytest.mark.parametrize(
    "headers,status",
    [
        ({}, 400),
        ({"X-aws-ec2-metadata-token-ttl-seconds": "0"}, 400),
        ({"X-aws-ec2-metadata-token-ttl-seconds": "21601"}, 400),
        ({"X-aws-ec2-metadata-token-ttl-seconds": "abc"}, 400),
        ({"X-aws-ec2-metadata-token-ttl-seconds": "21600"}, 200),
        ({"X-aws-ec2-metadata-token-ttl-seconds": "60", "X-Forwarded-For": "1.2.3.4"}, 403),
    ],
)
def test_token_request_validation(meta, headers, status):
    assert respond(meta, TokenStore(), "PUT", "/latest/api/token", headers)[0] == status


def test_token_needs_put(meta):
    assert respond(meta, TokenStore(), "GET", "/latest/api/token", PUT_TTL)[0] == 405


@pytest.mark.parametrize(
    "path,body",
    [
        ("/latest/meta-data/local-ipv4", "127.0.0.1"),
        ("/latest/meta-data/instance-type", "c5.xlarge"),
        ("/latest/meta-data/placement/region", "us-east-1"),
        ("/latest/meta-data/placement/availability-zone", "us-east-1b"),
        ("/latest/meta-data/public-keys/", "0=cluster-key"),
        ("/latest/meta-data/public-keys/0/openssh-key", "ssh-ed25519 AAAAC3Nza test"),
        ("/latest/meta-data/tags/instance/dynatrain:cluster", "demo"),
        ("/latest/meta-data/hostname", "ip-127-0-0-1.ec2.internal"),
    ],
)
def test_metadata_paths(meta, path, body):
    tokens = TokenStore()
    assert get(meta, tokens, path, token(meta, tokens))[2] == body


def test_listing_and_unknown_path(meta):
    tokens = TokenStore()
    tok = token(meta, tokens)
    status, _ctype, body = get(meta, tokens, "/latest/meta-data/", tok)
    assert status == 200 and "instance-id" in body.split("\n") and "placement/" in body.split("\n")
    assert get(meta, tokens, "/latest/meta-data/nope", tok)[0] == 404
    doc = json.loads(get(meta, tokens, "/latest/dynamic/instance-identity/document", tok)[2])
    assert doc["instanceId"] == "i-0123456789abcdef0" and doc["region"] == "us-east-1"


def test_interruption_notices(meta):
    reg = ImdsRegistry()
    tokens = TokenStore()
    tok = token(meta, tokens)
    assert get(meta, tokens, "/latest/meta-data/spot/instance-action", tok)[0] == 404
    assert get(meta, tokens, "/latest/meta-data/events/recommendations/rebalance", tok)[0] == 404
    intr = reg.interrupt(meta.instance_id, after=120, now=1_700_000_000)
    meta.interruption = intr  # what ensure() does for a running server
    status, ctype, body = get(meta, tokens, "/latest/meta-data/spot/instance-action", tok)
    assert status == 200 and ctype == "application/json"
    assert json.loads(body) == {"action": "terminate", "time": "2023-11-14T22:15:20Z"}
    status, _ctype, body = get(meta, tokens, "/latest/meta-data/events/recommendations/rebalance", tok)
    assert json.loads(body) == {"noticeTime": "2023-11-14T22:13:20Z"}


def test_server_over_http_and_interrupt_reaches_running_server():
    meta = InstanceMetadata("i-http", "127.0.0.1")
    reg = ImdsRegistry(port=0)  # any free port
    srv = reg.ensure(meta)
    base = "http://127.0.0.1:%d" % srv.server_address[1]
    try:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(base + "/latest/meta-data/instance-id", timeout=5)
        assert e.value.code == 401
        req = urllib.request.Request(base + "/latest/api/token", method="PUT", headers=PUT_TTL)
        with urllib.request.urlopen(req, timeout=5) as r:
            tok = r.read().decode()
        hdr = {"X-aws-ec2-metadata-token": tok}
        with urllib.request.urlopen(
            urllib.request.Request(base + "/latest/meta-data/instance-id", headers=hdr), timeout=5
        ) as r:
            assert r.read() == b"i-http"
        reg.interrupt("i-http", after=5)
        with urllib.request.urlopen(
            urllib.request.Request(base + "/latest/meta-data/spot/instance-action", headers=hdr), timeout=5
        ) as r:
            assert json.loads(r.read())["action"] == "terminate"
    finally:
        reg.stop_all()
    assert isinstance(srv, ImdsServer) and not reg.servers


def test_instance_profile_associated_after_the_server_started_is_served():
    # The reconciler may see an instance before its instance profile is associated (the
    # template's profile is attached right after the launch): the running server picks it up.
    reg = ImdsRegistry(port=0)
    srv = reg.ensure(InstanceMetadata("i-late", "127.0.0.1"))
    try:
        assert "iam" not in srv.meta.tree()
        arn = "arn:aws:iam::123456789012:instance-profile/dynatrain-c-master"
        same = reg.ensure(InstanceMetadata("i-late", "127.0.0.1", iam_role=arn))
        assert same is srv
        creds = srv.meta.tree()["iam"]["security-credentials"]
        assert list(creds) == ["dynatrain-c-master"]
    finally:
        reg.stop_all()


def test_public_ipv4_only_with_a_public_address(meta):
    # As on EC2: no public-ipv4/public-hostname for an instance without a public IP.
    tokens = TokenStore()
    tok = token(meta, tokens)
    listing = get(meta, tokens, "/latest/meta-data/", tok)[2].split("\n")
    assert "public-ipv4" not in listing and "public-hostname" not in listing
    assert get(meta, tokens, "/latest/meta-data/public-ipv4", tok)[0] == 404
    assert get(meta, tokens, "/latest/meta-data/public-hostname", tok)[0] == 404

    pub = InstanceMetadata("i-pub", "127.77.1.10", region="us-east-1", public_ip="127.254.3.4")
    tokens = TokenStore()
    tok = token(pub, tokens)
    listing = get(pub, tokens, "/latest/meta-data/", tok)[2].split("\n")
    assert "public-ipv4" in listing and "public-hostname" in listing
    assert get(pub, tokens, "/latest/meta-data/public-ipv4", tok) == (200, "text/plain", "127.254.3.4")
    assert get(pub, tokens, "/latest/meta-data/local-ipv4", tok)[2] == "127.77.1.10"
    assert get(pub, tokens, "/latest/meta-data/public-hostname", tok)[2] == "ec2-127-254-3-4.compute-1.amazonaws.com"
    other = InstanceMetadata("i-pub2", "127.77.1.11", region="eu-west-1", public_ip="127.254.3.5")
    assert other.public_hostname == "ec2-127-254-3-5.eu-west-1.compute.amazonaws.com"


def test_public_address_change_reaches_the_running_server():
    reg = ImdsRegistry(port=0)
    srv = reg.ensure(InstanceMetadata("i-p", "127.0.0.1"))
    try:
        assert "public-ipv4" not in srv.meta.tree()
        assert reg.ensure(InstanceMetadata("i-p", "127.0.0.1", public_ip="127.254.0.9")) is srv
        assert srv.meta.tree()["public-ipv4"] == "127.254.0.9"
    finally:
        reg.stop_all()
