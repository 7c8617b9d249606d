#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_worker
short_description: Edit the worker membership of a running elastic training job
version_added: "0.1.0"
description:
  - Adds addresses to or removes addresses from the C(host_worker) file on the
    shared volume, the desired worker membership of a running elastic MXNet
    training job. One IPv4 address per line, C(#) comments and blank lines are
    ignored (and kept), the master is the last address.
  - The file is edited under an exclusive C(fcntl) lock on the sidecar file
    C(host_worker.lock) and replaced atomically (temp file in the same
    directory + rename), keeping its mode. The elastic launcher on the master
    watches the file and applies the change at the next step or epoch boundary.
  - With O(wait=true) the module then waits until the launcher confirms the
    change in the append-only C(host_worker_log) (lines C(SEQ EVENT IP NS_TIMESTAMP)),
    an C(ADDED <ip>) line for every added host, a C(REMOVED <ip>) or
    C(FAILED <ip>) line for every removed host. Only lines appended after the
    edit count.
  - Fails and changes nothing when asked to remove the master or a protected
    host, on an invalid address, a malformed C(host_worker) file (the message
    names the line) or a missing directory.
author:
  - dynatrain maintainers (@dynatrain)
options:
  path:
    description:
      - Path of the C(host_worker) file, usually C(<EFS_MOUNT>/host_worker).
      - Its directory must exist (the shared volume must be mounted); the file
        itself is created when missing and O(state=present).
    type: path
    required: true
  log_path:
    description:
      - Path of the launcher's append-only C(host_worker_log).
      - Defaults to C(host_worker_log) in the directory of O(path).
    type: path
  hosts:
    description:
      - IPv4 addresses of the workers to add (O(state=present)) or remove
        (O(state=absent)). Duplicates are ignored.
    type: list
    elements: str
    default: []
  state:
    description:
      - V(present) makes sure every address in O(hosts) is in the file; new
        ones are inserted just before the master line so the master stays last.
      - V(absent) makes sure none of them is in the file.
    type: str
    choices: [present, absent]
    default: present
  master:
    description:
      - IPv4 address of the master. It is always kept last and can never be
        removed.
      - When the file already holds addresses its last line is the master; if
        O(master) is given and differs the module fails, unless O(replace_master=true).
      - When the file is new or empty and O(state=present), the addresses of
        O(hosts) are written followed by O(master) (so O(hosts=[]) with
        O(master) writes the master alone). Without O(master) the last address
        of O(hosts) becomes the master.
    type: str
  replace_master:
    description:
      - With O(state=present) and a file whose master (last address) is not O(master),
        replace that master by O(master) instead of failing. The old master's line is
        removed (reported in RV(removed)), O(master) is written last (reported in RV(added));
        the workers stay. For re-provisioning after the master was lost
        (C(bootstrap.yml) passes it when it replaced a lost master); the launcher on the
        new master logs the change when it starts.
    type: bool
    default: false
  protected:
    description:
      - Addresses that may never be removed (for example the base workers the
        job cannot do without). Asking to remove one fails. The master is
        always protected.
    type: list
    elements: str
    default: []
  wait:
    description:
      - Wait until the launcher confirms every change in O(log_path).
      - Returns at once when nothing had to change, and never waits in check
        mode.
    type: bool
    default: false
  timeout:
    description:
      - Seconds to wait for the confirmation when O(wait=true) or O(confirm) is
        given, counted from the edit.
      - On timeout the module fails, names the hosts that were not confirmed
        and shows the tail of O(launcher_log). The edit itself stays in place.
    type: float
    default: 300
  confirm:
    description:
      - The RV(confirm) of an earlier call that edited the file. The module
        then edits nothing (O(hosts), O(state), O(master), O(replace_master) and
        O(protected) are ignored) and waits for the launcher's confirmation of
        that edit, as O(wait=true) does, until O(timeout) seconds after the edit.
      - With O(poll), this lets a task report its progress while it waits,
        one retry at a time (see the examples).
    type: dict
  poll:
    description:
      - When waiting, return after at most this many seconds even while some
        change is not yet confirmed, with RV(settled=false), RV(confirmed),
        RV(pending), RV(seconds_left) and a RV(msg) saying so; the task then
        retries with O(confirm) until RV(settled) (C(until)/C(retries)).
      - Fails as without O(poll) once O(timeout) has passed or the launcher
        reported a failure.
      - V(0) waits until every change is confirmed or O(timeout) passed.
    type: float
    default: 0
  launcher_log:
    description:
      - The launcher's log, whose last lines are shown when waiting times out.
      - Defaults to C(logs/launcher.log) in the directory of O(path).
    type: path
  lock_timeout:
    description:
      - Seconds to wait for the exclusive lock on C(host_worker.lock).
    type: float
    default: 30
  warm:
    description:
      - With O(state=present), first ask the launcher to warm every host the edit adds (the master
        excepted) with a request C(control/warm/<ip>.json) beside O(path). The launcher then
        starts the host's worker process at once (the engine imported, the data loaded), so the
        resize that the edit causes finds it ready. The launcher deletes a request once its host
        is a member, or 900 s after it first saw it when the host never joined.
      - Nothing is written in check mode, or when the edit adds nothing.
    type: bool
    default: false
  edit:
    description:
      - V(false) leaves C(host_worker) as it is. Only O(require) is checked and, with O(warm=true) and
        O(state=present), the warm requests of the hosts of O(hosts) not yet in the file are written.
        A step before the edit (C(playbooks/configure_nodes.yml) for a worker from the warm pool), so
        that the launcher starts their processes while the play goes on and the edit that follows
        finds them warmer. Nothing is waited for.
    type: bool
    default: true
  require:
    description:
      - With O(state=present), a file name beside O(path) that each host of O(hosts) must have, C({ip})
        standing for its address (C(prepare_data_success_{ip}) says that its data is ready). When one is
        missing the module fails, names it, and changes nothing.
    type: str
    default: ""
  require_data:
    description:
      - O(require) set to each host's prepare-data success marker (its name is the shared volume contract's,
        C(plugins/module_utils/shared_volume.py)); ignored when O(require) is given.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details:
      - The diff shows the whole C(host_worker) file before and after the edit.
  platform:
    support: N/A
    platforms: posix
  action_group:
    description: Use C(group/dynatrain.elastic.elastic) in C(module_defaults) to set defaults for this module.
    support: full
    membership:
      - dynatrain.elastic.elastic
