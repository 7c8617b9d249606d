# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""Filters of playbooks/preflight.yml; the rules live in module_utils/preflight.py."""

from __future__ import annotations

from ansible_collections.dynatrain.elastic.plugins.module_utils.preflight import admin_cidr_problem


class FilterModule:
    """dynatrain.elastic preflight filters."""

    def filters(self):
        return {"admin_cidr_problem": admin_cidr_problem}
