"""Roles are entered only through declared entry points, and playbooks read only their public variables.

Every YAML file under playbooks/, the top-level playbooks, roles/*/tasks/ and molecule/ is parsed:
- every include_role / import_role (any spelling) and every play's `roles:` names an entry point of
  the collection's role that its meta/argument_specs.yml declares (`tasks_from`, else `main`); a
  templated role name is expanded over the values its variable can take (TEMPLATE_VALUES);
- no playbook (playbooks/**, the top-level *.yml) names a role's internal variable (`_<role>_*`) or
  register (`__<role>_*`), nor includes a role's task file by its path.
"""
import ast
import glob
import os
import re

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTION = "dynatrain.elastic."
ROLES = sorted(d for d in os.listdir(os.path.join(ROOT, "roles")) if not d.startswith("."))
INCLUDE_KEYS = {prefix + verb for prefix in ("", "ansible.builtin.", "ansible.legacy.")
                for verb in ("include_role", "import_role")}
TASKS_KEYS = {prefix + verb for prefix in ("", "ansible.builtin.", "ansible.legacy.")
              for verb in ("include_tasks", "import_tasks", "include")}


def _engines():
    """The engine roles, as the settings check knows them (plugins/module_utils/preflight.py's ENGINES)."""
    path = os.path.join(ROOT, "plugins", "module_utils", "preflight.py")
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "ENGINES" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("plugins/module_utils/preflight.py defines no ENGINES")


# What a variable in a templated role name can be; an unknown one fails the test (add it here).
TEMPLATE_VALUES = {"_dt_engine": _engines()}


def _rel(path):
    return os.path.relpath(path, ROOT)


def _playbook_files():
    files = glob.glob(os.path.join(ROOT, "*.yml")) + glob.glob(os.path.join(ROOT, "playbooks", "**", "*.yml"),
                                                               recursive=True)
    return sorted(files)


def _scanned_files():
    files = _playbook_files()
    files += glob.glob(os.path.join(ROOT, "roles", "*", "tasks", "**", "*.yml"), recursive=True)
    files += glob.glob(os.path.join(ROOT, "molecule", "*", "**", "*.yml"), recursive=True)
    return sorted(set(files))


def _compose(path):
    """The file's YAML documents as node trees (line numbers kept; tags such as !unsafe not constructed)."""
    with open(path, encoding="utf-8") as fh:
        return [doc for doc in yaml.compose_all(fh, Loader=yaml.SafeLoader) if doc is not None]


def _walk(node):
    """Every node of a tree, the root first."""
    yield node
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield from _walk(key)
            yield from _walk(value)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            yield from _walk(item)


def _scalars(mapping):
    return {k.value: v.value for k, v in mapping.value
            if isinstance(k, yaml.ScalarNode) and isinstance(v, yaml.ScalarNode)}


def _free_form(text):
    """`name=x tasks_from=y` (the old key=value spelling)."""
    return dict(part.split("=", 1) for part in text.split() if "=" in part)


def _role_uses(node):
    """(line, role name, tasks_from or None) of every role entered in the tree."""
    for item in _walk(node):
        if not isinstance(item, yaml.MappingNode):
            continue
        keys = _scalars(item)
        for key, value in item.value:
            if key.value in INCLUDE_KEYS:
                args = _scalars(value) if isinstance(value, yaml.MappingNode) else _free_form(value.value)
                yield key.start_mark.line + 1, args.get("name", args.get("role", "")), args.get("tasks_from")
            # a play's roles: (its main entry point)
            elif key.value == "roles" and "hosts" in keys and isinstance(value, yaml.SequenceNode):
                for entry in value.value:
                    args = _scalars(entry) if isinstance(entry, yaml.MappingNode) else {"role": entry.value}
                    yield entry.start_mark.line + 1, args.get("role", args.get("name", "")), None


def _expand(name):
    """The collection roles a (possibly templated) role name stands for; [] for another collection's role."""
    if name.startswith(COLLECTION):
        short = name[len(COLLECTION):]
    elif "." in name.split("{{")[0]:
        return []
    else:
        short = name
    match = re.fullmatch(r"(.*)\{\{\s*(\w+)\s*\}\}(.*)", short)
    if not match:
        return [short]
    head, var, tail = match.groups()
    assert var in TEMPLATE_VALUES, "role name %r: add the values of %s to TEMPLATE_VALUES" % (name, var)
    return [head + value + tail for value in TEMPLATE_VALUES[var]]


