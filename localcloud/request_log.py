"""Every AWS API call the local cloud serves, recorded server-side (issue 12).

A WSGI middleware in front of moto's server writes one JSON line per request to
`$DT_LOCALCLOUD_HOME/api-calls.jsonl`: the service (the SigV4 signing name, which
is the IAM prefix: `ec2`, `elasticfilesystem`, `sts`, ...), the API action and
`iam_action` (`ec2:RunInstances`), the HTTP status, and the caller's User-Agent.
The User-Agent tells the product's calls (Ansible's AWS modules, our modules and
the inventory plugin all send `Ansible/<version>`) from the cloud's own
bookkeeping and a test's direct boto3 look-ups. The IAM test compares the
product's calls with files/iam/controller-policy.json (`compare`).

The action is found the way AWS's front end finds it: `Action=` of the query
protocol (EC2, STS, IAM; in the query string or the form body), `X-Amz-Target` of
the JSON protocol (Service Quotas), or the method + path of the REST protocols
(EFS), matched against botocore's model of the service.
"""
from __future__ import annotations

import io
import json
import os
import re
import threading
import time
from functools import lru_cache
from urllib.parse import parse_qs

FILE_NAME = "api-calls.jsonl"
# The User-Agent mark of the product's calls (amazon.aws module_utils/botocore.py:
# "APN/1.0 Ansible/<version> ..."; the inventory plugin and our modules use the same client code).
PRODUCT_MARK = "Ansible/"
# The local cloud's own calls (daemon, reconciler) carry this in their User-Agent.
INTERNAL_MARK = "dynatrain-localcloud"
# botocore's service name where it differs from the signing name (the IAM prefix).
_BOTOCORE_NAME = {"elasticfilesystem": "efs"}
_CREDENTIAL = re.compile(r"Credential=[^/]+/\d{8}/[^/]+/([^/]+)/aws4_request")


def log_path(home):
    return os.path.join(home, FILE_NAME)


def _service(environ):
    match = _CREDENTIAL.search(environ.get("HTTP_AUTHORIZATION", ""))
    if match:
        return match.group(1)
    # presigned or unsigned: X-Amz-Credential in the query string
    cred = parse_qs(environ.get("QUERY_STRING", "")).get("X-Amz-Credential", [""])[0]
    parts = cred.split("/")
    return parts[3] if len(parts) >= 5 else None


def _read_body(environ):
    """The request body, put back so moto reads it too."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    body = environ["wsgi.input"].read(length) if length > 0 else b""
    environ["wsgi.input"] = io.BytesIO(body)
    return body


@lru_cache(maxsize=None)
def _rest_routes(service):
    """[(method, path regex, required query keys, required headers, operation)] from botocore's model,
    the most specific first."""
    import botocore.session

    try:
        model = botocore.session.get_session().get_service_model(_BOTOCORE_NAME.get(service, service))
    except Exception:  # an unknown service: no routes, the call is logged without an action
        return []
    routes = []
    for name in model.operation_names:
        op = model.operation_model(name)
        uri = op.http.get("requestUri", "/")
        path, query = (uri.split("?", 1) + [""])[:2]
        pattern = re.sub(r"\\\{[^}]+\\\+\\\}", ".+", re.escape(path))
        pattern = re.sub(r"\\\{[^}]+\\\}", "[^/]+", pattern)
        # The URI's literal query keys (S3's "?encryption"; botocore's "x-id" is never sent), and
        # what a request of this operation always carries: its required query-string members
        # (AbortMultipartUpload's uploadId) and headers (CopyObject's x-amz-copy-source). Same
        # path and method, told apart by these.
        keys = {q.split("=", 1)[0] for q in query.split("&") if q and not q.startswith("x-id=")}
        headers = set()
        shape = op.input_shape
        for member in (shape.required_members if shape is not None else []):
            where = shape.members[member].serialization
            if where.get("location") == "querystring":
                keys.add(where.get("name", member))
            elif where.get("location") == "header":
                headers.add(where.get("name", member).lower())
        literal = len(re.sub(r"\{[^}]+\}", "", path))
        routes.append((op.http.get("method", "POST"), re.compile(pattern + "/?$"), tuple(sorted(keys)),
                       tuple(sorted(headers)), literal, name))
    # most specific first: /file-systems/{Id}/lifecycle-configuration before /file-systems/{Id},
    # CopyObject (a required header) before PutObject
    routes.sort(key=lambda r: (-(len(r[2]) + len(r[3])), -r[4]))
    return routes


def _rest_action(service, method, path, query, headers=frozenset()):
    present = set(parse_qs(query, keep_blank_values=True))
    for verb, pattern, keys, needs, _literal, name in _rest_routes(service):
        if verb == method and pattern.match(path) and set(keys) <= present and set(needs) <= headers:
            return name
    return None


# S3 operations whose IAM action has another name (AWS's Service Authorization Reference).
_S3_IAM_ACTION = {
    "HeadBucket": "ListBucket",
    "ListObjects": "ListBucket",
    "ListObjectsV2": "ListBucket",
    "HeadObject": "GetObject",
    "GetBucketEncryption": "GetEncryptionConfiguration",
    "PutBucketEncryption": "PutEncryptionConfiguration",
    "DeleteBucketEncryption": "PutEncryptionConfiguration",
    "GetPublicAccessBlock": "GetBucketPublicAccessBlock",
    "PutPublicAccessBlock": "PutBucketPublicAccessBlock",
    "DeletePublicAccessBlock": "PutBucketPublicAccessBlock",
    "GetBucketAccelerateConfiguration": "GetAccelerateConfiguration",
    "GetBucketInventoryConfiguration": "GetInventoryConfiguration",
    "ListBucketInventoryConfigurations": "GetInventoryConfiguration",
    "ListBucketAnalyticsConfigurations": "GetAnalyticsConfiguration",
    "ListBucketMetricsConfigurations": "GetMetricsConfiguration",
    "ListBucketIntelligentTieringConfigurations": "GetIntelligentTieringConfiguration",
    "GetObjectLockConfiguration": "GetBucketObjectLockConfiguration",
    "DeleteBucketTagging": "PutBucketTagging",
    "DeleteObjects": "DeleteObject",
    "CreateMultipartUpload": "PutObject",
    "UploadPart": "PutObject",
    "CompleteMultipartUpload": "PutObject",
    "ListObjectVersions": "ListBucketVersions",
    # The lifecycle: botocore's old and new operations share one URI (the old one matches first).
    "GetBucketLifecycle": "GetLifecycleConfiguration",
    "GetBucketLifecycleConfiguration": "GetLifecycleConfiguration",
    "PutBucketLifecycle": "PutLifecycleConfiguration",
    "PutBucketLifecycleConfiguration": "PutLifecycleConfiguration",
    "DeleteBucketLifecycle": "PutLifecycleConfiguration",
}


def iam_action(service, action):
    """The IAM action a call needs (`s3:ListBucket` for HeadBucket); None for an unknown call."""
    if not (service and action):
        return None
    if service == "s3":
        action = _S3_IAM_ACTION.get(action, action)
    return "%s:%s" % (service, action)


def action_of(environ):
    """(service, action) of one request; either may be None (moto's own /moto-api/ calls)."""
    service = _service(environ)
    query = environ.get("QUERY_STRING", "")
    action = parse_qs(query).get("Action", [None])[0]
    target = environ.get("HTTP_X_AMZ_TARGET")
    if not action and target:
        action = target.rsplit(".", 1)[-1]
    if not action and environ.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded"):
        action = parse_qs(_read_body(environ).decode("utf-8", "replace")).get("Action", [None])[0]
    if not action and service:
        headers = {k[5:].replace("_", "-").lower() for k in environ if k.startswith("HTTP_")}
        action = _rest_action(service, environ.get("REQUEST_METHOD", "GET"), environ.get("PATH_INFO", "/"), query,
                              headers)
    return service, action


class RequestLog:
    """WSGI middleware: record each request, then hand it to moto unchanged."""

    def __init__(self, app, path):
        self.app = app
        self.path = path
        self._lock = threading.Lock()

    def __call__(self, environ, start_response):
        if environ.get("PATH_INFO", "").startswith("/moto-api"):
            return self.app(environ, start_response)
        service, action = action_of(environ)
        status = {}

        def recording_start_response(code, headers, exc_info=None):
            status["code"] = int(code.split(" ", 1)[0])
            return start_response(code, headers, exc_info)

        result = self.app(environ, recording_start_response)
        self.write(service, action, status.get("code"), environ.get("HTTP_USER_AGENT", ""))
        return result

    def write(self, service, action, code, user_agent):
        record = {"t": round(time.time(), 3), "service": service, "action": action,
                  "iam_action": iam_action(service, action),
                  "status": code, "user_agent": user_agent}
        line = json.dumps(record, sort_keys=True) + "\n"
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line)