notes:
  - Run it on a host that mounts the shared volume (the master, or any node),
    with the privileges needed to write the file.
  - The launcher logs C(ADDED) only once the new worker takes part in the
    running job, which can take as long as its data preparation plus one step
    (or one epoch with C(--resize-at epoch)); choose O(timeout) accordingly.
  - The file formats are described in C(docs/INTERNALS.md) of the collection.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Write the initial membership (workers, then the master last)
  dynatrain.elastic.host_worker:
    path: /myEFSvolume/host_worker
    hosts: "{{ groups['dt_base'] | map('extract', hostvars, 'dt_private_ip') | list }}"
    master: "{{ hostvars[groups['dt_master'][0]]['dt_private_ip'] }}"

- name: Add two elastic workers and wait until the running job uses them
  dynatrain.elastic.host_worker:
    path: /myEFSvolume/host_worker
    hosts:
      - 172.31.65.62
      - 172.31.70.11
    state: present
    wait: true
    timeout: 600
  register: grown

- name: Add a worker, then wait for its ADDED and say what is pending on each retry
  dynatrain.elastic.host_worker:
    path: /myEFSvolume/host_worker
    hosts: [172.31.70.12]
  register: edit

- name: Wait for the launcher's confirmation, 10 s per try, 600 s in all
  dynatrain.elastic.host_worker:
    path: /myEFSvolume/host_worker
    confirm: "{{ edit.confirm }}"
    poll: 10
    timeout: 600
  register: grown
  until: grown is failed or grown.settled
  retries: 62
  delay: 0

- name: Show the confirming log lines
  ansible.builtin.debug:
    var: grown.events

- name: Remove a worker, never the base workers
  dynatrain.elastic.host_worker:
    path: /myEFSvolume/host_worker
    hosts: [172.31.65.62]
    state: absent
    protected: "{{ groups['dt_base'] | map('extract', hostvars, 'dt_private_ip') | list }}"
    wait: true

