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
import yaml

from ansible_collections.dynatrain.elastic.plugins.module_utils.tags import CLUSTER as CLUSTER_TAG

ROOT = Path(__file__).resolve().parents[2]
IAM = ROOT / "files" / "iam"
POLICY_FILE = IAM / "dynatrain-reconcile-policy.json"
TRUST_FILE = IAM / "ec2-assume-role-trust.json"

PLACEHOLDERS = ("CLUSTER_NAME", "REGION", "ACCOUNT_ID", "WORKER_LAUNCH_TEMPLATE_ID", "WORKER_SPOT_LAUNCH_TEMPLATE_ID")
MUTATING = re.compile(r"^[a-z0-9-]+:(Create|Delete|Terminate|Run|Modify|Attach|Detach|Put|Associate|"
                      r"Disassociate|Start|Stop|Reboot|Update|Replace|Authorize|Revoke)")

# amazon.aws.ec2_instance's state -> the call it makes beyond MODULE_ACTIONS
STATE_ACTIONS = {"stopped": "ec2:StopInstances", "running": "ec2:StartInstances"}
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
    "dynatrain.elastic.ec2_pool_take": {"ec2:CreateTags", "ec2:DeleteTags", "ec2:DescribeInstances",
                                        "ec2:StartInstances"},
    # RunInstances tags by the call (ec2:CreateTags under ec2:CreateAction=RunInstances)
    "dynatrain.elastic.ec2_launch": {"ec2:RunInstances", "ec2:CreateTags", "ec2:DescribeInstances"},
    "dynatrain.elastic.ec2_status_checks": {"ec2:DescribeInstanceStatus"},
    "dynatrain.elastic.preflight_az": {"ec2:DescribeAvailabilityZones", "ec2:DescribeInstanceTypeOfferings"},
    "dynatrain.elastic.preflight_vcpu": {"ec2:DescribeInstances", "ec2:DescribeInstanceTypes",
                                         "servicequotas:GetServiceQuota"},
    "community.aws.efs_info": {"elasticfilesystem:DescribeFileSystems", "elasticfilesystem:DescribeTags",
                               "elasticfilesystem:DescribeMountTargets",
                               "elasticfilesystem:DescribeMountTargetSecurityGroups"},
}
# plugins/inventory/ec2_elastic.py: one DescribeInstances per region, one batched DescribeInstanceTypes.
# A task line calling an AWS module: amazon.aws / community.aws, or one of ours that calls AWS.
AWS_MODULE = r"^\s*((?:amazon|community)\.aws\.\w+|dynatrain\.elastic\.(?:host_key_check|preflight_\w+|ec2_\w+)):"
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
        # an include without tasks_from enters the role's main
        todo += [ROOT / "roles" / role / "tasks" / (name or "main.yml")
                 for role, name in re.findall(r"name: dynatrain\.elastic\.(\w+)(?:\s+tasks_from: (\S+\.yml))?", text)]
        todo += [path.parent / n for n in re.findall(r"(?:import|include)_tasks: (\S+\.yml)", text)]
        for role in re.findall(r"role: dynatrain\.elastic\.(\w+)", text):
            todo += sorted((ROOT / "roles" / role / "tasks").glob("*.yml"))
    return seen


def _ec2_instance_states(path):
    """The ``state:`` of each amazon.aws.ec2_instance task of a task file that STATE_ACTIONS names."""
    states = []
    for task in re.split(r"\n\s*- name: ", path.read_text(encoding="utf-8")):
        if "amazon.aws.ec2_instance:" in task:
            states += [s for s in re.findall(r"^\s+state: (\w+)$", task, re.M) if s in STATE_ACTIONS]
    return states


