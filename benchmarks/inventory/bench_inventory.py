#!/usr/bin/env python3
"""Benchmark: dynatrain.elastic.ec2_elastic vs amazon.aws.aws_ec2 (keyed_groups/groups giving the
same dt_* groups), both via `ansible-inventory --list`, on the same moto server on 127.0.0.1.

Prints, per size: wall time of each, their ratio, and the API calls each made (counted
server-side by a WSGI middleware in front of moto). Checks that both produce the same groups.

    .venv/bin/python benchmarks/inventory/bench_inventory.py            # 100, 1000, 5000
    .venv/bin/python benchmarks/inventory/bench_inventory.py --sizes 100,1000 --repeat 3
"""
from __future__ import annotations

import argparse
import collections
import io
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts"))
import project_python  # noqa: E402  (the script's venv, when typed with another python)
project_python.require("controller", "boto3", "moto")
import boto3  # noqa: E402
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app  # noqa: E402
from werkzeug.serving import make_server  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
REGION = "us-east-1"
AMI = "ami-12c6146b"
CLUSTER = "bench"
STATUSES = ("ADD_QUEUED", "ADDED", "REMOVAL_QUEUED", "REMOVED", "ADD_FAILED")
TYPES = ("g4dn.xlarge", "g4dn.12xlarge", "c5.xlarge")

OURS = f"""\
plugin: dynatrain.elastic.ec2_elastic
regions: [{REGION}]
hostnames: [private-ip-address]
"""

# amazon.aws.aws_ec2 configured by hand to give the same groups (what users write today)
THEIRS = f"""\
plugin: amazon.aws.aws_ec2
regions: [{REGION}]
# moto renders DescribeInstances in O(n^2) (per-instance tag scans): 5000 instances take
# longer than botocore's default 60 s read timeout
aws_config:
  read_timeout: 900
hostnames: [private-ip-address]
filters:
  tag-key: dynatrain:cluster
groups:
  dt_master: "tags.get('dynatrain:role', '') | lower == 'master' or tags.get('NodeType', '') | lower == 'master'"
  dt_workers: "(tags.get('dynatrain:role') or tags.get('NodeType') or
    ('worker' if (tags['dynatrain:cluster'] ~ '-aws-dl-cfn-elastic-worker') in tags else '')) | lower in ['master', 'worker']"
  dt_base: "(tags.get('dynatrain:role') or tags.get('NodeType') or '') | lower == 'worker'
    and (tags['dynatrain:cluster'] ~ '-aws-dl-cfn-elastic-worker') not in tags"
  dt_elastic: "(tags['dynatrain:cluster'] ~ '-aws-dl-cfn-elastic-worker') in tags"
  dt_spot: "instance_lifecycle | default('') == 'spot'"
keyed_groups:
  - key: tags['elastic_worker_status'] | lower
    prefix: dt_status
  - key: tags['dynatrain:cluster'] | regex_replace('[^A-Za-z0-9_]', '_')
    prefix: dt_cluster
"""


class CountingApp:
    """WSGI middleware counting API calls (Action=... of the EC2/STS query protocol)."""

    def __init__(self, app):
        self.app = app
        self.calls = collections.Counter()
        self.server_s = 0.0
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        action = None
        length = int(environ.get("CONTENT_LENGTH") or 0)
        if length:
            body = environ["wsgi.input"].read(length)
            environ["wsgi.input"] = io.BytesIO(body)
            action = urllib.parse.parse_qs(body.decode("utf-8", "replace")).get("Action", [None])[0]
        action = action or urllib.parse.parse_qs(environ.get("QUERY_STRING", "")).get("Action", [None])[0]
        start = time.perf_counter()
        result = self.app(environ, start_response)
        if action and not environ.get("PATH_INFO", "").startswith("/moto-api"):
            with self.lock:
                self.calls[action] += 1
                self.server_s += time.perf_counter() - start
        return result

    def take(self):
        """(API calls by action, seconds moto spent answering them) since the last take()."""
        with self.lock:
            calls, self.calls = self.calls, collections.Counter()
            server_s, self.server_s = self.server_s, 0.0
        return calls, server_s