- name: Preview a removal (check mode, with diff)
  dynatrain.elastic.host_worker:
    path: /myEFSvolume/host_worker
    hosts: [172.31.70.11]
    state: absent
  check_mode: true
  diff: true
"""

RETURN = r"""
hosts:
  description: Addresses in the file after the edit (predicted in check mode), the master last.
  returned: always
  type: list
  elements: str
  sample: ["172.31.65.62", "172.31.70.11", "172.31.64.10"]
master:
  description: The master address (last line of the file after the edit), or null when the file holds no address.
  returned: always
  type: str
  sample: 172.31.64.10
added:
  description: Addresses that were (or in check mode would be) added.
  returned: always
  type: list
  elements: str
  sample: ["172.31.70.11"]
removed:
  description: Addresses that were (or in check mode would be) removed.
  returned: always
  type: list
  elements: str
  sample: []
events:
  description:
    - The C(host_worker_log) lines, appended after the edit, that confirmed the change.
    - Empty unless O(wait=true) and something changed.
  returned: always
  type: list
  elements: str
  sample: ["7 ADDED 172.31.70.11 1542536656974259605"]
unconfirmed:
  description: Addresses whose change the launcher had not confirmed (only non-empty when waiting failed).
  returned: always
  type: list
  elements: str
  sample: []
waited_s:
  description: Seconds spent waiting for the confirmation, counted from the edit (also across O(confirm) calls).
  returned: always
  type: float
  sample: 12.5
confirm:
  description:
    - What a later call needs to wait for this edit's confirmation (pass it as O(confirm)); its
      C(pending) is empty when nothing changed or in check mode.
    - C(position) is the log's byte offset and last SEQ before the edit, C(started) the time of the edit
      (epoch seconds on the host that ran the module).
  returned: success
  type: dict
  sample: {"state": "present", "pending": ["172.31.70.11"], "position": [148, 3], "started": 1700000000.5}
settled:
  description: False only when O(poll) made the module return before every change was confirmed.
  returned: always
  type: bool
  sample: false
warmed:
  description: Hosts whose warm request was written (O(warm=true)).
  returned: always
  type: list
  elements: str
  sample: ["172.31.70.11"]
confirmed:
  description: Hosts whose change the launcher confirmed so far (when waiting).
  returned: always
  type: list
  elements: str
  sample: ["172.31.65.62"]
pending:
  description: Hosts whose change is still unconfirmed (non-empty only when RV(settled=false)).
  returned: always
  type: list
  elements: str
  sample: ["172.31.70.11"]
seconds_left:
  description: Seconds left until O(timeout) when waiting (null when not waiting).
  returned: always
  type: float
  sample: 42.0
msg:
  description: What the module waited for and how far it got.
  returned: when it waited (O(wait=true) and something changed, or O(confirm))
  type: str
  sample: "waiting for the launcher to confirm ADDED: confirmed [172.31.65.62], pending [172.31.70.11], 42 s left"
launcher_log_tail:
  description: Last lines of O(launcher_log), when waiting timed out or the launcher reported a failure.
  returned: failure
  type: list
  elements: str
  sample: ["2024-05-01 12:00:01 resize: waiting for step boundary"]
"""

import os
import time
from dataclasses import dataclass

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dynatrain.elastic.plugins.module_utils.shared_volume import (
    HostWorkerError,
    LAUNCHER_LOG,
    PREPARE_DATA_MARKER,
    JobFiles,
    atomic_write,
    default_log_path,
    edit_hosts_text,
    locked,
    log_position,
    parse_hosts,
    read_log_since,
    validate_ip,
    write_warm_request,
)

POLL_INTERVAL = 0.2  # s between reads of host_worker_log while waiting for the launcher (a small file)
TAIL_LINES = 20
STALE_LAUNCHER_S = 60
DEFAULT_TIMEOUT = 300
DEFAULT_LOCK_TIMEOUT = 30


class HostWorkerFailure(Exception):
    """A failure carrying the partial result to return with fail_json."""

    def __init__(self, msg, **result):
        super().__init__(msg)
        self.msg = msg
        self.result = result


def _unique(items):
    return list(dict.fromkeys(items))


def _read_text(path):
    """The content of ``path``, or None when it does not exist."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _number(params, name, default):
    value = params.get(name)
    return float(value if value is not None else default)