def test_policy_allows_every_call_of_a_reconcile_pass(statements):
    files = _reconcile_files()
    assert ROOT / "playbooks" / "join_workers.yml" in files
    assert ROOT / "roles" / "fleet" / "tasks" / "launch.yml" in files
    modules = set()
    for path in files:
        text = path.read_text(encoding="utf-8")
        modules |= set(re.findall(AWS_MODULE, text, re.M))
    unknown = modules - set(MODULE_ACTIONS)
    assert not unknown, f"AWS modules of the reconcile pass without their IAM actions here: {sorted(unknown)}"
    needed = INVENTORY_ACTIONS.union(*(MODULE_ACTIONS[m] for m in modules))
    # ec2_instance's state: stopped (the warm pool's refill) stops, state: running would start
    needed |= {STATE_ACTIONS[state] for path in files for state in _ec2_instance_states(path)}
    assert ROOT / "roles" / "warm_pool" / "tasks" / "park.yml" in files and "ec2:StopInstances" in needed
    allowed = {a for s in statements for a in _actions(s)}
    assert needed - allowed == set()


def test_trust_policy_lets_ec2_assume_the_role():
    trust = _load(TRUST_FILE)
    assert trust["Version"] == "2012-10-17"
    (statement,) = trust["Statement"]
    assert statement["Effect"] == "Allow"
    assert statement["Principal"] == {"Service": "ec2.amazonaws.com"}
    assert statement["Action"] == "sts:AssumeRole"


# --- files/iam/controller-policy.json: the identity that runs every playbook (issue 12) ---
# The proof that it is least privilege is tests/e2e/test_iam_calls.py (the calls the e2e made,
# recorded by the local cloud); these check its shape and the comparison that proof uses.

CONTROLLER_FILE = IAM / "controller-policy.json"
COVERAGE_FILE = IAM / "controller-policy-coverage.json"
# Statements whose mutating action cannot carry a cluster-tag condition, and why (README.md).
UNSCOPED = {
    "RunInstancesWithTheirImageVolumesAndInterfaces",  # created or public resources; the instance needs the tag
    "CreateTheSharedFileSystem",  # community.aws.efs creates untagged and tags after
    "MountTargetInterfaces",  # EFS makes and removes the mount target's interface
}
SERVICE_LINKED = {"elasticfilesystem.amazonaws.com", "spot.amazonaws.com"}
# Issue 14: S3 and IAM take no cluster-tag conditions here; these statements are scoped by their
# resource instead: the cluster's own role, instance profile and prefix, or the account's checkpoint bucket.
SCOPED_BY_RESOURCE = {
    "CheckpointBucketOfTheAccount": ["arn:aws:s3:::dynatrain-checkpoints-ACCOUNT_ID"],
    "DeleteOnlyTheClusterCheckpoints": ["arn:aws:s3:::dynatrain-checkpoints-ACCOUNT_ID/CLUSTER_NAME/*"],
    "MasterRoleOfTheCluster": ["arn:aws:iam::ACCOUNT_ID:role/dynatrain-CLUSTER_NAME-master"],
    "MasterRoleOnlyWithinTheBoundary": ["arn:aws:iam::ACCOUNT_ID:role/dynatrain-CLUSTER_NAME-master"],
    "MasterInstanceProfileOfTheCluster": ["arn:aws:iam::ACCOUNT_ID:instance-profile/dynatrain-CLUSTER_NAME-master"],
    "PassTheMasterRoleToItsInstance": ["arn:aws:iam::ACCOUNT_ID:role/dynatrain-CLUSTER_NAME-master"],
}


def _import_request_log():
    from localcloud import request_log  # the repo root is on sys.path (tests/unit/conftest.py)
    return request_log


# Issue 27: the explicit denies that keep the master's role inside its permissions boundary whatever
# else the identity is granted; nothing else is denied.
DENIES = {"NeverWidenTheMasterRoleOutsideTheBoundary", "NeverRemoveTheBoundaryNorAttachPolicies",
          "NeverEditTheBoundary"}


@pytest.fixture(scope="module")
def controller():
    """The controller policy's grants (its Allow statements)."""
    return [s for s in _load(CONTROLLER_FILE)["Statement"] if s["Effect"] == "Allow"]


