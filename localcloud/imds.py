"""EC2 instance metadata service (IMDSv2 only), one HTTP server per instance.

Each server binds `<private-ip>:1338`: a loopback address that only that
node's processes use (they read it from AWS_EC2_METADATA_SERVICE_ENDPOINT),
just as each EC2 instance reaches its own 169.254.169.254. Our launch
templates set HttpTokens=required, so a GET without a valid token is 401,
like AWS; there is no IMDSv1 fallback.

`respond()` is a pure function (request -> status, type, body) so the token
and interruption rules are unit-tested without sockets.
"""

import datetime
import json
import logging
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import config

log = logging.getLogger("localcloud.imds")

TOKEN_HEADER = "X-aws-ec2-metadata-token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
MAX_TTL = 21600  # AWS's limit (6 h)


def iso(ts):
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class TokenStore:
    """Session tokens of one instance: random, expire after their TTL."""

    def __init__(self):
        self._tokens = {}
        self._lock = threading.Lock()

    def issue(self, ttl, now=None):
        now = time.time() if now is None else now
        token = secrets.token_urlsafe(32)
        with self._lock:
            # Drop expired ones so a long-lived node doesn't grow the dict.
            self._tokens = {t: exp for t, exp in self._tokens.items() if exp > now}
            self._tokens[token] = now + ttl
        return token

    def valid(self, token, now=None):
        now = time.time() if now is None else now
        with self._lock:
            exp = self._tokens.get(token or "")
        return exp is not None and exp > now


class Interruption:
    """A scheduled spot interruption: notices now, termination at `terminate_at`."""

    def __init__(self, notice_at, terminate_at):
        self.notice_at = notice_at
        self.terminate_at = terminate_at

    def instance_action(self):
        return {"action": "terminate", "time": iso(self.terminate_at)}

    def rebalance(self):
        return {"noticeTime": iso(self.notice_at)}


class InstanceMetadata:
    """What IMDS knows about one instance (filled from describe_instances)."""

    def __init__(
        self,
        instance_id,
        private_ip,
        instance_type="t3.micro",
        region=config.REGION,
        availability_zone=None,
        public_key=None,
        key_name=None,
        ami_id=None,
        tags=None,
        launch_time=None,
        account_id="123456789012",
        iam_role=None,
        lifecycle="on-demand",
        public_ip=None,
    ):
        self.instance_id = instance_id
        self.private_ip = private_ip
        self.instance_type = instance_type
        self.region = region
        self.availability_zone = availability_zone or region + "a"
        self.public_key = public_key
        self.key_name = key_name or "key"
        self.ami_id = ami_id or ""
        self.tags = dict(tags or {})
        self.launch_time = launch_time or iso(time.time())
        self.account_id = account_id
        self.iam_role = iam_role
        self.lifecycle = lifecycle
        self.public_ip = public_ip or None  # from the local cloud's public pool, if any
        self.interruption = None  # Interruption once `localcloud interrupt` ran

    @property
    def hostname(self):
        return "ip-%s.ec2.internal" % self.private_ip.replace(".", "-")

    @property
    def public_hostname(self):
        """EC2's public DNS name (as DescribeInstances' PublicDnsName); None without a public IP."""
        if not self.public_ip:
            return None
        suffix = "compute-1.amazonaws.com" if self.region == "us-east-1" else self.region + ".compute.amazonaws.com"
        return "ec2-%s.%s" % (self.public_ip.replace(".", "-"), suffix)

    def tree(self):
        """The meta-data hierarchy; dict = directory, str = leaf."""
        t = {
            "ami-id": self.ami_id,
            "hostname": self.hostname,
            "local-hostname": self.hostname,
            "instance-id": self.instance_id,
            "instance-type": self.instance_type,
            "instance-life-cycle": self.lifecycle,
            "local-ipv4": self.private_ip,
            "placement": {"region": self.region, "availability-zone": self.availability_zone},
            "tags": {"instance": {k: str(v) for k, v in self.tags.items()}},
        }
        if self.public_ip:  # EC2 lists these only for an instance with a public address
            t["public-ipv4"] = self.public_ip
            t["public-hostname"] = self.public_hostname
        if self.public_key:
            t["public-keys"] = {"0": {"openssh-key": self.public_key.strip()}}
        if self.iam_role:
            t["iam"] = {
                "info": json.dumps({"Code": "Success", "InstanceProfileArn": self.iam_role}),
                "security-credentials": {self.iam_role.rsplit("/", 1)[-1]: _credentials()},
            }
        if self.interruption:
            t["spot"] = {"instance-action": json.dumps(self.interruption.instance_action())}
            t["events"] = {"recommendations": {"rebalance": json.dumps(self.interruption.rebalance())}}
        return t

    def identity_document(self):
        return json.dumps(
            {
                "accountId": self.account_id,
                "architecture": "x86_64",
                "availabilityZone": self.availability_zone,
                "imageId": self.ami_id,
                "instanceId": self.instance_id,
                "instanceType": self.instance_type,
                "pendingTime": self.launch_time,
                "privateIp": self.private_ip,
                "region": self.region,
                "version": "2017-09-30",
            },
            indent=2,
        )