def tail_file(path, lines=TAIL_LINES, max_bytes=65536):
    """Return the last ``lines`` lines of a file, or None if it does not exist."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - max_bytes))
            data = handle.read()
    except FileNotFoundError:
        return None
    text = data.decode("utf-8", "replace").splitlines()
    if size > max_bytes and text:
        text = text[1:]
    return text[-lines:] if lines else []


# --- validation -------------------------------------------------------------------------


@dataclass(frozen=True)
class Pending:
    """An edit whose confirmation is awaited: what the RV(confirm) return value carries between calls."""

    state: str
    hosts: list
    position: tuple
    started: float

    def as_dict(self):
        return dict(state=self.state, pending=list(self.hosts), position=list(self.position), started=self.started)

    @classmethod
    def from_option(cls, value):
        """The Pending of the confirm option (None when not given); raises HostWorkerError."""
        if value is None:
            return None
        try:
            offset, seq = (int(x) for x in value["position"])
            pending = cls(state=value["state"], hosts=_unique(validate_ip(h) for h in value.get("pending") or []),
                          position=(offset, seq), started=float(value["started"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise HostWorkerError(
                f"confirm must be the confirm value returned by an earlier host_worker call ({exc})") from None
        if pending.state not in ("present", "absent"):
            raise HostWorkerError(f"confirm.state must be present or absent, not {pending.state!r}")
        return pending


@dataclass(frozen=True)
class Request:
    """The module's options, with every address validated and every default filled in."""

    path: str
    log_path: str
    launcher_log: str
    state: str
    hosts: list
    protected: frozenset
    master: str | None
    replace_master: bool
    wait: bool
    timeout: float
    lock_timeout: float
    confirm: Pending | None = None
    poll: float = 0.0
    warm: bool = False
    edit: bool = True
    require: str = ""

    @classmethod
    def from_params(cls, params):
        """Build the request; raises HostWorkerError on an invalid address."""
        path = os.path.abspath(params["path"])
        directory = os.path.dirname(path)
        return cls(
            path=path,
            log_path=params.get("log_path") or default_log_path(path),
            launcher_log=params.get("launcher_log") or os.path.join(directory, LAUNCHER_LOG),
            state=params.get("state") or "present",
            hosts=_unique(validate_ip(h) for h in (params.get("hosts") or [])),
            protected=frozenset(validate_ip(h) for h in (params.get("protected") or [])),
            master=validate_ip(params["master"]) if params.get("master") else None,
            replace_master=bool(params.get("replace_master")),
            wait=bool(params.get("wait")),
            timeout=_number(params, "timeout", DEFAULT_TIMEOUT),
            lock_timeout=_number(params, "lock_timeout", DEFAULT_LOCK_TIMEOUT),
            confirm=Pending.from_option(params.get("confirm")),
            poll=_number(params, "poll", 0.0),
            warm=bool(params.get("warm")),
            edit=params.get("edit") is not False,
            require=_require_pattern(params.get("require") or (PREPARE_DATA_MARKER if params.get("require_data") else "")),
        )

    @property
    def directory(self):
        return os.path.dirname(self.path)


def _require_pattern(pattern):
    """``require`` as given, once it names one file beside path per host ({ip} in a plain file name)."""
    if pattern and ("{ip}" not in pattern or "/" in pattern):
        raise HostWorkerError(f"require={pattern!r} is not a file name with {{ip}} in it (e.g. prepare_data_success_{{ip}})")
    return pattern


def check_required(request):
    """Raise HostWorkerError naming each host of an addition whose ``require`` file is missing."""
    if not request.require or request.state != "present":
        return
    names = [request.require.replace("{ip}", h) for h in request.hosts]
    missing = [name for name in names if not os.path.exists(os.path.join(request.directory, name))]
    if missing:
        raise HostWorkerError(f"{', '.join(missing)} missing in {request.directory}: the host's data is not "
                              "ready (prepare_data writes it on success); nothing was changed")


