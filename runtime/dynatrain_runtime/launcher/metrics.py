"""The launcher's metrics in Prometheus' text format, served on the master (``--metrics-port``).

Gauges come from the launcher's status snapshot when a scrape arrives (world size, step, epoch,
samples/s, generation, state, the age of the last checkpoint, each host's state); counters from
the events the launcher writes (``Records.event`` calls ``observe``): resizes by reason, worker
failures, spot drains, recomputed steps, and the last recovery's seconds.  The server listens
on the master's private address only; the cluster's security group admits the port from its
own members (a Prometheus inside it), never from outside.  A port that cannot be bound is said
in the launcher's log and the job goes on without metrics.
"""

from __future__ import annotations

import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PREFIX = "dynatrain_"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STATES = ("starting", "running", "resizing", "stopping", "finished", "failed")


class Metrics:
    """Counters fed by the launcher's events; ``render(snapshot)`` is one scrape's text."""

    def __init__(self):
        self._lock = threading.Lock()
        self.resizes = {}                 # reason -> count
        self.failures = 0
        self.drains = 0
        self.recomputed = 0
        self.recovery_seconds = None      # the last failure's resize: detection -> first new step
        self._checkpoint = (None, None)   # (path, monotonic time first seen)

    def observe(self, event, fields):
        with self._lock:
            if event == "resize_end":
                reason = str(fields.get("reason") or "change")
                self.resizes[reason] = self.resizes.get(reason, 0) + 1
                self.recomputed += int(fields.get("recomputed_steps") or 0)
                if reason == "failure" and fields.get("total_s") is not None:
                    self.recovery_seconds = float(fields["total_s"])
            elif event == "worker_failed":
                self.failures += 1
            elif event == "drain_requested":
                self.drains += 1

    def _checkpoint_age(self, path, now):
        """Seconds since the newest checkpoint was written (its directory's mtime), else since first seen."""
        if not path:
            return None
        try:
            return max(0.0, time.time() - os.stat(path).st_mtime)
        except OSError:
            with self._lock:
                if self._checkpoint[0] != path:
                    self._checkpoint = (path, now)
                return now - self._checkpoint[1]

    def render(self, snapshot, hosts=None):
        """The text of one scrape: ``snapshot`` is the launcher's status, ``hosts`` {ip: state}."""
        now = time.monotonic()
        out = []

        def metric(name, kind, help_text, samples):
            out.append(f"# HELP {PREFIX}{name} {help_text}")
            out.append(f"# TYPE {PREFIX}{name} {kind}")
            for labels, value in samples:
                label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
                out.append(f"{PREFIX}{name}{{{label_text}}} {_number(value)}" if label_text
                           else f"{PREFIX}{name} {_number(value)}")

        state = snapshot.get("state") or "starting"
        metric("up", "gauge", "1 while the launcher answers.", [({}, 1)])
        metric("state", "gauge", "The job's state (1 for the current one).",
               [({"state": s}, 1 if s == state else 0) for s in sorted(set(STATES) | {state})])
        metric("world_size", "gauge", "Workers in the current process group.", [({}, snapshot.get("world_size") or 0)])
        metric("generation", "gauge", "The current generation (a new one per membership change).",
               [({}, snapshot.get("generation") or 0)])
        metric("step", "gauge", "The newest committed step.", [({}, snapshot.get("step") or 0)])
        metric("epoch", "gauge", "The current epoch.", [({}, snapshot.get("epoch") or 0)])
        metric("samples_per_second", "gauge", "Training throughput over the recent steps.",
               [({}, snapshot.get("samples_per_s") or 0.0)])
        age = self._checkpoint_age(snapshot.get("last_checkpoint"), now)
        if age is not None:
            metric("last_checkpoint_age_seconds", "gauge", "Seconds since the newest checkpoint was written.",
                   [({}, round(age, 3))])
        with self._lock:
            resizes = dict(self.resizes)
            failures, drains, recomputed, recovery = self.failures, self.drains, self.recomputed, \
                self.recovery_seconds
        metric("resizes_total", "counter", "Membership changes that took effect, by reason.",
               [({"reason": r}, n) for r, n in sorted(resizes.items())] or [({"reason": "change"}, 0)])
        metric("worker_failures_total", "counter", "Workers the launcher saw fail.", [({}, failures)])
        metric("spot_drains_total", "counter", "Spot interruption notices the launcher acted on.", [({}, drains)])
        metric("recomputed_steps_total", "counter", "Completed steps done again after a resize.", [({}, recomputed)])
        if recovery is not None:
            metric("recovery_seconds", "gauge", "The last failure's detection -> first step of the new group.",
                   [({}, recovery)])
        if hosts:
            metric("host_state", "gauge", "Each host of the job by its state (1).",
                   [({"host": ip, "state": st}, 1) for ip, st in sorted(hosts.items())])
        return "\n".join(out) + "\n"


def _escape(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def serve(address, port, scrape, say):
    """Serve ``scrape()`` at ``http://address:port/metrics`` on a daemon thread; the server, or None
    when the port cannot be bound (said with ``say``: the job goes on without metrics)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404, "only /metrics is served")
                return
            try:
                body = scrape().encode("utf-8")
            except Exception as exc:  # noqa: BLE001 - a scrape must never take the launcher down  # pylint: disable=broad-except
                self.send_error(500, f"metrics: {exc}")
                return
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):     # scrapes are not the launcher's news
            pass

    try:
        server = ThreadingHTTPServer((address, int(port)), Handler)
    except OSError as exc:
        say(f"metrics: cannot listen on {address}:{port} ({exc}); the job goes on without them")
        return None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    say(f"metrics: http://{address}:{server.server_address[1]}/metrics")
    return server
