#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

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
        O(master) is given and differs the module fails.
      - When the file is new or empty and O(state=present), the addresses of
        O(hosts) are written followed by O(master) (so O(hosts=[]) with
        O(master) writes the master alone). Without O(master) the last address
        of O(hosts) becomes the master.
    type: str
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
      - Seconds to wait for the confirmation when O(wait=true).
      - On timeout the module fails, names the hosts that were not confirmed
        and shows the tail of O(launcher_log). The edit itself stays in place.
    type: float
    default: 300
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
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: full
    details:
      - The diff shows the whole C(host_worker) file before and after the edit.
  platform:
    description: Target OS/families that can be operated against.
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
  description: Seconds spent waiting for the confirmation.
  returned: always
  type: float
  sample: 12.5
launcher_log_tail:
  description: Last lines of O(launcher_log), when waiting timed out or the launcher reported a failure.
  returned: failure
  type: list
  elements: str
  sample: ["2024-05-01 12:00:01 resize: waiting for step boundary"]
"""

import errno
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dynatrain.elastic.plugins.module_utils.host_worker_file import (
    HostWorkerError,
    edit_hosts_text,
    atomic_write,
    default_log_path,
    locked,
    log_position,
    parse_hosts,
    read_log_since,
    validate_ip,
)

POLL_INTERVAL = 0.5
TAIL_LINES = 20
STALE_LAUNCHER_S = 60


class HostWorkerFailure(Exception):
    """A failure carrying the partial result to return with fail_json."""

    def __init__(self, msg, **result):
        super(HostWorkerFailure, self).__init__(msg)
        self.msg = msg
        self.result = result


def _unique(items):
    out = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


def _read_text(path):
    try:
        with open(path, "r") as handle:
            return handle.read()
    except IOError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise


def tail_file(path, lines=TAIL_LINES, max_bytes=65536):
    """Return the last ``lines`` lines of a file, or None if it does not exist."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read()
    except IOError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise
    text = data.decode("utf-8", "replace").splitlines()
    if size > max_bytes and text:
        text = text[1:]
    return text[-lines:] if lines else []


def launcher_status(launcher_log, log_path, now):
    """One sentence on whether the launcher looks alive, from its log files."""
    notes = []
    try:
        age = now - os.stat(launcher_log).st_mtime
    except OSError:
        notes.append(
            "there is no launcher log at %s: the launcher appears not to be running "
            "(start it on the master; it writes that log)" % launcher_log
        )
        age = None
    if age is not None:
        if age > STALE_LAUNCHER_S:
            notes.append(
                "the launcher log %s was last written %.0f s ago: the launcher appears not to be running "
                "or is stuck" % (launcher_log, age)
            )
        else:
            notes.append(
                "the launcher is writing its log (last write %.0f s ago): the change may still be waiting for "
                "the next step/epoch boundary or for the new worker's data preparation; raise timeout "
                "or look at the log below" % age
            )
    if not os.path.exists(log_path):
        notes.append("%s does not exist: the launcher has never confirmed a change" % log_path)
    return "; ".join(notes)


def plan(text, hosts, state, master, protected, source):
    """Decide the edit. Returns (new_text, added, removed, before_hosts, effective_master)."""
    current = parse_hosts(text or "", source=source)
    file_master = current[-1] if current else None
    if master is not None and file_master is not None and master != file_master:
        raise HostWorkerError(
            "%s ends with %s, which is the master of the running job, but master=%s was given; "
            "the master cannot be changed by editing host_worker" % (source, file_master, master)
        )
    effective_master = file_master if file_master is not None else master
    if state == "absent":
        refused = []
        for h in hosts:
            if h == effective_master:
                refused.append("%s (the master)" % h)
            elif h in protected:
                refused.append("%s (protected)" % h)
        if refused:
            raise HostWorkerError(
                "refusing to remove %s from %s: the master and protected hosts may never be removed; "
                "nothing was changed" % (", ".join(refused), source)
            )
        removed = [h for h in hosts if h in current]
        added = []
    else:
        wanted = list(hosts)
        if not current and master is not None and master not in wanted:
            wanted.append(master)
        added = [h for h in wanted if h not in current]
        if not current and master is not None:
            # the master is written last, whatever the order of hosts
            added = [h for h in added if h != master] + [master]
        removed = []
    if not added and not removed:
        return text, added, removed, current, effective_master
    new_text = edit_hosts_text(
        text or "", add=added, remove=removed,
        master=file_master if current else master, source=source,
    )
    return new_text, added, removed, current, effective_master


def wait_for_log(log_path, position, state, pending, timeout, sleep=time.sleep, clock=time.time,
                 poll_interval=POLL_INTERVAL, warn=None):
    """Wait for the launcher's confirmation of each pending host.

    Returns (events, unconfirmed, rejected, waited_s): confirming lines, hosts
    still unconfirmed, lines that reported a failure for a host being added.
    """
    offset, last_seq = position
    pending = list(pending)
    events, rejected = [], []
    start = clock()
    deadline = start + timeout
    warned = set()
    while True:
        entries, offset, bad = read_log_since(log_path, offset)
        for line in bad:
            if warn is not None and line not in warned:
                warned.add(line)
                warn("ignoring malformed %s line %r" % (log_path, line))
        for seq, event, ip, _ns, line in entries:
            if seq <= last_seq or ip not in pending:
                continue
            if state == "present":
                if event == "ADDED":
                    pending.remove(ip)
                    events.append(line)
                else:
                    pending.remove(ip)
                    rejected.append(line)
            elif event in ("REMOVED", "FAILED"):
                pending.remove(ip)
                events.append(line)
        now = clock()
        if not pending or rejected or now >= deadline:
            return events, pending, rejected, round(now - start, 3)
        sleep(max(0.0, min(poll_interval, deadline - now)))


