# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
name: role_default
author:
  - dynatrain maintainers (@dynatrain)
version_added: "0.1.0"
short_description: A role variable's default, as the role's C(defaults/main.yml) states it
description:
  - The playbooks' mapping (C(playbooks/vars/cluster.yml), C(playbooks/vars/nodes.yml)) gives each role variable
    the user's C(dt_) setting when one is set; when none is, it asks this lookup for the role's own default, so that
    a default is stated once, in the role.
  - The role is the one whose name prefixes the variable (C(fleet_root_volume_size) is C(fleet)'s, C(node_image_*)
    C(node_image)'s). Only literal defaults are returned; a templated one (it refers to other variables) is an
    error, for it means nothing outside its role's play.
options:
  _terms:
    description: The role variables whose defaults to return.
    required: true
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: Map the user's setting, else the role's default
  ansible.builtin.set_fact:
    fleet_root_volume_size: "{{ dt_root_volume_size | default(lookup('dynatrain.elastic.role_default', 'fleet_root_volume_size')) }}"
"""

RETURN = r"""
_raw:
  description: The defaults, one per term.
  type: list
  elements: raw
"""

import os

import yaml

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

ROLES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "roles")

# path -> (mtime, defaults): the mapping asks each time a play templates a variable.
_READ = {}


def role_defaults(role, roles_dir=ROLES_DIR):
    """The variables of ROLE's defaults/main.yml (an empty mapping when it has none)."""
    path = os.path.join(roles_dir, role, "defaults", "main.yml")
    try:
        mtime = os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return {}
    if _READ.get(path, (None,))[0] != mtime:
        with open(path, encoding="utf-8") as f:
            _READ[path] = (mtime, yaml.safe_load(f) or {})
    return _READ[path][1]


def role_default(name, roles_dir=ROLES_DIR):
    """NAME's literal default in the role its prefix names (the longest role name that prefixes it)."""
    roles = sorted((r for r in os.listdir(roles_dir) if name.startswith(r + "_")), key=len, reverse=True)
    for role in roles:
        defaults = role_defaults(role, roles_dir)
        if name in defaults:
            value = defaults[name]
            if "{{" in yaml.safe_dump(value):
                raise AnsibleLookupError(
                    f"role_default: {role}'s default of {name} is templated ({value!r}); map a literal or "
                    "state the expression in the mapping")
            return value
    raise AnsibleLookupError(
        f"role_default: no role states a default for {name} (looked in "
        f"{', '.join(f'roles/{r}/defaults/main.yml' for r in roles) or 'no role: none is named by its prefix'})")


class LookupModule(LookupBase):

    def run(self, terms, variables=None, **kwargs):
        if kwargs:
            raise AnsibleLookupError(f"role_default takes no options, not {', '.join(sorted(kwargs))}")
        return [role_default(str(t)) for t in terms]
