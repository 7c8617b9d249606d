"""The desired membership (``host_worker``) and its audit log (``host_worker_log``), launcher side."""

from __future__ import annotations

from .. import host_worker_file as hwf


class Membership:
    """Reads ``host_worker`` (keeping the last good list on errors) and keeps the log in step."""

    def __init__(self, files, records, master=None):
        self.files = files
        self.records = records
        self.master = master
        self.text = None          # last text read
        self.error = None         # why the file is not usable now, or None
        self.last_good = []

    def _validate(self, text):
        path = self.files.host_worker
        hosts = hwf.parse_hosts(text, source=path)
        if not hosts:
            raise hwf.HostWorkerError(f"{path} lists no workers")
        if self.master is not None and self.master not in hosts:
            raise hwf.HostWorkerError(f"{path} no longer lists the master {self.master}; "
                                      "the master cannot be removed")
        if self.master is not None and hosts[-1] != self.master:
            raise hwf.HostWorkerError(f"{path} must list the master {self.master} last")
        return hosts

    def read(self):
        """Return the membership in host_worker, or None (keeping the last good one) on error."""
        try:
            with open(self.files.host_worker) as handle:
                text = handle.read()
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
            except hwf.HostWorkerError as exc:
                err = str(exc)
        if err is not None:
            self._report_error(err)
            self.text = text
            return None
        if self.error is not None:
            self.records.out("host_worker is valid again")
            self.records.event("host_worker_ok", hosts=hosts)
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
            hosts = hwf.read_hosts(self.files.host_worker)
        except hwf.HostWorkerError:
            hosts = []
        return hosts[-1] if hosts else None

    def logged_members(self):
        """Hosts whose last host_worker_log event is ADDED."""
        last = {}
        for _seq, ev, ip, _ns in hwf.read_log(self.files.log):
            last[ip] = ev
        return [ip for ip, ev in last.items() if ev == "ADDED"]

    def append_log(self, event, ip, **fields):
        line = hwf.append_log(self.files.log, event, ip)
        self.records.out(f"host_worker_log: {line}")
        self.records.event("host_worker_log", line=line, log_event=event, ip=ip, seq=int(line.split()[0]),
                           **fields)
        return line

    def confirm(self, membership, reasons=None):
        """Append REMOVED/ADDED so the log matches ``membership`` (called once it has taken effect).

        ``reasons`` maps a leaving IP to why it left (``spot``), recorded in events.jsonl.
        Returns the IPs logged REMOVED.
        """
        logged = self.logged_members()
        removed = [ip for ip in logged if ip not in membership]
        for ip in removed:
            reason = (reasons or {}).get(ip)
            self.append_log("REMOVED", ip, **({"reason": reason} if reason else {}))
        for ip in membership:
            if ip not in logged:
                self.append_log("ADDED", ip)
        return removed

    def drop(self, ips):
        """Remove lost workers from host_worker (under its lock) and from the last good list."""
        path = self.files.host_worker
        with hwf.locked(path):
            hosts = hwf.read_hosts(path)
            keep = [h for h in hosts if h not in ips]
            if keep != hosts:
                hwf.write_hosts(path, keep, master=self.master)
        self.text = None     # re-read
        self.last_good = [h for h in self.last_good if h not in ips]