def _entry_points(role):
    path = os.path.join(ROOT, "roles", role, "meta", "argument_specs.yml")
    if not os.path.exists(path):
        return set()
    with open(path, encoding="utf-8") as fh:
        return set((yaml.safe_load(fh) or {}).get("argument_specs") or {})


def _entry_point(tasks_from):
    return os.path.splitext(os.path.basename(tasks_from))[0] if tasks_from else "main"


def _undeclared(path):
    problems = []
    for doc in _compose(path):
        for line, name, tasks_from in _role_uses(doc):
            for role in _expand(name):
                entry = _entry_point(tasks_from)
                if role not in ROLES:
                    problems.append("%s:%d: role %s (from %r) does not exist" % (_rel(path), line, role, name))
                elif entry not in _entry_points(role):
                    problems.append("%s:%d: %s tasks_from %s is not an entry point of roles/%s/meta/"
                                    "argument_specs.yml" % (_rel(path), line, role, entry, role))
    return problems


INTERNAL = re.compile(r"(?<![\w.])(__?(?:%s)_\w+)" % "|".join(map(re.escape, sorted(ROLES, key=len, reverse=True))))


def _internal_uses(path):
    """(line, name) of every role-internal variable a file's keys and values name (comments are not read)."""
    found = set()
    for doc in _compose(path):
        for item in _walk(doc):
            if isinstance(item, yaml.ScalarNode) and isinstance(item.value, str):
                found.update((item.start_mark.line + 1, name) for name in INTERNAL.findall(item.value))
    return sorted(found)


def _role_file_includes(path):
    for doc in _compose(path):
        for item in _walk(doc):
            if isinstance(item, yaml.MappingNode):
                for key, value in item.value:
                    if key.value in TASKS_KEYS and isinstance(value, yaml.ScalarNode) and "roles/" in value.value:
                        yield key.start_mark.line + 1, value.value


SCANNED = _scanned_files()
PLAYBOOKS = _playbook_files()


def test_files_found():
    assert any(p.endswith(os.path.join("playbooks", "bootstrap.yml")) for p in SCANNED)
    assert any(os.sep + "tasks" + os.sep in p and os.sep + "roles" + os.sep in p for p in SCANNED)
    assert any(os.sep + "molecule" + os.sep in p for p in SCANNED)


def test_template_values_are_roles():
    for var, values in TEMPLATE_VALUES.items():
        assert set(values) <= set(ROLES), "%s takes %s, not all of them roles" % (var, values)


@pytest.mark.parametrize("path", SCANNED, ids=_rel)
def test_roles_entered_through_declared_entry_points(path):
    problems = _undeclared(path)
    assert not problems, "undeclared entry points:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("path", PLAYBOOKS, ids=_rel)
def test_playbooks_use_no_role_internal_variable(path):
    problems = ["%s:%d: %s is internal to its role (public: <role>_*)" % (_rel(path), line, name)
                for line, name in _internal_uses(path)]
    problems += ["%s:%d: includes a role's task file %s (use include_role with a declared tasks_from)"
                 % (_rel(path), line, target) for line, target in _role_file_includes(path)]
    assert not problems, "\n  ".join([""] + problems)


# The checks themselves: each problem they must report, on a small file.
def test_checks_report_what_they_must(tmp_path):
    play = tmp_path / "play.yml"
    play.write_text(
        "- hosts: all\n"
        "  roles:\n"
        "    - dynatrain.elastic.cluster\n"
        "    - role: dynatrain.elastic.nosuchrole\n"
        "  tasks:\n"
        "    - ansible.builtin.include_role:\n"
        "        name: \"dynatrain.elastic.{{ _dt_engine }}\"\n"
        "        tasks_from: nosuchentry.yml\n"
        "      vars:\n"
        "        _cluster_pin_instances: []\n"
        "    - include_role: name=dynatrain.elastic.cluster tasks_from=select\n"
        "    - ansible.builtin.debug:\n"
        "        msg: \"{{ __efs_result }} {{ dt_x._cluster_attr }} {{ _dt_cluster_x }}\"\n"
        "    - ansible.builtin.include_tasks: ../roles/cluster/tasks/tag.yml\n"
        "    - other.collection.role_x: {}\n")
    undeclared = _undeclared(str(play))
    assert len(undeclared) == 1 + len(TEMPLATE_VALUES["_dt_engine"]), undeclared
    assert any("nosuchrole" in p and "does not exist" in p for p in undeclared)
    assert all("nosuchentry" in p for p in undeclared if "nosuchrole" not in p)
    assert sorted(use[1] for use in _internal_uses(str(play))) == ["__efs_result", "_cluster_pin_instances"]
    assert [use[0] for use in _role_file_includes(str(play))] == [14]
