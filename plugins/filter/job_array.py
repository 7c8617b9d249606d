# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""Filters of playbooks/job_array.yml and status.yml's array view; the rules live in module_utils/job_array.py."""

from __future__ import annotations

from ansible_collections.dynatrain.elastic.plugins.module_utils.job_array import (
    array_name_from,
    plan_array,
    table_lines,
)


def job_array_plan(manifest, array, vpc_cidr, subnet_cidr, max_workers=0):
    """The manifest's text -> {"rows": [...], "errors": [...]} (module_utils.job_array.plan_array)."""
    return plan_array(manifest, array, vpc_cidr, subnet_cidr, max_workers)


def job_array_table(doc):
    """An array.json document -> the lines of its table."""
    return table_lines(doc if isinstance(doc, dict) else {})


class FilterModule:
    """dynatrain.elastic job array filters."""

    def filters(self):
        return {
            "job_array_plan": job_array_plan,
            "job_array_name": array_name_from,
            "job_array_table": job_array_table,
        }