def check_target(request):
    """Raise HostWorkerError unless the directory of path exists and path is no directory."""
    if not os.path.isdir(request.directory):
        raise HostWorkerError(
            f"directory {request.directory} of path does not exist: mount the shared volume (EFS_MOUNT) "
            "or create it first; nothing was changed")
    if os.path.isdir(request.path):
        raise HostWorkerError(f"path {request.path} is a directory, not the host_worker file")


def validate(params, result):
    """The validated Request, or HostWorkerFailure (with ``result``) before anything is touched."""
    try:
        request = Request.from_params(params)
    except HostWorkerError as exc:
        raise HostWorkerFailure(f"{exc}; nothing was changed", **result) from None
    try:
        check_target(request)
    except HostWorkerError as exc:
        raise HostWorkerFailure(str(exc), **result) from None
    return request


# --- edit computation -------------------------------------------------------------------


def _check_master(current, master, source):
    """The master of the file (its last address), or ``master`` for a file without addresses."""
    file_master = current[-1] if current else None
    if master is not None and file_master is not None and master != file_master:
        raise HostWorkerError(
            f"{source} ends with {file_master}, which is the master of the running job, but master={master} "
            "was given; the master cannot be changed by editing host_worker")
    return file_master if file_master is not None else master


def _plan_removal(current, hosts, master, protected, source):
    """The hosts to remove; refuses the master and protected hosts."""
    refused = [f"{h} (the master)" if h == master else f"{h} (protected)"
               for h in hosts if h == master or h in protected]
    if refused:
        raise HostWorkerError(
            f"refusing to remove {', '.join(refused)} from {source}: the master and protected hosts may never "
            "be removed; nothing was changed")
    return [h for h in hosts if h in current]


def _plan_addition(current, hosts, master):
    """The hosts to add; into a file without addresses the master goes last."""
    wanted = list(hosts)
    if not current and master is not None and master not in wanted:
        wanted.append(master)
    added = [h for h in wanted if h not in current]
    if not current and master is not None:
        # the master is written last, whatever the order of hosts
        added = [h for h in added if h != master] + [master]
    return added


def _replace_master(text, current, master, source):
    """``text`` with its master's line (the last address) now ``master`` (dropped where it was a worker)."""
    lines = (edit_hosts_text(text, remove=[master], source=source) if master in current else text).splitlines()
    last = max(i for i, line in enumerate(lines) if parse_hosts(line, source=source))
    lines[last] = master
    return "".join(f"{line}\n" for line in lines)


def plan(text, hosts, state, master, protected, source, replace_master=False):
    """Decide the edit. Returns (new_text, added, removed, before_hosts, effective_master)."""
    current = parse_hosts(text or "", source=source)
    if replace_master and state == "present" and master is not None and current and current[-1] != master:
        replaced = _replace_master(text, current, master, source)
        new_text, added, removed, _current, effective = plan(replaced, hosts, state, master, protected, source)
        return new_text, [master] + added, [current[-1]], current, effective
    effective_master = _check_master(current, master, source)
    if state == "absent":
        added, removed = [], _plan_removal(current, hosts, effective_master, protected, source)
    else:
        added, removed = _plan_addition(current, hosts, master), []
    if not added and not removed:
        return text, added, removed, current, effective_master
    new_text = edit_hosts_text(text or "", add=added, remove=removed,
                               master=current[-1] if current else master, source=source)
    return new_text, added, removed, current, effective_master


# --- apply under lock -------------------------------------------------------------------


@dataclass
class Edit:
    """One edit of host_worker: the text before (None: no file) and after, and where the log stood."""

    before: str | None
    after: str | None
    added: list
    removed: list
    position: tuple | None = None
    warmed: tuple = ()

    @property
    def changed(self):
        return bool(self.added or self.removed)


def compute_edit(request, text):
    """The Edit that ``request`` makes of host_worker ``text`` (None: no file yet)."""
    new_text, added, removed, _before, _master = plan(
        text, request.hosts, request.state, request.master, request.protected, request.path,
        replace_master=request.replace_master)
    return Edit(before=text, after=new_text, added=added, removed=removed)