def run(params, check_mode=False, diff_mode=False, warn=None, sleep=time.sleep, clock=time.time,
        poll_interval=POLL_INTERVAL):
    """The module's logic, without AnsibleModule. Returns the result or raises HostWorkerFailure."""
    path = os.path.abspath(params["path"])
    directory = os.path.dirname(path)
    log_path = params.get("log_path") or default_log_path(path)
    launcher_log = params.get("launcher_log") or os.path.join(directory, "logs", "launcher.log")
    state = params.get("state") or "present"
    timeout = float(params.get("timeout") if params.get("timeout") is not None else 300)
    lock_timeout = float(params.get("lock_timeout") if params.get("lock_timeout") is not None else 30)

    result = dict(changed=False, hosts=[], master=None, added=[], removed=[], events=[], unconfirmed=[],
                  waited_s=0.0)
    try:
        hosts = _unique(validate_ip(h) for h in (params.get("hosts") or []))
        protected = set(validate_ip(h) for h in (params.get("protected") or []))
        master = validate_ip(params["master"]) if params.get("master") else None
    except HostWorkerError as exc:
        raise HostWorkerFailure("%s; nothing was changed" % exc, **result)
    if not os.path.isdir(directory):
        raise HostWorkerFailure(
            "directory %s of path does not exist: mount the shared volume (EFS_MOUNT) or create it first; "
            "nothing was changed" % directory, **result)
    if os.path.isdir(path):
        raise HostWorkerFailure("path %s is a directory, not the host_worker file" % path, **result)

    def edit():
        text = _read_text(path)
        new_text, added, removed, before_hosts, _m = plan(text, hosts, state, master, protected, path)
        position = None
        if (added or removed) and not check_mode:
            position = log_position(log_path)
            atomic_write(path, new_text)
        return text, new_text, added, removed, position

    try:
        if check_mode:
            text, new_text, added, removed, position = edit()
        else:
            with locked(path, timeout=lock_timeout):
                text, new_text, added, removed, position = edit()
    except HostWorkerError as exc:
        raise HostWorkerFailure(str(exc), **result)
    except (IOError, OSError) as exc:
        raise HostWorkerFailure("cannot update %s: %s; nothing was changed" % (path, exc), **result)

    after = parse_hosts(new_text or "", source=path)
    result.update(
        changed=bool(added or removed),
        hosts=after,
        master=after[-1] if after else None,
        added=added,
        removed=removed,
    )
    if diff_mode:
        result["diff"] = dict(
            before=text or "", after=new_text or "",
            before_header=path if text is not None else "%s (absent)" % path,
            after_header=path,
        )
    if not params.get("wait") or check_mode or not result["changed"]:
        return result

    pending = added if state == "present" else removed
    events, unconfirmed, rejected, waited = wait_for_log(
        log_path, position, state, pending, timeout, sleep=sleep, clock=clock,
        poll_interval=poll_interval, warn=warn)
    result.update(events=events, unconfirmed=unconfirmed, waited_s=waited)
    if not rejected and not unconfirmed:
        return result

    tail = tail_file(launcher_log)
    result["launcher_log_tail"] = tail or []
    if tail is None:
        tail_text = "(no launcher log at %s)" % launcher_log
    elif not tail:
        tail_text = "(launcher log %s is empty)" % launcher_log
    else:
        tail_text = "last %d lines of %s:\n%s" % (len(tail), launcher_log, "\n".join(tail))
    want = "ADDED" if state == "present" else "REMOVED/FAILED"
    if rejected:
        msg = ("the launcher reported a failure instead of ADDED for %s: %s. %s now lists %s; "
               "the launcher log may say why. %s"
               % (", ".join(line.split()[2] for line in rejected), "; ".join(rejected), path,
                  ", ".join(after), tail_text))
    else:
        confirmed = [h for h in pending if h not in unconfirmed]
        msg = ("timed out after %g s waiting for the launcher to confirm the change in %s: "
               "no %s line for %s%s. The edit of %s stays in place (the launcher applies it when it can). "
               "%s. %s"
               % (timeout, log_path, want, ", ".join(unconfirmed),
                  " (confirmed: %s)" % ", ".join(confirmed) if confirmed else "",
                  path, launcher_status(launcher_log, log_path, time.time()), tail_text))
    raise HostWorkerFailure(msg, **result)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            log_path=dict(type="path"),
            hosts=dict(type="list", elements="str", default=[]),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            master=dict(type="str"),
            protected=dict(type="list", elements="str", default=[]),
            wait=dict(type="bool", default=False),
            timeout=dict(type="float", default=300),
            launcher_log=dict(type="path"),
            lock_timeout=dict(type="float", default=30),
        ),
        supports_check_mode=True,
    )
    try:
        result = run(module.params, check_mode=module.check_mode, diff_mode=module._diff, warn=module.warn)
    except HostWorkerFailure as exc:
        module.fail_json(msg=exc.msg, **exc.result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
