"""Every role's meta/argument_specs.yml must match its defaults/main.yml.

Covers every directory under roles/ (new roles are picked up automatically):
- the role has an argument spec (meta/argument_specs.yml, or argument_specs in
  meta/main.yml) with a `main` entry point;
- every key of defaults/main.yml is an option of the `main` entry point;
- every option of every entry point is either in defaults/main.yml or is
  `required: true` without a default (and only then);
- a `default:` written in the spec equals the value in defaults/main.yml;
- every option and default is prefixed with the role name (`<role>_`).
"""

import os

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ROLES_DIR = os.path.join(ROOT, "roles")


def _roles():
    if not os.path.isdir(ROLES_DIR):
        return []
    return sorted(
        name
        for name in os.listdir(ROLES_DIR)
        if os.path.isdir(os.path.join(ROLES_DIR, name)) and not name.startswith(".")
    )


def _load(path):
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _defaults(role):
    path = os.path.join(ROLES_DIR, role, "defaults", "main.yml")
    if not os.path.exists(path):
        path = os.path.join(ROLES_DIR, role, "defaults", "main.yaml")
    if not os.path.exists(path):
        return {}
    data = _load(path) or {}
    assert isinstance(data, dict), "%s: defaults/main.yml must be a mapping" % role
    return data


def _specs(role):
    meta = os.path.join(ROLES_DIR, role, "meta")
    for name in ("argument_specs.yml", "argument_specs.yaml"):
        path = os.path.join(meta, name)
        if os.path.exists(path):
            return (_load(path) or {}).get("argument_specs")
    for name in ("main.yml", "main.yaml"):
        path = os.path.join(meta, name)
        if os.path.exists(path):
            specs = (_load(path) or {}).get("argument_specs")
            if specs is not None:
                return specs
    return None


def _options(entry_point):
    return (entry_point or {}).get("options") or {}


ROLES = _roles()


def test_roles_found():
    assert ROLES, "no roles under %s" % ROLES_DIR


@pytest.mark.parametrize("role", ROLES)
def test_role_has_argument_specs(role):
    specs = _specs(role)
    assert specs, "%s: no meta/argument_specs.yml (argument_specs)" % role
    assert "main" in specs, "%s: argument_specs has no 'main' entry point" % role


@pytest.mark.parametrize("role", ROLES)
def test_defaults_are_in_main_spec(role):
    specs = _specs(role) or {}
    options = _options(specs.get("main"))
    missing = sorted(set(_defaults(role)) - set(options))
    assert not missing, (
        "%s: defaults/main.yml has variables that meta/argument_specs.yml (main) does not "
        "declare: %s" % (role, ", ".join(missing))
    )


@pytest.mark.parametrize("role", ROLES)
def test_spec_options_have_defaults_or_are_required(role):
    defaults = _defaults(role)
    problems = []
    for ep_name, entry_point in sorted((_specs(role) or {}).items()):
        for name, option in sorted(_options(entry_point).items()):
            option = option or {}
            required = bool(option.get("required", False))
            if name in defaults:
                if required:
                    problems.append("%s.%s is required but has a default in defaults/main.yml"
                                    % (ep_name, name))
            elif not required:
                problems.append("%s.%s is not in defaults/main.yml and not required: true"
                                % (ep_name, name))
            elif "default" in option:
                problems.append("%s.%s is required but the spec gives a default" % (ep_name, name))
    assert not problems, "%s: argument spec drifted from defaults:\n  %s" % (role, "\n  ".join(problems))


@pytest.mark.parametrize("role", ROLES)
def test_spec_default_values_match(role):
    defaults = _defaults(role)
    problems = []
    for ep_name, entry_point in sorted((_specs(role) or {}).items()):
        for name, option in sorted(_options(entry_point).items()):
            option = option or {}
            if "default" in option and name in defaults and option["default"] != defaults[name]:
                problems.append("%s.%s: spec default %r != defaults/main.yml %r"
                                % (ep_name, name, option["default"], defaults[name]))
    assert not problems, "%s:\n  %s" % (role, "\n  ".join(problems))


@pytest.mark.parametrize("role", ROLES)
def test_variables_are_role_prefixed(role):
    names = set(_defaults(role))
    for entry_point in (_specs(role) or {}).values():
        names |= set(_options(entry_point))
    bad = sorted(n for n in names if not n.startswith(role + "_"))
    assert not bad, "%s: variables not prefixed with '%s_': %s" % (role, role, ", ".join(bad))
