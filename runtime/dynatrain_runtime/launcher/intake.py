"""The control requests the launcher takes from the shared volume, and its own state file there.

* ``control/drain/<ip>.json`` (a spot notice: the node leaves at the next step boundary);
* ``control/warm/<ip>.json`` (a node about to join: its process starts now, so the resize after the
  ``host_worker`` edit finds it warm);
* ``control/launcher_state.json`` (the generation counter, which a restarted launcher goes on from).

Every node can write the volume: each request is untrusted input -- typed, capped, never fatal.
"""

from __future__ import annotations

import os

from ..contract.shared_volume import (WARM_TTL, clean_text, clear_drain_request, clear_warm_request, is_number,
                                      read_drain_requests, read_json, read_warm_requests, warm_dir, write_json)
from .generation import clean_int

MAX_WARM_REQUESTS = 8       # hosts warmed ahead of their join at once: each is a process (an ssh) and a thread


def saved_generation(path):
    """The generation counter in ``control/launcher_state.json``, 0 when it holds none: the volume is
    writable by every node, so any other content (a list, a string, bytes, a negative) is ignored."""
    state = read_json(path)
    value = clean_int(state.get("generation")) if isinstance(state, dict) else None
    return value if value is not None and value >= 0 else 0


def drain_fields(req):
    """The fields of a drain request (a node's own file) that go into the records: typed, printable, short."""
    return {"reason": clean_text(req.get("reason")), "notice": clean_text(req.get("notice")),
            "requested_at": req.get("time") if is_number(req.get("time")) else None}


class ControlIntake:
    """The drain and warm requests of ``launcher``'s job, and its generation counter."""

    def __init__(self, launcher):
        self.launcher = launcher
        self.files = launcher.files
        self.gen_counter = 0
        self.draining = {}                      # ip -> its drain request (spot notice), until it has left
        self.warm_seen = {}                     # ip -> (its warm request, monotonic time first seen)
        self.warm_capped = None                 # how many warm requests were over the cap when last said

    def open(self):
        """At the launcher's start: the request folders exist, the generation counter goes on from the file."""
        os.makedirs(self.files.control, exist_ok=True)
        os.makedirs(warm_dir(self.files), exist_ok=True)     # add_workers writes its warm requests there
        self.gen_counter = saved_generation(self.files.launcher_state)

    def next_generation_id(self):
        self.gen_counter += 1
        write_json(self.files.launcher_state, {"generation": self.gen_counter})
        return self.gen_counter

    # ------------------------------------------------------------------ drains
    def take_drains(self, g):
        """Drop the nodes that asked to be drained from host_worker: they leave at the next step."""
        L = self.launcher
        requests = read_drain_requests(self.files)
        new = [ip for ip in requests if ip in g.membership and ip not in self.draining]
        for ip in new:
            req = drain_fields(requests[ip])
            if ip == L.master:
                L.out(f"drain requested for the master {ip} ({req['reason']!r}): the master cannot leave; "
                      "the job checkpoints every --checkpoint-every steps")
                L.event("drain_refused", ip=ip, reason=req["reason"], notice=req["notice"])
                clear_drain_request(self.files, ip)
                continue
            self.draining[ip] = req
            L.out(f"drain requested for {ip} ({req['reason']!r}): it leaves at the next step boundary")
            L.event("drain_requested", ip=ip, **req)
        leaving = [ip for ip in new if ip in self.draining]
        if leaving:
            L.members.drop(leaving)
        for ip in requests:                 # requests of nodes that are gone already
            if ip not in g.membership and ip not in self.draining:
                clear_drain_request(self.files, ip)

    def confirm(self, membership):
        """Log the membership now in effect; drained nodes that left are logged with their reason."""
        reasons = {ip: req.get("reason") for ip, req in self.draining.items()}
        for ip in self.launcher.members.confirm(membership, reasons):
            if ip in self.draining:
                del self.draining[ip]
                clear_drain_request(self.files, ip)

    # ------------------------------------------------------------------ warm requests
    def _warm_request_age(self, ip, req, now):
        """Seconds since this launcher first saw the request (``now``: monotonic).  Its ``time`` is the
        controller's clock, not ours: it only tells a rewritten request from the one seen before."""
        key = (req.get("time"), req.get("ttl"))
        seen = self.warm_seen.get(ip)
        if seen is None or seen[0] != key:
            seen = self.warm_seen[ip] = (key, now)
        return now - seen[1]

    def take_warm_requests(self, g, now):
        """Hosts about to join (``control/warm/<ip>.json``, written by add_workers before its host_worker
        edit): their worker process starts now, so the resize after the edit finds it warm.  A request
        is deleted once its host is a member, or ``ttl`` s after the launcher first saw it when it never
        joined (after a launcher restart: a full ``ttl`` again, the safe side)."""
        L = self.launcher
        expected = []
        requests = read_warm_requests(self.files)
        for ip, req in requests.items():
            try:
                expired = self._warm_request_age(ip, req, now) > float(req.get("ttl", WARM_TTL))
            except (TypeError, ValueError):
                expired = True
            if ip in g.membership or expired:
                clear_warm_request(self.files, ip)
                self.warm_seen.pop(ip, None)
                if expired and ip not in g.membership:
                    L.event("warm_request_expired", ip=ip)
            else:
                expected.append(ip)
        for ip in [ip for ip in self.warm_seen if ip not in requests]:      # deleted by someone else
            del self.warm_seen[ip]
        expected = self._cap_warm(sorted(expected))
        started = L.spares.expect(expected)
        if started:
            L.out(f"warm request for {started}: starting their processes before they join")
            L.event("warm_request", hosts=started)

    def _cap_warm(self, expected):
        """At most MAX_WARM_REQUESTS hosts warmed ahead of their join (any node can write a request);
        the rest wait for their host_worker edit, as without a request.  Said once per excess."""
        if len(expected) <= MAX_WARM_REQUESTS:
            self.warm_capped = None
            return expected
        if self.warm_capped != len(expected):
            self.warm_capped = len(expected)
            self.launcher.out(f"WARNING {len(expected)} warm requests: warming only the first {MAX_WARM_REQUESTS}")
            self.launcher.event("warm_requests_capped", requested=len(expected),
                                warmed=expected[:MAX_WARM_REQUESTS])
        return expected[:MAX_WARM_REQUESTS]
