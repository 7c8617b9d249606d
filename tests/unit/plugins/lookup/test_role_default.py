"""The role_default lookup, and the mapping's use of it: a role variable's default is stated once, in its role
(issue 42 item 2)."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleLookupError

from ansible_collections.dynatrain.elastic.plugins.lookup.role_default import LookupModule, role_default

ROOT = Path(__file__).resolve().parents[4]
MAPPINGS = [ROOT / "playbooks" / "vars" / "cluster.yml", ROOT / "playbooks" / "vars" / "nodes.yml"]
# `role_var: "{{ dt_setting | default(LITERAL) }}"`: a literal default in the mapping.
LITERAL_DEFAULT = re.compile(r"\{\{ (dt_\w+) \| default\(('[^']*'|\d+|true|false|\{\})\) \}\}$")


def all_role_defaults():
    out = {}
    for path in (ROOT / "roles").glob("*/defaults/main.yml"):
        out.update(yaml.safe_load(path.read_text()) or {})
    return out


def test_it_reads_the_role_the_prefix_names():
    assert role_default("fleet_root_volume_size") == all_role_defaults()["fleet_root_volume_size"]
    # node_image_* is node_image's, not a role named node's.
    assert role_default("node_image_baked_name") == all_role_defaults()["node_image_baked_name"]
    assert LookupModule().run(["launcher_script_api", "warm_pool_size"]) == [
        all_role_defaults()["launcher_script_api"], all_role_defaults()["warm_pool_size"]]


def test_it_refuses_what_no_role_states(tmp_path):
    with pytest.raises(AnsibleLookupError, match="no role states a default for fleet_nothing_such.*roles/fleet"):
        role_default("fleet_nothing_such")
    with pytest.raises(AnsibleLookupError, match="none is named by its prefix"):
        role_default("nobody_size")


def test_it_refuses_a_templated_default(tmp_path):
    (tmp_path / "room" / "defaults").mkdir(parents=True)
    (tmp_path / "room" / "defaults" / "main.yml").write_text("room_a: '{{ room_b }}'\nroom_b: 3\n")
    assert role_default("room_b", roles_dir=str(tmp_path)) == 3
    with pytest.raises(AnsibleLookupError, match="room's default of room_a is templated"):
        role_default("room_a", roles_dir=str(tmp_path))


def test_it_rereads_a_changed_file(tmp_path):
    (tmp_path / "room" / "defaults").mkdir(parents=True)
    path = tmp_path / "room" / "defaults" / "main.yml"
    path.write_text("room_a: 1\n")
    assert role_default("room_a", roles_dir=str(tmp_path)) == 1
    path.write_text("room_a: 22\n")
    os.utime(path, ns=(1, 10**18))
    assert role_default("room_a", roles_dir=str(tmp_path)) == 22


@pytest.mark.parametrize("path", MAPPINGS, ids=lambda p: p.name)
def test_the_mapping_states_no_role_default_again(path):
    """A literal default in the mapping that is also the role's would be a second home (it could drift)."""
    defaults = all_role_defaults()
    mapping = yaml.safe_load(path.read_text())
    again = []
    for name, value in mapping.items():
        found = LITERAL_DEFAULT.search(str(value).strip())
        # '' is "not set" rather than a default; a different literal (launcher_metrics_port: the cluster's
        # 9110, the role's 0: off) is the playbooks' own choice.
        if found and name in defaults and found.group(2) != "''" and yaml.safe_load(found.group(2)) == defaults[name]:
            again.append(f"{name} ({found.group(2)})")
    assert not again, f"{path.name} states role defaults again: {again}; use lookup('dynatrain.elastic.role_default')"


def test_the_mapping_asks_for_defaults_that_exist():
    for path in MAPPINGS:
        for name in re.findall(r"role_default', '(\w+)'", path.read_text()):
            assert name in all_role_defaults(), f"{path.name} asks for {name}'s default, which no role states"
            role_default(name)
