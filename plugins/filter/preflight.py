# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""Filters of playbooks/preflight.yml and of the entry points' first checks; the rules live in
module_utils/preflight.py. The -e options as typed (ansible.context.CLIARGS) are read here, on the
controller, and handed to the pure rules."""

from __future__ import annotations

from ansible import context
from ansible.errors import AnsibleError, AnsibleFilterError
from ansible.parsing.dataloader import DataLoader
from ansible.utils.vars import load_extra_vars

from ansible_collections.dynatrain.elastic.plugins.module_utils.preflight import (
    admin_cidr_problem,
    script_args,
    settings_problems,
    typed_value,
)


def _extra_vars_typed():
    """This run's -e options as the user typed them (empty outside ansible-playbook)."""
    return tuple(str(option) for option in (context.CLIARGS.get("extra_vars") or ()))


def train_script_args(value, name="dt_train_script_args"):
    """dt_train_script_args in any form a user types -> the list of strings the training script gets."""
    try:
        return script_args(value, name, typed_value(name, _extra_vars_typed()))
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from None


def _names_typed():
    """The names this run's -e options set (Ansible's own parse of them, cached by the CLI)."""
    try:
        return tuple(load_extra_vars(DataLoader()))
    except AnsibleError:  # a bad -e was refused by the CLI already
        return ()


def settings_typed(names):
    """Which of ``names`` this run's -e options set (a setting typed, not an inventory default): preflight
    checks the wheels of a typed dt_engine at once, and defers an untyped one that a run may take from the
    cluster's job (playbooks/tasks/engine_wheels.yml)."""
    typed = set(_names_typed())
    return [name for name in ([names] if isinstance(names, str) else list(names or [])) if name in typed]


def check_settings(settings, engine_from_cluster=False):
    """settings_problems() of the settings given and of this run's -e options."""
    return settings_problems(settings, _extra_vars_typed(), _names_typed(), bool(engine_from_cluster))


class FilterModule:
    """dynatrain.elastic preflight filters."""

    def filters(self):
        return {
            "admin_cidr_problem": admin_cidr_problem,
            "settings_problems": check_settings,
            "settings_typed": settings_typed,
            "train_script_args": train_script_args,
        }