def start_server():
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app = CountingApp(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, app, f"http://127.0.0.1:{server.server_port}"


def populate(endpoint, size):
    """1 master, ~20% elastic workers (every status), ~20% spot, the rest base workers,
    spread over the default subnets (a /20 holds ~4000 addresses)."""
    urllib.request.urlopen(urllib.request.Request(endpoint + "/moto-api/reset", method="POST")).read()
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=endpoint,
                       aws_access_key_id="bench", aws_secret_access_key="bench")
    subnets = [s["SubnetId"] for s in ec2.describe_subnets()["Subnets"]]
    plan = [("master", None, False, 1)]
    elastic = max(len(STATUSES), size // 5)
    spot = size // 5
    for i, status in enumerate(STATUSES):
        plan.append(("elastic", status, i % 2 == 0, elastic // len(STATUSES)))
    plan.append(("base", None, True, spot))
    plan.append(("base", None, False, size - 1 - spot - (elastic // len(STATUSES)) * len(STATUSES)))
    n = 0
    for kind, status, is_spot, count in plan:
        tags = {"dynatrain:cluster": CLUSTER}
        if kind == "master":
            tags["dynatrain:role"] = "master"
        elif kind == "base":
            tags["dynatrain:role"] = "worker"
        else:
            tags.update({f"{CLUSTER}-aws-dl-cfn-elastic-worker": "", "elastic_worker_status": status})
        while count > 0:
            chunk = min(count, 500)
            kwargs = dict(
                ImageId=AMI, MinCount=chunk, MaxCount=chunk, InstanceType=TYPES[n % len(TYPES)],
                SubnetId=subnets[n % len(subnets)],
                TagSpecifications=[{"ResourceType": "instance",
                                    "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
            )
            if is_spot:
                kwargs["InstanceMarketOptions"] = {"MarketType": "spot"}
            ec2.run_instances(**kwargs)
            count -= chunk
            n += 1
    # noise the plugins must leave out
    ec2.run_instances(ImageId=AMI, MinCount=5, MaxCount=5, InstanceType="t3.micro", SubnetId=subnets[-1])


def run_inventory(config_path, endpoint):
    env = dict(os.environ)
    env.update(
        ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
        ANSIBLE_INVENTORY_ENABLED="dynatrain.elastic.ec2_elastic,amazon.aws.aws_ec2",
        ANSIBLE_INVENTORY_UNPARSED_FAILED="true",
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION=REGION,
        AWS_EC2_METADATA_DISABLED="true",
        PATH=BIN + os.pathsep + env.get("PATH", ""),
    )
    env.pop("AWS_PROFILE", None)
    start = time.perf_counter()
    proc = subprocess.run([os.path.join(BIN, "ansible-inventory"), "-i", config_path, "--list"],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"ansible-inventory failed for {config_path}:\n{proc.stderr}")
    return elapsed, json.loads(proc.stdout)


def dt_groups(listing):
    return {g: sorted(v.get("hosts", [])) for g, v in listing.items()
            if g.startswith("dt_") and v.get("hosts")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,5000", help="comma-separated instance counts")
    parser.add_argument("--repeat", type=int, default=1, help="runs per plugin and size (best is kept)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]

    server, counter, endpoint = start_server()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ours_cfg = os.path.join(tmp, "bench.ec2_elastic.yml")
        theirs_cfg = os.path.join(tmp, "bench.aws_ec2.yml")
        with open(ours_cfg, "w", encoding="utf-8") as f:
            f.write(OURS)
        with open(theirs_cfg, "w", encoding="utf-8") as f:
            f.write(THEIRS)
        for size in sizes:
            t0 = time.perf_counter()
            populate(endpoint, size)
            print(f"# {size} instances launched in {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
            result = {}
            for name, cfg in (("ours", ours_cfg), ("aws_ec2", theirs_cfg)):
                best, listing, calls = None, None, None
                for _attempt in range(args.repeat):
                    counter.take()
                    elapsed, listing = run_inventory(cfg, endpoint)
                    taken = counter.take()
                    if best is None or elapsed < best:
                        best, calls = elapsed, taken
                result[name] = (best, listing, calls)
            ours_groups, theirs_groups = dt_groups(result["ours"][1]), dt_groups(result["aws_ec2"][1])
            hosts = len(result["ours"][1]["_meta"]["hostvars"])
            same = ours_groups == theirs_groups
            if not same:
                for g in sorted(set(ours_groups) | set(theirs_groups)):
                    if ours_groups.get(g) != theirs_groups.get(g):
                        print(f"# group {g} differs: ours {len(ours_groups.get(g, []))} "
                              f"aws_ec2 {len(theirs_groups.get(g, []))}", file=sys.stderr)
            rows.append((size, hosts, result["ours"][0], result["aws_ec2"][0],
                         result["ours"][2], result["aws_ec2"][2], same))
            print(f"# {size}: ours {result['ours'][0]:.2f}s, aws_ec2 {result['aws_ec2'][0]:.2f}s",
                  file=sys.stderr, flush=True)
    server.shutdown()

    def fmt(calls):
        return f"{sum(calls.values())} (" + ", ".join(f"{k} {v}" for k, v in sorted(calls.items())) + ")"

    print("| instances | ec2_elastic wall (s) | aws_ec2 + keyed_groups wall (s) | speed-up |"
          " ec2_elastic client-side (s) | aws_ec2 client-side (s) | client-side speed-up |"
          " ec2_elastic API calls | aws_ec2 API calls | same groups |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|---|:-:|")
    for size, hosts, ours, theirs, (oc, os_), (tc, ts), same in rows:
        oc_side, tc_side = ours - os_, theirs - ts
        print(f"| {size} | {ours:.2f} | {theirs:.2f} | {theirs / ours:.2f}x | {oc_side:.2f} | {tc_side:.2f} |"
              f" {tc_side / oc_side:.2f}x | {fmt(oc)} | {fmt(tc)} | {'yes' if same else 'NO'} ({hosts} hosts) |")
    print("\nclient-side = wall time minus the time moto spent answering (moto's DescribeInstances is O(n^2)).")
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        for label, idx in (("ec2_elastic", 2), ("aws_ec2", 3)):
            side = [r[idx] - r[idx + 2][1] for r in (first, last)]
            print(f"{label}: client-side cost per instance ({first[0]} -> {last[0]}) "
                  f"{(side[1] - side[0]) / (last[0] - first[0]) * 1000:.2f} ms")


if __name__ == "__main__":
    main()
