"""The launcher's metrics in Prometheus' text format, served on the master (``--metrics-port``).

Gauges come from the launcher's status snapshot when a scrape arrives (world size, step, epoch,
samples/s, generation, state, the age of the last checkpoint, each host's state); counters from
the events the launcher writes (``Records.event`` calls ``observe``): resizes by reason, worker
failures, spot drains, recomputed steps, and the last recovery's seconds.  The checkpoint sync is
another process: its gauges come from its state file (``control/s3sync.json``) read at the scrape,
as hostile as anything on the volume (a value of the wrong type is left out, never an error).  The server listens
on the master's private address only; the cluster's security group admits the port from its
own members (a Prometheus inside it), never from outside.  A port that cannot be bound is said
in the launcher's log and the job goes on without metrics.
"""

from __future__ import annotations

import math
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..contract.shared_volume import is_number, read_json

PREFIX = "dynatrain_"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STATES = ("starting", "running", "resizing", "stopping", "finished", "failed")
HANDLER_TIMEOUT_S = 10.0    # a connection that sends no request within this is closed
MAX_CONNECTIONS = 16        # connections served at once (a thread each); more are closed at once


class CappedServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` with at most ``max_connections`` handler threads: one per idle connection
    with no cap let any peer in the security group hold a thread each (300 connections, 302 threads)."""

    daemon_threads = True
    request_queue_size = 64     # the listen backlog: a burst of connections queues, the cap then decides

    def __init__(self, address, handler, max_connections=MAX_CONNECTIONS):
        self.slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)      # over the cap: closed, no thread
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class Metrics:
    """Counters fed by the launcher's events; ``render(snapshot)`` is one scrape's text."""

    def __init__(self, sync_state=None):
        self.sync_state = sync_state      # control/s3sync.json of the job (None: the sync is not looked at)
        self._lock = threading.Lock()
        self.resizes = {}                 # reason -> count
        self.failures = 0
        self.drains = 0
        self.recomputed = 0
        self.recovery_seconds = None      # the last failure's resize: detection -> first new step
        self.peer_bytes = 0               # in place: state bytes moved peer to peer by every change
        self.last_change = None           # in place: the last change's {pause_s, transfer_s, transfer_mb_s}
        self._checkpoint = (None, None)   # (path, monotonic time first seen)

    def observe(self, event, fields):
        with self._lock:
            if event == "resize_end":
                reason = str(fields.get("reason") or "change")
                self.resizes[reason] = self.resizes.get(reason, 0) + 1
                self.recomputed += int(fields.get("recomputed_steps") or 0)
                if reason == "failure" and fields.get("total_s") is not None:
                    self.recovery_seconds = float(fields["total_s"])
                if fields.get("mode") == "in-place":
                    self.peer_bytes += int(fields.get("bytes_moved") or 0)
                    self.last_change = {k: float(fields.get(k) or 0.0)
                                        for k in ("pause_s", "transfer_s", "transfer_mb_s")}
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
            peer_bytes, last_change = self.peer_bytes, dict(self.last_change or {})
        metric("resizes_total", "counter", "Membership changes that took effect, by reason.",
               [({"reason": r}, n) for r, n in sorted(resizes.items())] or [({"reason": "change"}, 0)])
        metric("worker_failures_total", "counter", "Workers the launcher saw fail.", [({}, failures)])
        metric("spot_drains_total", "counter", "Spot interruption notices the launcher acted on.", [({}, drains)])
        metric("recomputed_steps_total", "counter", "Completed steps done again after a resize.", [({}, recomputed)])
        if recovery is not None:
            metric("recovery_seconds", "gauge", "The last failure's detection -> first step of the new group.",
                   [({}, recovery)])
        if last_change:
            metric("peer_transfer_bytes_total", "counter", "State bytes moved peer to peer by in-place changes.",
                   [({}, peer_bytes)])
            metric("resize_pause_seconds", "gauge", "The last in-place change's pause of the survivors.",
                   [({}, last_change["pause_s"])])
            metric("resize_transfer_seconds", "gauge", "The last in-place change's peer transfer, s.",
                   [({}, last_change["transfer_s"])])
            metric("resize_transfer_mb_per_second", "gauge", "The last in-place change's transfer rate.",
                   [({}, last_change["transfer_mb_s"])])
        self._render_sync(metric)
        if hosts:
            metric("host_state", "gauge", "Each host of the job by its state (1).",
                   [({"host": ip, "state": st}, 1) for ip, st in sorted(hosts.items())])
        return "\n".join(out) + "\n"

    def _render_sync(self, metric):
        """The checkpoint sync's health from its state file; nothing when there is none (no sync configured)."""
        state = read_json(self.sync_state) if self.sync_state else None
        if not isinstance(state, dict) or not isinstance(state.get("url"), str):
            return
        error = state.get("error")
        metric("checkpoint_sync_ok", "gauge", "1 when the checkpoint sync's last pass succeeded, 0 when it failed.",
               [({}, 0 if error is not None else 1)])
        failed = state.get("failed_passes")
        if isinstance(failed, int) and not isinstance(failed, bool) and failed >= 0:
            metric("checkpoint_sync_failed_passes_total", "counter", "Checkpoint sync passes that failed.",
                   [({}, failed)])
        last_ok = state.get("last_ok_time")
        if is_number(last_ok) and math.isfinite(last_ok):       # json takes Infinity: not a Prometheus number
            metric("checkpoint_sync_last_success_age_seconds", "gauge",
                   "Seconds since the checkpoint sync's last pass that succeeded.",
                   [({}, round(max(0.0, time.time() - last_ok), 3))])
        step = state.get("last_step")
        if isinstance(step, int) and not isinstance(step, bool):
            metric("checkpoint_sync_latest_step", "gauge", "The step of the checkpoint S3's LATEST.json names.",
                   [({}, step)])


def _escape(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def serve(address, port, scrape, say, timeout=HANDLER_TIMEOUT_S, max_connections=MAX_CONNECTIONS):
    """Serve ``scrape()`` at ``http://address:port/metrics`` on a daemon thread; the server, or None
    when the port cannot be bound (said with ``say``: the job goes on without metrics).  A connection
    is closed after ``timeout`` s without a request; at most ``max_connections`` are served at once."""

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

    Handler.timeout = timeout       # StreamRequestHandler: the socket's timeout, per connection
    try:
        server = CappedServer((address, int(port)), Handler, max_connections=max_connections)
    except OSError as exc:
        say(f"metrics: cannot listen on {address}:{port} ({exc}); the job goes on without them")
        return None
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    say(f"metrics: http://{address}:{server.server_address[1]}/metrics")
    return server