def test_controller_policy_has_no_wildcard_action_and_unique_sids(controller):
    assert _load(CONTROLLER_FILE)["Version"] == "2012-10-17"
    everything = _load(CONTROLLER_FILE)["Statement"]
    sids = [s["Sid"] for s in everything]
    assert len(set(sids)) == len(sids), sids
    assert {s["Sid"] for s in everything if s["Effect"] != "Allow"} == DENIES
    for statement in everything:
        assert statement["Effect"] in ("Allow", "Deny")
        assert "NotAction" not in statement and "NotResource" not in statement
        for action in _actions(statement):
            assert "*" not in action, (statement["Sid"], action)


def test_controller_mutations_are_scoped_by_the_cluster_tag(controller):
    scoping = {f"aws:ResourceTag/{CLUSTER_TAG}", f"aws:RequestTag/{CLUSTER_TAG}", "iam:AWSServiceName"}
    for statement in controller:
        if statement["Sid"] in SCOPED_BY_RESOURCE:
            assert _as_list(statement["Resource"]) == SCOPED_BY_RESOURCE[statement["Sid"]], statement["Sid"]
            continue
        if not any(MUTATING.match(a) for a in _actions(statement)) or statement["Sid"] in UNSCOPED:
            continue
        assert _condition_keys(statement) & scoping, statement["Sid"]
        assert "*" not in _as_list(statement["Resource"]), statement["Sid"]
    reads = [s for s in controller if "*" in _as_list(s["Resource"])]
    assert len(reads) == 1
    assert all(a.split(":", 1)[1].startswith(("Describe", "Get")) for a in _actions(reads[0]))


def test_iam_actions_are_service_linked_roles_or_the_clusters_master_role(controller):
    master = [s for s in controller if s["Sid"] in SCOPED_BY_RESOURCE and any(a.startswith("iam:") for a in _actions(s))]
    assert {s["Sid"] for s in master} == {"MasterRoleOfTheCluster", "MasterRoleOnlyWithinTheBoundary",
                                          "MasterInstanceProfileOfTheCluster", "PassTheMasterRoleToItsInstance"}
    (passing,) = [s for s in master if "iam:PassRole" in _actions(s)]
    assert _actions(passing) == ["iam:PassRole"]
    assert passing["Condition"]["StringEquals"]["iam:PassedToService"] == "ec2.amazonaws.com"
    iam = [s for s in controller if any(a.startswith("iam:") for a in _actions(s)) and s not in master]
    assert {s["Condition"]["StringEquals"]["iam:AWSServiceName"] for s in iam} == SERVICE_LINKED
    for statement in iam:
        assert _actions(statement) == ["iam:CreateServiceLinkedRole"]
        service = statement["Condition"]["StringEquals"]["iam:AWSServiceName"]
        assert statement["Resource"].startswith(f"arn:aws:iam::ACCOUNT_ID:role/aws-service-role/{service}/")


def test_cluster_tag_itself_cannot_be_changed_after_creation(controller):
    retag = [s for s in controller if "ec2:DeleteTags" in _actions(s)]
    assert retag
    for statement in retag:
        assert statement["Condition"]["ForAllValues:StringNotEquals"]["aws:TagKeys"] == [CLUSTER_TAG]
    for statement in controller:
        if "ec2:CreateTags" in _actions(statement) and statement not in retag:
            assert "ec2:CreateAction" in statement["Condition"]["StringEquals"], statement["Sid"]


def test_coverage_file_gives_a_reason_for_each_entry_and_readme_names_each_statement(controller):
    coverage = _load(COVERAGE_FILE)
    allowed = _import_request_log().policy_actions(_load(CONTROLLER_FILE))
    for action, why in coverage["allowed_not_exercised_by_the_e2e"].items():
        assert action in allowed and len(why) > 20, action
    for action, why in coverage["called_not_needed"].items():
        assert action not in allowed and len(why) > 20, action
    readme = (IAM / "README.md").read_text(encoding="utf-8")
    for statement in _load(CONTROLLER_FILE)["Statement"]:
        assert f"`{statement['Sid']}`" in readme, statement["Sid"]