def _credentials():
    # Not secrets: the local endpoint accepts any credentials.
    return json.dumps(
        {
            "Code": "Success",
            "Type": "AWS-HMAC",
            "AccessKeyId": config.ACCESS_KEY,
            "SecretAccessKey": config.SECRET_KEY,
            "Token": "localcloud",
            "Expiration": iso(time.time() + 6 * 3600),
            "LastUpdated": iso(time.time()),
        }
    )


def _lookup(tree, parts):
    node = tree
    for p in parts:
        if not isinstance(node, dict) or p not in node:
            return None
        node = node[p]
    return node


def _listing(node, key_name=None):
    if key_name is not None:
        # AWS lists key slots as "<index>=<key name>".
        return "\n".join("%s=%s" % (k, key_name) for k in sorted(node))
    return "\n".join(k + "/" if isinstance(v, dict) else k for k, v in sorted(node.items()))


def respond(meta, tokens, method, path, headers, now=None):
    """Answer one IMDS request: returns (status, content_type, body)."""
    h = {k.lower(): v for k, v in headers.items()}
    text = "text/plain"
    path = path.split("?", 1)[0]
    if path == "/latest/api/token":
        if method != "PUT":
            return 405, text, "Method Not Allowed"
        if "x-forwarded-for" in h:  # AWS refuses token requests that went through a proxy
            return 403, text, "Forbidden"
        try:
            ttl = int(h.get(TTL_HEADER.lower(), ""))
        except ValueError:
            return 400, text, "Bad Request: missing or invalid %s" % TTL_HEADER
        if not 1 <= ttl <= MAX_TTL:
            return 400, text, "Bad Request: %s must be 1..%d" % (TTL_HEADER, MAX_TTL)
        return 200, text, tokens.issue(ttl, now)
    if method not in ("GET", "HEAD"):
        return 405, text, "Method Not Allowed"
    if not tokens.valid(h.get(TOKEN_HEADER.lower()), now):
        return 401, text, "Unauthorized"
    if path in ("/", "/latest", "/latest/"):
        return 200, text, "dynamic\nmeta-data\n"
    if path.rstrip("/") == "/latest/dynamic/instance-identity/document":
        return 200, "application/json", meta.identity_document()
    prefix = "/latest/meta-data"
    if not (path == prefix or path.startswith(prefix + "/")):
        return 404, text, "Not Found"
    parts = [p for p in path[len(prefix) :].split("/") if p]
    if parts[:1] == ["public-keys"] and len(parts) == 2 and not path.endswith("/"):
        parts.append("")  # /public-keys/0 lists its formats, like /public-keys/0/
    node = _lookup(meta.tree(), [p for p in parts if p])
    if node is None:
        return 404, text, "Not Found"
    if isinstance(node, dict):
        return 200, text, _listing(node, meta.key_name if parts == ["public-keys"] else None)
    ctype = "application/json" if node.startswith("{") else text
    return 200, ctype, node


class _Handler(BaseHTTPRequestHandler):
    server_version = "EC2ws"
    sys_version = ""

    def _serve(self):
        status, ctype, body = respond(self.server.meta, self.server.tokens, self.command, self.path, self.headers)
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        if self.command == "PUT" and status == 200:
            self.send_header(TTL_HEADER, self.headers.get(TTL_HEADER, ""))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_HEAD = do_POST = _serve

    def log_message(self, fmt, *args):  # quiet: the daemon log is for decisions
        log.debug("imds %s %s", self.server.meta.instance_id, fmt % args)


class ImdsServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, meta, port=config.IMDS_PORT):
        self.meta = meta
        self.tokens = TokenStore()
        super().__init__((meta.private_ip, port), _Handler)
        self.thread = threading.Thread(target=self.serve_forever, name="imds-" + meta.instance_id, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.shutdown()
        self.server_close()


class ImdsRegistry:
    """The running IMDS servers, keyed by instance id."""

    def __init__(self, port=config.IMDS_PORT):
        self.port = port
        self.servers = {}
        self.interruptions = {}  # instance id -> Interruption, survives server restarts

    def ensure(self, meta):
        srv = self.servers.get(meta.instance_id)
        if srv and srv.meta.private_ip == meta.private_ip:
            # Keep tokens and interruption; refresh what may change (tags, and the instance
            # profile: AssociateIamInstanceProfile, or a launch seen before its association;
            # the public address).
            srv.meta.tags = meta.tags
            srv.meta.public_key = meta.public_key
            srv.meta.iam_role = meta.iam_role
            srv.meta.public_ip = meta.public_ip
            return srv
        if srv:
            self.stop(meta.instance_id)
        meta.interruption = self.interruptions.get(meta.instance_id)
        srv = ImdsServer(meta, self.port).start()
        self.servers[meta.instance_id] = srv
        log.info("IMDS for %s on http://%s:%d/", meta.instance_id, meta.private_ip, self.port)
        return srv

    def stop(self, instance_id):
        srv = self.servers.pop(instance_id, None)
        if srv:
            srv.stop()
            log.info("IMDS for %s stopped", instance_id)

    def interrupt(self, instance_id, after, now=None):
        now = time.time() if now is None else now
        intr = Interruption(now, now + after)
        self.interruptions[instance_id] = intr
        srv = self.servers.get(instance_id)
        if srv:
            srv.meta.interruption = intr
        return intr

    def stop_all(self):
        for iid in list(self.servers):
            self.stop(iid)
