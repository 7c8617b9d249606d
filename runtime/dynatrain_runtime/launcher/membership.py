"""The desired membership (``host_worker``) and its audit log (``host_worker_log``), launcher side.

Nothing here stops training: the log is read like a write-ahead log (a torn last line is cut
by the next append, malformed lines are skipped, both reported once), and an append or a
``host_worker`` edit that fails (a lock held too long, a volume error) is reported and
retried by the launcher's loop (``retry``) until it goes through.
"""

from __future__ import annotations

from ..contract import shared_volume

LOCK_TIMEOUT = 5.0      # s: the loop must keep watching its workers; a failed try is retried


class Membership:
    """Reads ``host_worker`` (keeping the last good list on errors) and keeps the log in step."""

    def __init__(self, files, records, master=None):
        self.files = files
        self.records = records
        self.master = master
        self.text = None          # last text read
        self.error = None         # why the file is not usable now, or None
        self.last_good = []
        self.queued = []          # (event, ip, fields) not appended yet, in order (FAILED lines)
        self.unconfirmed = None   # the membership to log once the log can be written again
        self.pending_drop = set()  # lost workers still to remove from host_worker
        self.log_error = None     # why the log cannot be written now, or None
        self._reported = set()    # malformed lines already reported (they stay in the file)

    def _validate(self, text):
        path = self.files.host_worker
        hosts = shared_volume.parse_hosts(text, source=path)
        if not hosts:
            raise shared_volume.HostWorkerError(f"{path} lists no workers")
        if self.master is not None and self.master not in hosts:
            raise shared_volume.HostWorkerError(f"{path} no longer lists the master {self.master}; "
                                                "the master cannot be removed")
        if self.master is not None and hosts[-1] != self.master:
            raise shared_volume.HostWorkerError(f"{path} must list the master {self.master} last")
        return hosts

    def read(self):
        """Return the membership in host_worker, or None (keeping the last good one) on error."""
        try:
            text = shared_volume.read_text(self.files.host_worker)   # any bytes; no link followed
        except OSError as exc:
            text, err = None, f"cannot read {self.files.host_worker}: {exc}"
        else:
            err = None
        if text is not None and text == self.text and self.error is None:
            return self.last_good
        hosts = None
        if text is not None:
            try:
                hosts = self._validate(text)
            except shared_volume.HostWorkerError as exc:
                err = str(exc)
        if err is not None:
            self._report_error(err)
            self.text = text
            return None
        if self.error is not None:
            self.records.out("host_worker is valid again")
            self.records.event("host_worker_ok", hosts=hosts)
        hosts = [h for h in hosts if h not in self.pending_drop]     # lost: gone, even if not written yet
        self.text, self.error, self.last_good = text, None, hosts
        return hosts

    def _report_error(self, err):
        if err == self.error:
            return
        self.error = err
        self.records.out(f"ERROR host_worker: {err} -- keeping the last good membership {self.last_good}")
        self.records.event("host_worker_error", error=err, keeping=self.last_good)

    def master_from_file(self):
        """The last address of host_worker (the master), or None."""
        try:
            hosts = shared_volume.read_hosts(self.files.host_worker)
        except shared_volume.HostWorkerError:
            hosts = []
        return hosts[-1] if hosts else None

    def logged_members(self):
        """Hosts whose last host_worker_log event is ADDED (malformed and torn lines are skipped)."""
        entries, bad, _torn = shared_volume.scan_log(self.files.log)
        self._warn_log("malformed", bad)
        last = {}
        for _seq, ev, ip, _ns in entries:
            last[ip] = ev
        return [ip for ip, ev in last.items() if ev == "ADDED"]

    def _warn_log(self, kind, lines):
        """Report a torn line cut off, and each malformed line once (out + a warning event)."""
        new = lines if kind == "torn" else [line for line in lines if line not in self._reported]
        if not new:
            return
        if kind != "torn":
            self._reported.update(new)
        if kind == "torn":
            what = "cut a torn last line (a writer stopped mid-append)"
        else:
            what = "skipped malformed line(s)"
        self.records.out(f"WARNING host_worker_log: {what}: {new}")
        self.records.event("host_worker_log_warning", kind=kind, lines=new, path=self.files.log)

    def _append(self, event, ip, **fields):
        line = shared_volume.append_log(self.files.log, event, ip, warn=self._warn_log, timeout=LOCK_TIMEOUT)
        self.records.out(f"host_worker_log: {line}")
        self.records.event("host_worker_log", line=line, log_event=event, ip=ip, seq=int(line.split()[0]),
                           **fields)
        return line

    def _log_failed(self, exc):
        err = f"cannot append to {self.files.log}: {exc}"
        if err != self.log_error:
            self.log_error = err
            self.records.out(f"ERROR {err} -- training goes on; retrying")
            self.records.event("host_worker_log_error", error=err, queued=len(self.queued))

    def _log_ok(self):
        if self.log_error is not None:
            self.log_error = None
            self.records.out("host_worker_log is writable again")
            self.records.event("host_worker_log_ok")

    def append_log(self, event, ip, **fields):
        """Append a line now, or queue it for ``flush`` when the log cannot be written; never raises."""
        self.queued.append((event, ip, fields))
        self.flush()

    def flush(self):
        """Append the queued lines in order; False while one of them cannot be written."""
        while self.queued:
            event, ip, fields = self.queued[0]
            try:
                self._append(event, ip, **fields)
            except (OSError, shared_volume.HostWorkerError) as exc:      # a lock timeout is a HostWorkerError
                self._log_failed(exc)
                return False
            self.queued.pop(0)
        self._log_ok()
        return True

    def confirm(self, membership, reasons=None):
        """Append REMOVED/ADDED so the log matches ``membership`` (called once it has taken effect).

        ``reasons`` maps a leaving IP to why it left (``spot``), recorded in events.jsonl.
        Returns the IPs logged REMOVED.  When the log cannot be written, ``unconfirmed`` keeps
        ``membership`` for ``retry`` (what to append is worked out from the log again then).
        """
        self.unconfirmed = list(membership)
        removed = []
        if not self.flush():                    # queued FAILED lines go first, in their order
            return removed
        try:
            logged = self.logged_members()
            for ip in [ip for ip in logged if ip not in membership]:
                reason = (reasons or {}).get(ip)
                self._append("REMOVED", ip, **({"reason": reason} if reason else {}))
                removed.append(ip)
            for ip in membership:
                if ip not in logged:
                    self._append("ADDED", ip)
        except (OSError, shared_volume.HostWorkerError) as exc:
            self._log_failed(exc)
            return removed
        self.unconfirmed = None
        self._log_ok()
        return removed

    def drop(self, ips):
        """Remove lost workers from host_worker (under its lock) and from the last good list.

        When host_worker cannot be edited now (its lock held, a malformed file, a volume error)
        they stay in ``pending_drop``: ``read`` leaves them out and ``retry`` edits the file.
        """
        self.pending_drop.update(ips)
        self.last_good = [h for h in self.last_good if h not in ips]
        self._drop_pending()

    def _drop_pending(self):
        path = self.files.host_worker
        try:
            with shared_volume.locked(path, timeout=LOCK_TIMEOUT):
                hosts = shared_volume.read_hosts(path)
                keep = [h for h in hosts if h not in self.pending_drop]
                if keep != hosts:
                    shared_volume.write_hosts(path, keep, master=self.master)
        except (OSError, shared_volume.HostWorkerError) as exc:
            self.records.out(f"ERROR cannot remove {sorted(self.pending_drop)} from {path}: {exc}; retrying")
            self.records.event("host_worker_drop_error", hosts=sorted(self.pending_drop), error=str(exc))
            return False
        self.pending_drop = set()
        self.text = None     # re-read
        return True

    def behind(self):
        """True while a log line or a host_worker edit is still to be written."""
        return bool(self.queued or self.unconfirmed is not None or self.pending_drop)

    def retry(self):
        """Write what failed before; the membership still to confirm, or None (the launcher confirms it)."""
        if self.pending_drop:
            self._drop_pending()
        if not self.flush():
            return None
        return self.unconfirmed
