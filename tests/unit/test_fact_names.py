"""`dt_` names the user's settings, never a fact (issue 42): no playbook or role sets a `dt_` fact, registers a
`dt_` result or gives an add_host `dt_` host var, except the settings a play resolves for the user."""
from __future__ import annotations

import glob
import os

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# settings a play fills in when the user left them empty (preflight's zone, network's CIDRs)
RESOLVED_SETTINGS = {"dt_admin_cidr", "dt_availability_zone", "dt_subnet_cidr", "dt_vpc_cidr"}
ADD_HOST_ARGS = {"name", "hostname", "host", "groups", "groupname", "group"}


def tasks_of(node):
    """Every task dict in a parsed playbook or task file, blocks and plays included."""
    if isinstance(node, list):
        for item in node:
            yield from tasks_of(item)
    elif isinstance(node, dict):
        yield node
        for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"):
            yield from tasks_of(node.get(key) or [])


def names_set(task):
    for action in ("ansible.builtin.set_fact", "set_fact"):
        if isinstance(task.get(action), dict):
            yield from task[action]
    for action in ("ansible.builtin.add_host", "add_host"):
        if isinstance(task.get(action), dict):
            yield from (k for k in task[action] if k not in ADD_HOST_ARGS)
    if isinstance(task.get("register"), str):
        yield task["register"]


def test_no_playbook_or_role_sets_a_dt_fact():
    files = glob.glob(os.path.join(ROOT, "playbooks", "**", "*.yml"), recursive=True)
    files += glob.glob(os.path.join(ROOT, "roles", "*", "tasks", "*.yml"))
    files += glob.glob(os.path.join(ROOT, "*.yml"))
    assert len(files) > 40
    found, seen = [], 0
    for path in files:
        with open(path) as fh:
            doc = yaml.safe_load(fh)
        for task in tasks_of(doc):
            for name in names_set(task):
                seen += 1
                if name.startswith("dt_") and name not in RESOLVED_SETTINGS:
                    found.append("%s: %s" % (os.path.relpath(path, ROOT), name))
    assert seen > 100  # the walk reached the facts, registers and host vars
    assert not found, "facts named like settings (drop the dt_ prefix): %s" % found
