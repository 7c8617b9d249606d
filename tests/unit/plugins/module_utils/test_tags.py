"""The EC2 tag names have one home (plugins/module_utils/tags.py, issue 42 item 2): every tag name spelled in
the collection is one of its names, no code outside it states one as a literal, and the roles read them through
the dynatrain.elastic.cluster_tags lookup."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from ansible_collections.dynatrain.elastic.plugins.lookup.cluster_tags import LookupModule
from ansible_collections.dynatrain.elastic.plugins.module_utils import tags
from ansible_collections.dynatrain.elastic.plugins.inventory import ec2_elastic

ROOT = Path(__file__).resolve().parents[4]
HOME = ROOT / "plugins" / "module_utils" / "tags.py"
# Where the collection's code and documentation live (tests and the runtime excluded: the runtime reads no tag).
SCANNED = [ROOT / "plugins", ROOT / "roles", ROOT / "playbooks", ROOT / "files", ROOT / "docs", ROOT / "molecule"]
OURS = re.compile(r"(?<![\w.-])dynatrain:[a-z][a-z-]*[a-z]")
# DT's names, and the tag filter (tag:<name>) a YAML file would spell.
DT_NAMES = (tags.NODE_TYPE, tags.STATUS)


def scanned_files():
    files = sorted(ROOT.glob("*.yml"))
    for top in SCANNED:
        files += sorted(p for p in top.rglob("*") if p.is_file() and p.suffix in (".py", ".yml", ".yaml", ".j2", ".md", ".json")
                        and "__pycache__" not in p.parts)
    return [p for p in files if p != HOME]


def test_every_tag_name_spelled_anywhere_is_one_of_the_home():
    names = set(tags.TAGS.values())
    seen = {}
    for path in scanned_files():
        for found in OURS.findall(path.read_text(encoding="utf-8", errors="replace")):
            seen.setdefault(found, path.relative_to(ROOT))
    unknown = {name: str(path) for name, path in seen.items() if name not in names}
    assert not unknown, f"tag names not in plugins/module_utils/tags.py: {unknown}"
    # the scan reads what it should: the docs name the cluster tag
    assert tags.CLUSTER in seen


def _yaml_literals(node):
    """Every string (key or value) of a YAML document."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _yaml_literals(key)
            yield from _yaml_literals(value)
    elif isinstance(node, list):
        for item in node:
            yield from _yaml_literals(item)
    elif isinstance(node, str):
        yield node


def _quoted_names(text):
    """Tag names quoted inside a Jinja expression or a YAML string ('dynatrain:x' / "dynatrain:x" / tag:dynatrain:x)."""
    names = set(tags.TAGS.values()) | set(DT_NAMES)
    pattern = r"""(?:["']|tag:)(%s)["']?""" % "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.findall(pattern, text)


@pytest.mark.parametrize("path", [p for p in scanned_files() if p.suffix in (".yml", ".yaml", ".j2")
                                  and "meta" not in p.parts and "molecule" not in p.parts
                                  and p.name not in ("argument_specs.yml",)
                                  and p.parent.name != "filter"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_role_or_playbook_states_a_tag_name(path):
    text = path.read_text(encoding="utf-8")
    literals = []
    for doc in yaml.safe_load_all(text) if path.suffix != ".j2" else [text]:
        for value in _yaml_literals(doc):
            # a tag name as a whole value or key, or quoted inside an expression
            if value in tags.TAGS.values() or value in DT_NAMES or any(value == "tag:" + n for n in tags.TAGS.values()):
                literals.append(value)
            literals += _quoted_names(value)
    assert not literals, f"{path.relative_to(ROOT)} spells {literals}: read them with lookup('dynatrain.elastic.cluster_tags')"


def _code_strings(tree):
    """String constants of a module's code: not its docstrings, nor DOCUMENTATION / EXAMPLES / RETURN."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                skipped.add(id(body[0].value))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in ("DOCUMENTATION", "EXAMPLES", "RETURN")
                                                for t in node.targets):
            skipped.add(id(node.value))
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in skipped]


@pytest.mark.parametrize("path", [p for p in scanned_files() if p.suffix == ".py" and ROOT / "plugins" in p.parents],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_plugin_states_a_tag_name(path):
    names = set(tags.TAGS.values()) | set(DT_NAMES) | {tags.ELASTIC_SUFFIX}
    found = [s for s in _code_strings(ast.parse(path.read_text(encoding="utf-8"))) if s in names or OURS.fullmatch(s)]
    assert not found, f"{path.relative_to(ROOT)} spells {found}: import plugins/module_utils/tags.py"


def test_the_inventory_plugin_reads_the_home():
    inventory = (ec2_elastic.CLUSTER_TAG, ec2_elastic.ROLE_TAG, ec2_elastic.GROUP_TAG, ec2_elastic.EFS_TAG,
                 ec2_elastic.NODE_TYPE_TAG, ec2_elastic.STATUS_TAG)
    assert inventory == (tags.CLUSTER, tags.ROLE, tags.GROUP, tags.EFS, tags.NODE_TYPE, tags.STATUS)
    assert ec2_elastic.elastic_tag_key("c1") == "c1-aws-dl-cfn-elastic-worker" == tags.elastic_tag("c1")


def test_the_lookup_gives_the_names_by_key():
    lookup = LookupModule()
    assert lookup.run([], {}) == [tags.TAGS]
    assert lookup.run(["cluster", "role"], {}) == [{"cluster": "dynatrain:cluster", "role": "dynatrain:role"}]
    assert lookup.run([], {}, cluster="dtdemo")[0]["elastic"] == "dtdemo-aws-dl-cfn-elastic-worker"
    with pytest.raises(Exception, match="no tag named colour: the tags are"):
        lookup.run(["colour"], {})
    with pytest.raises(Exception, match="takes only the option cluster"):
        lookup.run([], {}, clutser="x")


def test_the_roles_read_the_names_through_the_lookup():
    roles = ("cluster", "network", "fleet", "warm_pool", "node_image")
    for vars_file, key in ((f"roles/{role}/vars/main.yml", f"_{role}_tag") for role in roles):
        with open(ROOT / vars_file, encoding="utf-8") as handle:
            assert "lookup('dynatrain.elastic.cluster_tags'" in yaml.safe_load(handle)[key]