def logging_server(ip_address, port, path):
    """moto's ThreadedMotoServer with RequestLog in front of its application."""
    from moto.server import ThreadedMotoServer
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    class LoggingMotoServer(ThreadedMotoServer):
        def _server_entry(self):
            app = RequestLog(DomainDispatcherApplication(create_backend_app), path)
            self._server = make_server(self._ip_address, self._port, app, True, request_handler=MotoRequestHandler)
            self._server_ready_event.set()
            self._server.serve_forever()

    return LoggingMotoServer(ip_address=ip_address, port=port, verbose=False)


# --- reading the log and comparing it with a policy (the IAM tests) ---

def read(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def product_actions(records):
    """The IAM actions the product called (its User-Agent has PRODUCT_MARK)."""
    return {r["iam_action"] for r in records
            if r.get("iam_action") and PRODUCT_MARK in (r.get("user_agent") or "")}


def policy_actions(policy):
    """Every action a policy document allows (Allow statements; Action as a string or list)."""
    out = set()
    for statement in policy["Statement"]:
        if statement.get("Effect") == "Allow":
            actions = statement.get("Action", [])
            out.update([actions] if isinstance(actions, str) else actions)
    return out


def compare(allowed, called, not_exercised, not_needed=None):
    """Problems between a policy's actions and the calls a run made, as sentences (none = proven).

    `not_exercised` maps an allowed action the run cannot make to why (paths the local
    run does not take, permissions AWS checks on the caller's behalf); `not_needed` maps a
    called action that needs no grant to why (AWS requires none, or the caller goes on
    when it is denied). A stale entry in either is reported too.
    """
    not_needed = set(not_needed or ())
    not_exercised = set(not_exercised)
    problems = []
    for action in sorted(called - allowed - not_needed):
        problems.append("called but not allowed by the policy: %s" % action)
    for action in sorted(allowed - called - not_exercised):
        problems.append("allowed but never called (remove it, or list it as not exercised with why): %s" % action)
    for action in sorted(not_exercised & called):
        problems.append("listed as not exercised but called: %s" % action)
    for action in sorted(not_exercised - allowed):
        problems.append("listed as not exercised but not in the policy: %s" % action)
    for action in sorted(not_needed & allowed):
        problems.append("listed as not needed but allowed by the policy: %s" % action)
    for action in sorted(not_needed - called):
        problems.append("listed as not needed but never called: %s" % action)
    return problems