def test_comparison_finds_a_missing_grant_an_unused_grant_and_stale_entries():
    compare = _import_request_log().compare
    allowed = {"ec2:RunInstances", "ec2:CreateVpc", "ec2:CreateInternetGateway"}
    assert compare(allowed, {"ec2:RunInstances", "ec2:CreateVpc", "sts:GetCallerIdentity"},
                   {"ec2:CreateInternetGateway": "igw off"}, {"sts:GetCallerIdentity": "free"}) == []
    problems = compare(allowed, {"ec2:RunInstances", "ec2:DeleteVpc"}, {"ec2:CreateInternetGateway": "igw off"})
    assert problems == ["called but not allowed by the policy: ec2:DeleteVpc",
                        "allowed but never called (remove it, or list it as not exercised with why): ec2:CreateVpc"]
    stale = compare(allowed, {"ec2:RunInstances", "ec2:CreateVpc", "ec2:CreateInternetGateway"},
                    {"ec2:CreateInternetGateway": "igw off", "ec2:CreateRoute": "igw off"},
                    {"ec2:CreateVpc": "x", "iam:ListAccountAliases": "y"})
    assert stale == ["listed as not exercised but called: ec2:CreateInternetGateway",
                     "listed as not exercised but not in the policy: ec2:CreateRoute",
                     "listed as not needed but allowed by the policy: ec2:CreateVpc",
                     "listed as not needed but never called: iam:ListAccountAliases"]


def test_product_calls_are_told_from_the_tests_and_the_clouds_own():
    request_log = _import_request_log()
    records = [
        {"iam_action": "ec2:RunInstances", "user_agent": "APN/1.0 Ansible/2.19.4 Boto3/1.40"},
        {"iam_action": "ec2:DescribeKeyPairs", "user_agent": "Boto3/1.40 dynatrain-localcloud"},
        {"iam_action": "ec2:DescribeVpcs", "user_agent": "Boto3/1.40 Botocore/1.40"},
        {"iam_action": None, "user_agent": "Ansible/2.19.4"},
    ]
    assert request_log.product_actions(records) == {"ec2:RunInstances"}
    policy = {"Statement": [{"Effect": "Allow", "Action": "ec2:A"}, {"Effect": "Allow", "Action": ["ec2:B", "ec2:C"]},
                            {"Effect": "Deny", "Action": "ec2:D"}]}
    assert request_log.policy_actions(policy) == {"ec2:A", "ec2:B", "ec2:C"}


# --- issue 27: the controller cannot widen the master's role (a permissions boundary) ---

BOUNDARY_FILE = IAM / "master-boundary-policy.json"
BOUNDARY = "arn:aws:iam::ACCOUNT_ID:policy/dynatrain-master-boundary"
MASTER_ROLE = "arn:aws:iam::ACCOUNT_ID:role/dynatrain-CLUSTER_NAME-master"


def _matches(pattern, value):
    return re.fullmatch(re.escape(pattern).replace(r"\*", ".*").replace(r"\?", "."), value) is not None


def _condition_holds(condition, context):
    """StringEquals / StringNotEquals / StringLike / Bool, as IAM evaluates them (a missing key: the
    positive operators do not hold, StringNotEquals does)."""
    for operator, values in (condition or {}).items():
        for key, expected in values.items():
            expected = _as_list(expected)
            if operator.startswith("ForAllValues:"):
                continue  # tag keys of a request: not part of these scenarios
            actual = context.get(key)
            if operator == "StringNotEquals":
                if actual is not None and actual in expected:
                    return False
            elif actual is None:
                return False
            elif operator in ("StringEquals", "Bool") and actual not in expected:
                return False
            elif operator == "StringLike" and not any(_matches(e, actual) for e in expected):
                return False
    return True