def apply_edit(request, check_mode=False):
    """Read, plan and write host_worker under its lock; in check mode only read and plan.

    The log position is recorded before the write, so that only later log lines
    can confirm the change.
    """
    check_required(request)
    if check_mode:
        edit = compute_edit(request, _read_text(request.path))
        return edit if request.edit else Edit(before=edit.before, after=edit.before, added=[], removed=[])
    with locked(request.path, timeout=request.lock_timeout):
        edit = compute_edit(request, _read_text(request.path))
        if not request.edit:                     # the warm requests alone, before a later edit
            warmed = warm_joiners(request, edit) if request.warm and request.state == "present" else ()
            return Edit(before=edit.before, after=edit.before, added=[], removed=[], warmed=warmed)
        if edit.changed:
            edit.position = log_position(request.log_path)
            if request.warm and request.state == "present":
                edit.warmed = warm_joiners(request, edit)
            atomic_write(request.path, edit.after)
    return edit


def warm_joiners(request, edit):
    """Write the warm request of every host ``edit`` adds but the master (before the edit is written)."""
    files = JobFiles(request.directory)
    master = (parse_hosts(edit.after or "", source=request.path) or [None])[-1]   # the last address
    hosts = tuple(h for h in edit.added if h != master)
    for host in hosts:
        try:
            write_warm_request(files, host, reason="add_workers")
        except OSError as exc:
            raise HostWorkerError(f"cannot write the warm request of {host} under {files.control}: {exc}; "
                                  "host_worker was not changed") from None
    return hosts


def edit_or_fail(request, check_mode, result):
    """apply_edit, with its errors turned into a HostWorkerFailure carrying ``result``."""
    try:
        return apply_edit(request, check_mode=check_mode)
    except HostWorkerError as exc:
        raise HostWorkerFailure(str(exc), **result) from None
    except OSError as exc:
        raise HostWorkerFailure(f"cannot update {request.path}: {exc}; nothing was changed", **result) from None


# --- wait for confirmation --------------------------------------------------------------


class Confirmations:
    """Matches the launcher's log lines against the hosts whose change is pending."""

    def __init__(self, state, pending, last_seq):
        self.state = state
        self.pending = list(pending)
        self.last_seq = last_seq
        self.events = []
        self.rejected = []

    def take(self, entries):
        """Account for parsed log entries ``(seq, event, ip, ns, line)``; older lines do not count."""
        for seq, event, ip, _ns, line in entries:
            if seq <= self.last_seq or ip not in self.pending:
                continue
            if self.state == "present":
                self.pending.remove(ip)
                (self.events if event == "ADDED" else self.rejected).append(line)
            elif event in ("REMOVED", "FAILED"):
                self.pending.remove(ip)
                self.events.append(line)

    @property
    def settled(self):
        """Every change confirmed, or the launcher rejected one."""
        return not self.pending or bool(self.rejected)


class MalformedLineWarner:
    """Warns once per malformed log line."""

    def __init__(self, log_path, warn):
        self.log_path = log_path
        self.warn = warn
        self.seen = set()

    def __call__(self, bad_lines):
        for line in bad_lines:
            if self.warn is not None and line not in self.seen:
                self.seen.add(line)
                self.warn(f"ignoring malformed {self.log_path} line {line!r}")


def wait_for_log(log_path, position, state, pending, timeout, sleep=time.sleep, clock=time.time,
                 poll_interval=POLL_INTERVAL, warn=None, budget=None):
    """Wait for the launcher's confirmation of each pending host.

    Waits up to ``timeout`` seconds, or ``budget`` seconds when that is less (a
    short poll). Returns (events, unconfirmed, rejected, waited_s): confirming
    lines, hosts still unconfirmed, lines that reported a failure for a host
    being added.
    """
    offset, last_seq = position
    confirmations = Confirmations(state, pending, last_seq)
    warn_bad = MalformedLineWarner(log_path, warn)
    start = clock()
    deadline = start + (timeout if budget is None else min(timeout, budget))
    while True:
        entries, offset, bad = read_log_since(log_path, offset)
        warn_bad(bad)
        confirmations.take(entries)
        now = clock()
        if confirmations.settled or now >= deadline:
            return confirmations.events, confirmations.pending, confirmations.rejected, round(now - start, 3)
        sleep(max(0.0, min(poll_interval, deadline - now)))


