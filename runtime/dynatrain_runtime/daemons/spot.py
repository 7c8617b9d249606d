"""``dt-spot-watch``: turn a spot interruption notice into a drain at the next step boundary.

Runs on every worker.  Polls the instance metadata service (IMDSv2: a session token,
then GETs) every ``--interval`` seconds for ``spot/instance-action`` (the two-minute
notice) and ``events/recommendations/rebalance`` (an earlier warning); on a notice it
writes ``control/drain/<ip>.json`` on the shared volume.  The launcher then removes the
node at the next step boundary: the checkpoint is taken at that boundary, so no step is
recomputed, and ``host_worker_log`` gets ``REMOVED`` (``events.jsonl``: reason ``spot``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request

from ..contract.shared_volume import JobFiles, read_drain_requests, write_drain_request

DEFAULT_ENDPOINT = "http://169.254.169.254/"
TOKEN_TTL = 21600
NOTICES = (("spot/instance-action", "spot"), ("events/recommendations/rebalance", "rebalance"))


class Imds:
    """A minimal IMDSv2 client (token on PUT, then GETs with it; a 401 renews the token)."""

    def __init__(self, endpoint=None, timeout=2.0):
        endpoint = endpoint or os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or DEFAULT_ENDPOINT
        self.base = endpoint.rstrip("/") + "/latest/"
        self.timeout = timeout
        self._token = None

    def _renew(self):
        req = urllib.request.Request(self.base + "api/token", method="PUT",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL)})
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            self._token = resp.read().decode()

    def get(self, path):
        """The text at ``meta-data/<path>``, or None when it does not exist (404)."""
        for attempt in (1, 2):
            if self._token is None:
                self._renew()
            req = urllib.request.Request(self.base + "meta-data/" + path,
                                         headers={"X-aws-ec2-metadata-token": self._token})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return resp.read().decode()
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401 and attempt == 1:
                    self._token = None
                    continue
                raise
        return None


def notice(imds, rebalance=True):
    """``(reason, detail)`` of the first notice IMDS shows, or None."""
    for path, reason in NOTICES:
        if reason == "rebalance" and not rebalance:
            continue
        body = imds.get(path)
        if body:
            try:
                detail = json.loads(body)
            except ValueError:
                detail = {"raw": body}
            return reason, detail
    return None


def watch_once(imds, files, ip, rebalance=True):
    """One poll: write the drain request on a notice (once).  Returns the notice or None."""
    found = notice(imds, rebalance)
    if found is None:
        return None
    reason, detail = found
    pending = read_drain_requests(files).get(ip)
    if pending is None or (pending.get("reason") == "rebalance" and reason == "spot"):
        write_drain_request(files, ip, reason, notice=detail, source="dt-spot-watch")
        print(f"dt-spot-watch: {reason} notice for {ip} ({json.dumps(detail, sort_keys=True)}): "
              f"asked the launcher to drain this node", flush=True)
    return found


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="dt-spot-watch", description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--efs-mount", default=os.environ.get("EFS_MOUNT", "/myEFSvolume"))
    ap.add_argument("--imds-endpoint", default=None,
                    help="[$AWS_EC2_METADATA_SERVICE_ENDPOINT or http://169.254.169.254/]")
    ap.add_argument("--ip", default=None, help="this node's private IP [IMDS local-ipv4]")
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between polls [%(default)s]")
    ap.add_argument("--no-rebalance", dest="rebalance", action="store_false",
                    help="ignore rebalance recommendations, drain only on the interruption notice")
    ap.add_argument("--once", action="store_true", help="poll once and exit (0: no notice, 10: notice)")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    imds = Imds(args.imds_endpoint)
    files = JobFiles(args.efs_mount)
    ip = args.ip
    while ip is None:
        try:
            ip = imds.get("local-ipv4")
        except (OSError, urllib.error.URLError) as exc:
            print(f"dt-spot-watch: instance metadata not reachable yet: {exc}", file=sys.stderr, flush=True)
            time.sleep(args.interval)
    print(f"dt-spot-watch: watching {imds.base} for {ip} every {args.interval:g} s", flush=True)
    while True:
        try:
            found = watch_once(imds, files, ip, args.rebalance)
        except (OSError, urllib.error.URLError) as exc:
            print(f"dt-spot-watch: poll failed: {exc}", file=sys.stderr, flush=True)
            found = None
        if args.once:
            return 10 if found else 0
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