def decide(policy, action, resource, context=None):
    """IAM's decision for one request under one identity policy: 'deny' (explicit), 'allow' or
    'implicit' (no statement allows it)."""
    allowed = False
    for statement in policy["Statement"]:
        if not any(_matches(a, action) for a in _actions(statement)):
            continue
        if not any(_matches(r, resource) for r in _as_list(statement["Resource"])):
            continue
        if not _condition_holds(statement.get("Condition"), context or {}):
            continue
        if statement["Effect"] == "Deny":
            return "deny"
        allowed = True
    return "allow" if allowed else "implicit"


def test_the_evaluator_follows_iam():
    policy = {"Statement": [
        {"Effect": "Allow", "Action": "s3:Get*", "Resource": "arn:aws:s3:::b/*"},
        {"Effect": "Deny", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/secret/*"},
        {"Effect": "Allow", "Action": "iam:PutRolePolicy", "Resource": "r",
         "Condition": {"StringEquals": {"iam:PermissionsBoundary": "p"}}}]}
    assert decide(policy, "s3:GetObject", "arn:aws:s3:::b/x") == "allow"
    assert decide(policy, "s3:GetObject", "arn:aws:s3:::b/secret/x") == "deny"
    assert decide(policy, "s3:PutObject", "arn:aws:s3:::b/x") == "implicit"
    assert decide(policy, "iam:PutRolePolicy", "r", {"iam:PermissionsBoundary": "p"}) == "allow"
    assert decide(policy, "iam:PutRolePolicy", "r", {}) == "implicit"


@pytest.mark.parametrize("action,context,expected", [
    # bootstrap: the role is created, and its inline policy written, only with the boundary on it
    ("iam:CreateRole", {"iam:PermissionsBoundary": BOUNDARY}, "allow"),
    ("iam:PutRolePolicy", {"iam:PermissionsBoundary": BOUNDARY}, "allow"),
    ("iam:PutRolePermissionsBoundary", {"iam:PermissionsBoundary": BOUNDARY}, "allow"),
    # without it, or with another one: refused whatever else the identity holds
    ("iam:CreateRole", {}, "deny"),
    ("iam:PutRolePolicy", {}, "deny"),
    ("iam:PutRolePolicy", {"iam:PermissionsBoundary": "arn:aws:iam::ACCOUNT_ID:policy/AdministratorAccess"}, "deny"),
    ("iam:PutRolePermissionsBoundary", {"iam:PermissionsBoundary": "arn:aws:iam::aws:policy/AdministratorAccess"},
     "deny"),
    # the boundary cannot be taken off, and no managed policy attached
    ("iam:DeleteRolePermissionsBoundary", {"iam:PermissionsBoundary": BOUNDARY}, "deny"),
    ("iam:AttachRolePolicy", {"iam:PermissionsBoundary": BOUNDARY,
                              "iam:PolicyARN": "arn:aws:iam::aws:policy/AdministratorAccess"}, "deny"),
    ("iam:UpdateAssumeRolePolicy", {"iam:PermissionsBoundary": BOUNDARY}, "implicit"),
    # teardown may still delete it
    ("iam:DeleteRolePolicy", {"iam:PermissionsBoundary": BOUNDARY}, "allow"),
    ("iam:DeleteRole", {"iam:PermissionsBoundary": BOUNDARY}, "allow"),
])
def test_the_controller_changes_the_master_role_only_within_its_boundary(action, context, expected):
    assert decide(_load(CONTROLLER_FILE), action, MASTER_ROLE, context) == expected


@pytest.mark.parametrize("action", ["iam:CreatePolicy", "iam:CreatePolicyVersion", "iam:SetDefaultPolicyVersion",
                                    "iam:DeletePolicyVersion", "iam:DeletePolicy"])
def test_the_controller_cannot_write_the_boundary_itself(action):
    assert decide(_load(CONTROLLER_FILE), action, BOUNDARY) == "deny"


def test_no_other_role_or_policy_can_be_created_or_changed():
    policy = _load(CONTROLLER_FILE)
    other = "arn:aws:iam::ACCOUNT_ID:role/anything-else"
    for action in ("iam:CreateRole", "iam:PutRolePolicy", "iam:AttachRolePolicy", "iam:PassRole"):
        assert decide(policy, action, other, {"iam:PermissionsBoundary": BOUNDARY,
                                              "iam:PassedToService": "ec2.amazonaws.com"}) == "implicit", action
    iam = {a for s in policy["Statement"] if s["Effect"] == "Allow" for a in _actions(s) if a.startswith("iam:")}
    assert not iam & {"iam:CreatePolicy", "iam:CreatePolicyVersion", "iam:SetDefaultPolicyVersion",
                      "iam:AttachRolePolicy", "iam:DeleteRolePermissionsBoundary", "iam:UpdateAssumeRolePolicy",
                      "iam:AttachUserPolicy", "iam:PutUserPolicy", "iam:CreateAccessKey"}


def test_the_boundary_allows_only_the_checkpoint_bucket():
    boundary = _load(BOUNDARY_FILE)
    assert boundary["Version"] == "2012-10-17"
    actions = set()
    for statement in boundary["Statement"]:
        assert statement["Effect"] == "Allow" and "NotAction" not in statement and "NotResource" not in statement
        actions |= set(_actions(statement))
        for resource in _as_list(statement["Resource"]):
            assert resource.startswith("arn:aws:s3:::dynatrain-checkpoints-ACCOUNT_ID"), resource
    assert actions == {"s3:PutObject", "s3:GetObject", "s3:DeleteObject", "s3:ListBucket"}
    # the most any policy written into the master's role can do
    for action, resource in [("s3:PutObject", "arn:aws:s3:::dynatrain-checkpoints-ACCOUNT_ID/c/job/x"),
                             ("s3:ListBucket", "arn:aws:s3:::dynatrain-checkpoints-ACCOUNT_ID")]:
        assert decide(boundary, action, resource) == "allow"
    for action, resource in [("ec2:RunInstances", "arn:aws:ec2:REGION:ACCOUNT_ID:instance/i-1"),
                             ("iam:PutRolePolicy", MASTER_ROLE), ("s3:GetObject", "arn:aws:s3:::another-bucket/x"),
                             ("s3:DeleteObjectVersion", "arn:aws:s3:::dynatrain-checkpoints-ACCOUNT_ID/c/x"),
                             ("s3:PutBucketPolicy", "arn:aws:s3:::dynatrain-checkpoints-ACCOUNT_ID")]:
        assert decide(boundary, action, resource) == "implicit", action


def test_the_masters_own_policy_fits_inside_the_boundary():
    """What checkpoint_policy.json.j2 grants (resume_from aside) is inside the boundary, so the boundary
    takes nothing from the master that it needs."""
    template = (ROOT / "roles" / "checkpoint_bucket" / "templates" / "checkpoint_policy.json.j2").read_text(encoding="utf-8")
    own = set(re.findall(r"'(s3:[A-Z][A-Za-z]+)'", template))
    assert own and own <= {a for s in _load(BOUNDARY_FILE)["Statement"] for a in _actions(s)}


def test_bootstrap_sets_the_boundary_on_the_role_it_creates():
    tasks = yaml.safe_load((ROOT / "roles" / "checkpoint_bucket" / "tasks" / "main.yml").read_text(encoding="utf-8"))

    def walk(items):
        for task in items:
            yield task
            for key in ("block", "rescue", "always"):
                yield from walk(task.get(key, []))

    roles = [t["amazon.aws.iam_role"] for t in walk(tasks) if "amazon.aws.iam_role" in t]
    assert roles and all("_checkpoint_bucket_boundary_arn" in r.get("boundary", "") for r in roles)
    default = yaml.safe_load((ROOT / "roles" / "checkpoint_bucket" / "defaults" / "main.yml").read_text(encoding="utf-8"))
    assert default["checkpoint_bucket_permissions_boundary"] == ""
    assert ":policy/dynatrain-master-boundary" in json.dumps(tasks)