def launcher_status(launcher_log, log_path, now):
    """One sentence on whether the launcher looks alive, from its log files."""
    try:
        age = now - os.stat(launcher_log).st_mtime
    except OSError:
        age = None
    if age is None:
        notes = [f"there is no launcher log at {launcher_log}: the launcher appears not to be running "
                 "(start it on the master; it writes that log)"]
    elif age > STALE_LAUNCHER_S:
        notes = [f"the launcher log {launcher_log} was last written {age:.0f} s ago: the launcher appears "
                 "not to be running or is stuck"]
    else:
        notes = [f"the launcher is writing its log (last write {age:.0f} s ago): the change may still be "
                 "waiting for the next step/epoch boundary or for the new worker's data preparation; raise "
                 "timeout or look at the log below"]
    if not os.path.exists(log_path):
        notes.append(f"{log_path} does not exist: the launcher has never confirmed a change")
    return "; ".join(notes)


# --- result -----------------------------------------------------------------------------


def empty_result():
    """The result before anything is known: what a failure in validation returns."""
    return dict(changed=False, hosts=[], master=None, added=[], removed=[], events=[], unconfirmed=[],
                waited_s=0.0, confirm=None, settled=True, confirmed=[], pending=[], seconds_left=None, warmed=[])


def edit_result(request, edit, diff_mode=False):
    """The result keys that describe the edit (and its diff in diff mode)."""
    after = parse_hosts(edit.after or "", source=request.path)
    result = dict(changed=edit.changed, hosts=after, master=after[-1] if after else None,
                  added=edit.added, removed=edit.removed)
    if diff_mode:
        result["diff"] = dict(
            before=edit.before or "", after=edit.after or "",
            before_header=request.path if edit.before is not None else f"{request.path} (absent)",
            after_header=request.path,
        )
    return result


def describe_tail(launcher_log, tail):
    """The launcher log tail as text for a failure message."""
    if tail is None:
        return f"(no launcher log at {launcher_log})"
    if not tail:
        return f"(launcher log {launcher_log} is empty)"
    return f"last {len(tail)} lines of {launcher_log}:\n" + "\n".join(tail)


def rejected_message(request, rejected, hosts, tail_text):
    ips = ", ".join(line.split()[2] for line in rejected)
    return (f"the launcher reported a failure instead of ADDED for {ips}: {'; '.join(rejected)}. "
            f"{request.path} now lists {', '.join(hosts)}; the launcher log may say why. {tail_text}")


def confirmation_word(state):
    return "ADDED" if state == "present" else "REMOVED/FAILED"


def progress_message(state, confirmed, pending, seconds_left):
    """The line a retrying task shows: who is confirmed, who is awaited, how long is left."""
    return (f"waiting for the launcher to confirm {confirmation_word(state)}: confirmed [{', '.join(confirmed)}], "
            f"pending [{', '.join(pending)}], {seconds_left:.0f} s left")


def timeout_message(request, state, pending, unconfirmed, tail_text):
    want = confirmation_word(state)
    confirmed = [h for h in pending if h not in unconfirmed]
    confirmed_text = f" (confirmed: {', '.join(confirmed)})" if confirmed else ""
    status = launcher_status(request.launcher_log, request.log_path, time.time())
    return (f"timed out after {request.timeout:g} s waiting for the launcher to confirm the change in "
            f"{request.log_path}: no {want} line for {', '.join(unconfirmed)}{confirmed_text}. "
            f"The edit of {request.path} stays in place (the launcher applies it when it can). "
            f"{status}. {tail_text}")


def wait_failure(request, result, pending, rejected, state=None):
    """The HostWorkerFailure for a rejected or unconfirmed change, with the launcher log tail.

    ``state`` is the edit's (request.state unless waiting with confirm).
    """
    state = state or request.state
    tail = tail_file(request.launcher_log)
    result["launcher_log_tail"] = tail or []
    tail_text = describe_tail(request.launcher_log, tail)
    if rejected:
        msg = rejected_message(request, rejected, result["hosts"], tail_text)
    else:
        msg = timeout_message(request, state, pending, result["unconfirmed"], tail_text)
    return HostWorkerFailure(msg, **result)


