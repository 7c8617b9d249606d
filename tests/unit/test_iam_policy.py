"""files/iam/dynatrain-reconcile-policy.json: least privilege for one reconcile pass.

The policy's shape (valid JSON, version, no wildcard action, no IAM action,
every mutating action scoped by the cluster tag or the worker launch template,
the placeholders), and that it allows every AWS call a pass makes: the AWS
modules found by following playbooks/reconcile.yml through the playbooks it
imports and the task files and roles they use, plus the inventory plugin.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IAM = ROOT / "files" / "iam"
POLICY_FILE = IAM / "dynatrain-reconcile-policy.json"
TRUST_FILE = IAM / "ec2-assume-role-trust.json"

PLACEHOLDERS = ("CLUSTER_NAME", "REGION", "ACCOUNT_ID", "WORKER_LAUNCH_TEMPLATE_ID", "WORKER_SPOT_LAUNCH_TEMPLATE_ID")
CLUSTER_TAG = "dynatrain:cluster"
MUTATING = re.compile(r"^[a-z0-9-]+:(Create|Delete|Terminate|Run|Modify|Attach|Detach|Put|Associate|"
                      r"Disassociate|Start|Stop|Reboot|Update|Replace|Authorize|Revoke)")

# The AWS calls of each module a pass uses (amazon.aws / community.aws sources).
MODULE_ACTIONS = {
    "amazon.aws.ec2_instance_info": {"ec2:DescribeInstances"},
    "amazon.aws.ec2_instance": {"ec2:DescribeInstances", "ec2:DescribeInstanceStatus", "ec2:RunInstances",
                                "ec2:CreateTags", "ec2:TerminateInstances"},
    "amazon.aws.ec2_tag": {"ec2:DescribeTags", "ec2:CreateTags"},
    "amazon.aws.ec2_vpc_subnet_info": {"ec2:DescribeSubnets"},
    "amazon.aws.ec2_security_group_info": {"ec2:DescribeSecurityGroups"},
    # our modules that call AWS
    "dynatrain.elastic.host_key_check": {"ec2:GetConsoleOutput"},
    "dynatrain.elastic.ec2_tags": {"ec2:DescribeTags", "ec2:CreateTags"},
    "dynatrain.elastic.preflight_az": {"ec2:DescribeAvailabilityZones", "ec2:DescribeInstanceTypeOfferings"},
    "community.aws.efs_info": {"elasticfilesystem:DescribeFileSystems", "elasticfilesystem:DescribeTags",
                               "elasticfilesystem:DescribeMountTargets",
                               "elasticfilesystem:DescribeMountTargetSecurityGroups"},
}
# plugins/inventory/ec2_elastic.py: one DescribeInstances per region, one batched DescribeInstanceTypes.
# A task line calling an AWS module: amazon.aws / community.aws, or one of ours that calls AWS.
AWS_MODULE = r"^\s*((?:amazon|community)\.aws\.\w+|dynatrain\.elastic\.(?:host_key_check|preflight_az)):"
INVENTORY_ACTIONS = {"ec2:DescribeInstances", "ec2:DescribeInstanceTypes"}


def _load(path):
    return json.loads(path.read_text(encoding="utf-8"))


def _as_list(value):
    return value if isinstance(value, list) else [value]


@pytest.fixture(scope="module")
def policy():
    return _load(POLICY_FILE)


@pytest.fixture(scope="module")
def statements(policy):
    return policy["Statement"]


def _actions(statement):
    return _as_list(statement["Action"])


def _condition_keys(statement):
    return {key for operator in statement.get("Condition", {}).values() for key in operator}


def test_policy_is_valid_json_of_the_current_version(policy, statements):
    assert policy["Version"] == "2012-10-17"
    assert isinstance(statements, list) and statements
    sids = [s.get("Sid") for s in statements]
    assert all(sids) and len(set(sids)) == len(sids), sids


def test_no_wildcard_action_no_deny_no_iam(statements):
    for statement in statements:
        assert statement["Effect"] == "Allow", statement["Sid"]
        assert "NotAction" not in statement and "NotResource" not in statement, statement["Sid"]
        for action in _actions(statement):
            assert "*" not in action, (statement["Sid"], action)
            assert not action.startswith(("iam:", "sts:")), (statement["Sid"], action)


def test_every_mutating_action_is_scoped_by_the_cluster_tag_or_the_launch_template(statements):
    scoping = {f"aws:ResourceTag/{CLUSTER_TAG}", f"aws:RequestTag/{CLUSTER_TAG}", "ec2:LaunchTemplate"}
    mutating = [s for s in statements if any(MUTATING.match(a) for a in _actions(s))]
    assert mutating
    for statement in mutating:
        assert _condition_keys(statement) & scoping, statement["Sid"]
        assert "*" not in _as_list(statement["Resource"]), statement["Sid"]
        values = json.dumps(statement["Condition"])
        assert "CLUSTER_NAME" in values or "WORKER_LAUNCH_TEMPLATE_ID" in values, statement["Sid"]


def test_only_describe_actions_on_every_resource(statements):
    for statement in statements:
        if "*" in _as_list(statement["Resource"]):
            assert all(a.split(":", 1)[1].startswith("Describe") for a in _actions(statement)), statement["Sid"]


def test_run_instances_needs_the_worker_launch_template(statements):
    runs = [s for s in statements if "ec2:RunInstances" in _actions(s)]
    assert runs
    for statement in runs:
        condition = json.dumps(statement.get("Condition", {}))
        resources = " ".join(_as_list(statement["Resource"]))
        assert "launch-template/WORKER_LAUNCH_TEMPLATE_ID" in condition + resources, statement["Sid"]
        assert "launch-template/WORKER_SPOT_LAUNCH_TEMPLATE_ID" in condition + resources, statement["Sid"]
    instance = [s for s in runs if any(":instance/" in r for r in _as_list(s["Resource"]))]
    assert instance and all(
        s["Condition"]["StringEquals"][f"aws:RequestTag/{CLUSTER_TAG}"] == "CLUSTER_NAME" for s in instance)


def test_tags_at_launch_only_with_run_instances(statements):
    create_tags = [s for s in statements if "ec2:CreateTags" in _actions(s)
                   and f"aws:ResourceTag/{CLUSTER_TAG}" not in _condition_keys(s)]
    assert create_tags
    for statement in create_tags:
        assert statement["Condition"]["StringEquals"]["ec2:CreateAction"] == "RunInstances", statement["Sid"]


def test_placeholders_appear_and_fill_into_arns():
    text = POLICY_FILE.read_text(encoding="utf-8")
    for placeholder in PLACEHOLDERS:
        assert placeholder in text, placeholder
    filled = (text.replace("CLUSTER_NAME", "prod").replace("WORKER_LAUNCH_TEMPLATE_ID", "lt-0123456789abcdef0")
              .replace("WORKER_SPOT_LAUNCH_TEMPLATE_ID", "lt-0123456789abcdef1")
              .replace("ACCOUNT_ID", "123456789012").replace("REGION", "us-west-2"))
    arns = re.findall(r'"(arn:[^"]*)"', filled)
    assert arns
    for arn in arns:
        assert re.fullmatch(r"arn:aws:ec2:us-west-2:(123456789012)?:[a-z-]+/(\*|lt-[0-9a-f]+)", arn), arn
    documented = (IAM / "README.md").read_text(encoding="utf-8")
    for placeholder in PLACEHOLDERS:
        assert f"`{placeholder}`" in documented, placeholder


def _reconcile_files():
    """The files a reconcile pass runs: reconcile.yml, the playbooks it imports, the
    role task files they use, the task files those import, and the node roles."""
    todo, seen = [ROOT / "playbooks" / "reconcile.yml"], set()
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        text = path.read_text(encoding="utf-8")
        todo += [ROOT / "playbooks" / f"{n}.yml" for n in re.findall(r"import_playbook: dynatrain\.elastic\.(\w+)", text)]
        todo += [ROOT / "roles" / role / "tasks" / name
                 for role, name in re.findall(r"name: dynatrain\.elastic\.(\w+)\s+tasks_from: (\S+\.yml)", text)]
        todo += [path.parent / n for n in re.findall(r"import_tasks: (\S+\.yml)", text)]
        for role in re.findall(r"role: dynatrain\.elastic\.(\w+)", text):
            todo += sorted((ROOT / "roles" / role / "tasks").glob("*.yml"))
    return seen


def test_policy_allows_every_call_of_a_reconcile_pass(statements):
    files = _reconcile_files()
    assert ROOT / "playbooks" / "join_workers.yml" in files
    assert ROOT / "roles" / "cluster" / "tasks" / "launch.yml" in files
    modules = set()
    for path in files:
        text = path.read_text(encoding="utf-8")
        modules |= set(re.findall(AWS_MODULE, text, re.M))
    unknown = modules - set(MODULE_ACTIONS)
    assert not unknown, f"AWS modules of the reconcile pass without their IAM actions here: {sorted(unknown)}"
    needed = INVENTORY_ACTIONS.union(*(MODULE_ACTIONS[m] for m in modules))
    allowed = {a for s in statements for a in _actions(s)}
    assert needed - allowed == set()


def test_trust_policy_lets_ec2_assume_the_role():
    trust = _load(TRUST_FILE)
    assert trust["Version"] == "2012-10-17"
    (statement,) = trust["Statement"]
    assert statement["Effect"] == "Allow"
    assert statement["Principal"] == {"Service": "ec2.amazonaws.com"}
    assert statement["Action"] == "sts:AssumeRole"