def run(params, check_mode=False, diff_mode=False, warn=None, sleep=time.sleep, clock=time.time,
        poll_interval=POLL_INTERVAL):
    """The module's logic, without AnsibleModule. Returns the result or raises HostWorkerFailure."""
    result = empty_result()
    request = validate(params, result)
    waiting = dict(sleep=sleep, clock=clock, poll_interval=poll_interval, warn=warn)
    if request.confirm is not None:
        result.update(current_hosts(request, result))
        return await_confirmation(request, request.confirm, result, **waiting)
    edit = edit_or_fail(request, check_mode, result)
    result.update(edit_result(request, edit, diff_mode), warmed=list(edit.warmed))
    if not request.edit:
        result["changed"] = bool(edit.warmed)
        return result
    changed = edit.changed and not check_mode
    pending = Pending(state=request.state, hosts=(edit.added if request.state == "present" else edit.removed)
                      if changed else [], position=tuple(edit.position or (0, -1)), started=clock())
    result["confirm"] = pending.as_dict()
    if not request.wait or not changed:
        return result
    return await_confirmation(request, pending, result, **waiting)


def current_hosts(request, result):
    """The hosts/master result keys from the file as it is (for a call that only waits)."""
    try:
        hosts = parse_hosts(_read_text(request.path) or "", source=request.path)
    except HostWorkerError as exc:
        raise HostWorkerFailure(str(exc), **result) from None
    return dict(hosts=hosts, master=hosts[-1] if hosts else None)


def await_confirmation(request, pending, result, sleep=time.sleep, clock=time.time, poll_interval=POLL_INTERVAL,
                       warn=None):
    """Wait (up to request.poll s per call when set) for the launcher to confirm ``pending``.

    Returns the result, with settled=false while hosts are pending and time is
    left; raises HostWorkerFailure once the launcher rejected a change or the
    timeout (counted from the edit) passed.
    """
    deadline = pending.started + request.timeout
    events, unconfirmed, rejected, _waited = wait_for_log(
        request.log_path, pending.position, pending.state, pending.hosts, max(0.0, deadline - clock()),
        sleep=sleep, clock=clock, poll_interval=poll_interval, warn=warn, budget=request.poll or None)
    now = clock()
    # a host the launcher logged FAILED while being added is rejected, not confirmed
    refused = {line.split()[2] for line in rejected if len(line.split()) > 2}
    confirmed = [h for h in pending.hosts if h not in unconfirmed and h not in refused]
    result.update(events=events, confirmed=confirmed, waited_s=round(now - pending.started, 3),
                  seconds_left=round(max(0.0, deadline - now), 1))
    if rejected or (unconfirmed and now >= deadline):
        result["unconfirmed"] = unconfirmed
        raise wait_failure(request, result, pending.hosts, rejected, state=pending.state)
    if unconfirmed:
        result.update(settled=False, pending=unconfirmed,
                      msg=progress_message(pending.state, confirmed, unconfirmed, deadline - now))
    else:
        result["msg"] = (f"the launcher confirmed {confirmation_word(pending.state)} for "
                         f"{', '.join(confirmed) or 'nothing'}")
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            log_path=dict(type="path"),
            hosts=dict(type="list", elements="str", default=[]),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            master=dict(type="str"),
            replace_master=dict(type="bool", default=False),
            protected=dict(type="list", elements="str", default=[]),
            wait=dict(type="bool", default=False),
            timeout=dict(type="float", default=DEFAULT_TIMEOUT),
            launcher_log=dict(type="path"),
            lock_timeout=dict(type="float", default=DEFAULT_LOCK_TIMEOUT),
            confirm=dict(type="dict"),
            poll=dict(type="float", default=0.0),
            warm=dict(type="bool", default=False),
            edit=dict(type="bool", default=True),
            require=dict(type="str", default=""),
            require_data=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    try:
        result = run(module.params, check_mode=module.check_mode, diff_mode=module._diff, warn=module.warn)
    except HostWorkerFailure as exc:
        failed = {k: v for k, v in exc.result.items() if k != "msg"}
        module.fail_json(msg=exc.msg, **failed)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
