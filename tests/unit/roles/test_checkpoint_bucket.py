"""roles/checkpoint_bucket main and teardown (issue 27; the cluster role runs both), run with ansible-playbook
against an in-process moto server behind the local cloud's call recorder (localcloud/request_log.py):

- the checkpoint bucket ends versioned, with a lifecycle rule that aborts incomplete multipart
  uploads (and expires old versions), and a bucket policy that denies every request without TLS;
  a second run changes nothing;
- the master's role carries the permissions boundary that files/iam/controller-policy.json
  requires, and its inline policy stays inside files/iam/master-boundary-policy.json;
- every call the role made (Ansible's User-Agent) is allowed by files/iam/controller-policy.json,
  the new ones included (what tests/e2e/test_iam_calls.py proves for a whole run);
- teardown -e delete_checkpoints=true removes every version under the cluster's prefix (a plain
  delete only hides a versioned object), keeps other clusters' objects, and deletes the bucket
  once nothing is left in it;
- checkpoint_policy.json.j2 is built as data: a hostile resume_from (quotes, braces, IAM
  wildcards and policy variables) stays one string and grants exactly its own prefix.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import boto3
import pytest
import yaml
from botocore.config import Config
from botocore.exceptions import ClientError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from localcloud import daemon, moto_compat, request_log  # noqa: E402

ACCOUNT = "123456789012"  # moto's
BUCKET = "dynatrain-checkpoints-" + ACCOUNT
CLUSTER = "ckpt"
ROLE = "dynatrain-%s-master" % CLUSTER
BOUNDARY = "arn:aws:iam::%s:policy/dynatrain-master-boundary" % ACCOUNT
IAM_DOCS = os.path.join(ROOT, "files", "iam")
KEYS = dict(aws_access_key_id="localcloud", aws_secret_access_key="localcloud")


def _doc(name):
    with open(os.path.join(IAM_DOCS, name), encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    moto_compat.apply()
    calls = tmp_path_factory.mktemp("calls") / request_log.FILE_NAME
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = request_log.logging_server("127.0.0.1", port, str(calls))
    server.start()
    endpoint = "http://127.0.0.1:%d" % port
    # the boundary an account's administrator creates once (IAM refuses a role whose boundary is missing)
    # (the mark keeps these calls out of the recorded ones the controller policy is checked against)
    admin = dict(endpoint_url=endpoint, region_name="us-east-1", config=Config(user_agent_extra=request_log.INTERNAL_MARK),
                 **KEYS)
    daemon.ensure_boundary_policy(boto3.client("iam", **admin), boto3.client("sts", **admin))
    yield {"endpoint": endpoint, "calls": str(calls),
           "s3": boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **KEYS,
                              config=Config(s3={"addressing_style": "path"})),
           "iam": boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1", **KEYS)}
    server.stop()


def _play(tmp_path, cloud, tasks_from, **variables):
    aws = {"region": "us-east-1", "endpoint_url": cloud["endpoint"], "access_key": "localcloud",
           "secret_key": "localcloud"}
    play = [{
        "name": "Checkpoints",
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "module_defaults": {"group/amazon.aws.aws": aws, "group/community.aws.aws": aws},
        "tasks": [{
            "name": "Run " + tasks_from,
            "ansible.builtin.include_role": {"name": "dynatrain.elastic.checkpoint_bucket", "tasks_from": tasks_from},
            "vars": dict({"checkpoint_bucket_cluster_name": CLUSTER, "checkpoint_bucket_region": "us-east-1",
                          "checkpoint_bucket_endpoint_url": cloud["endpoint"], "checkpoint_bucket_access_key": "localcloud",
                          "checkpoint_bucket_secret_key": "localcloud",
                          "checkpoint_bucket_tags": {"dynatrain:cluster": CLUSTER}}, **variables),
        }],
    }]
    path = tmp_path / ("%s.yml" % tasks_from)
    path.write_text(yaml.safe_dump(play))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), AWS_MAX_ATTEMPTS="2")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
                           "-e", "ansible_python_interpreter=" + sys.executable, str(path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def _product_calls(cloud):
    return request_log.product_actions(request_log.read(cloud["calls"]))


def _not_allowed(called):
    allowed = request_log.policy_actions(_doc("controller-policy.json"))
    free = set(_doc("controller-policy-coverage.json")["called_not_needed"])
    return sorted(called - allowed - free)


@pytest.fixture(scope="module")
def bootstrapped(cloud, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bootstrap")
    first = _play(tmp, cloud, "main.yml", checkpoint_bucket_resume_from="s3://other-bucket/c0/job/")
    second = _play(tmp, cloud, "main.yml", checkpoint_bucket_resume_from="s3://other-bucket/c0/job/")
    return first, second, _product_calls(cloud)


def test_bucket_is_versioned_expires_uploads_and_refuses_plain_http(cloud, bootstrapped):
    (rc, out), _second, _calls = bootstrapped
    assert rc == 0, out[-3000:]
    s3 = cloud["s3"]
    assert s3.get_bucket_versioning(Bucket=BUCKET)["Status"] == "Enabled"
    (rule,) = [r for r in s3.get_bucket_lifecycle_configuration(Bucket=BUCKET)["Rules"]
               if r["ID"] == "dynatrain-checkpoints"]
    assert rule["Status"] == "Enabled" and rule["Filter"].get("Prefix", "") == ""
    assert rule["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}
    assert rule["NoncurrentVersionExpiration"]["NoncurrentDays"] == 7
    policy = json.loads(s3.get_bucket_policy(Bucket=BUCKET)["Policy"])
    (deny,) = policy["Statement"]
    assert deny["Effect"] == "Deny" and deny["Principal"] == "*" and deny["Action"] == "s3:*"
    assert sorted(deny["Resource"]) == ["arn:aws:s3:::" + BUCKET, "arn:aws:s3:::%s/*" % BUCKET]
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    # what the bucket had before stays
    assert s3.get_public_access_block(Bucket=BUCKET)["PublicAccessBlockConfiguration"]["BlockPublicPolicy"]
    rules = s3.get_bucket_encryption(Bucket=BUCKET)["ServerSideEncryptionConfiguration"]["Rules"]
    assert rules[0]["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"


def test_second_run_changes_nothing(bootstrapped):
    _first, (rc, out), _calls = bootstrapped
    assert rc == 0, out[-3000:]
    assert "changed=0" in out, out[-3000:]


def test_master_role_carries_the_boundary_and_stays_inside_it(cloud, bootstrapped):
    (rc, out), _second, _calls = bootstrapped
    assert rc == 0, out[-3000:]
    role = cloud["iam"].get_role(RoleName=ROLE)["Role"]
    assert role["PermissionsBoundary"]["PermissionsBoundaryArn"] == BOUNDARY
    inline = cloud["iam"].get_role_policy(RoleName=ROLE, PolicyName="checkpoints")["PolicyDocument"]
    inline = json.loads(inline) if isinstance(inline, str) else inline
    boundary = json.loads(json.dumps(_doc("master-boundary-policy.json")).replace("ACCOUNT_ID", ACCOUNT))
    capped = {a for s in boundary["Statement"] for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    own = [s for s in inline["Statement"] if BUCKET in json.dumps(s["Resource"])]
    assert own and all(set([s["Action"]] if isinstance(s["Action"], str) else s["Action"]) <= capped for s in own)


def test_every_call_of_the_role_is_allowed_by_the_controller_policy(bootstrapped):
    (rc, out), _second, called = bootstrapped
    assert rc == 0, out[-3000:]
    assert {"s3:PutBucketVersioning", "s3:PutBucketPolicy", "s3:GetLifecycleConfiguration",
            "s3:PutLifecycleConfiguration", "iam:CreateRole", "iam:PutRolePolicy"} <= called, sorted(called)
    assert _not_allowed(called) == []


def test_teardown_deletes_every_version_of_the_cluster_and_the_bucket_once_empty(cloud, bootstrapped, tmp_path):
    assert bootstrapped[0][0] == 0, bootstrapped[0][1][-3000:]
    s3 = cloud["s3"]
    for body in (b"1", b"2"):  # two versions, then a delete marker: a plain listing shows nothing
        s3.put_object(Bucket=BUCKET, Key=CLUSTER + "/job/LATEST.json", Body=body)
    s3.delete_object(Bucket=BUCKET, Key=CLUSTER + "/job/LATEST.json")
    s3.put_object(Bucket=BUCKET, Key=CLUSTER + "/job/events.jsonl", Body=b"{}")
    s3.put_object(Bucket=BUCKET, Key="other/job/LATEST.json", Body=b"other")

    rc, out = _play(tmp_path, cloud, "teardown.yml", checkpoint_bucket_delete_checkpoints=True)
    assert rc == 0, out[-3000:]
    listed = s3.list_object_versions(Bucket=BUCKET)
    left = [v["Key"] for v in listed.get("Versions", []) + listed.get("DeleteMarkers", [])]
    assert left == ["other/job/LATEST.json"], left
    assert "the bucket is kept" in " ".join(out.split()), out[-3000:]

    s3.delete_object(Bucket=BUCKET, Key="other/job/LATEST.json",
                     VersionId=listed["Versions"][0]["VersionId"])
    rc, out = _play(tmp_path, cloud, "teardown.yml", checkpoint_bucket_delete_checkpoints=True)
    assert rc == 0, out[-3000:]
    assert BUCKET not in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    rc, out = _play(tmp_path, cloud, "teardown.yml", checkpoint_bucket_delete_checkpoints=True)  # nothing left: nothing to do
    assert rc == 0 and "changed=0" in out, out[-3000:]

    called = _product_calls(cloud)
    assert {"s3:ListBucketVersions", "s3:DeleteObject", "s3:DeleteBucket"} <= called, sorted(called)
    assert _not_allowed(called) == []


HOSTILE = [
    "s3://other-bucket/c0/job/",
    's3://b-b/x"},{"Effect":"Allow","Action":"*","Resource":"*"}]}',
    "s3://b-b/job/\"\\'{}]\n",
    "s3://b-b/a*?${aws:username}/",
]


def test_checkpoint_policy_is_data_whatever_resume_from_holds(tmp_path):
    template = os.path.join(ROOT, "roles", "checkpoint_bucket", "templates", "checkpoint_policy.json.j2")
    play = [{
        "name": "Render",
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "vars": {"checkpoint_bucket_s3_bucket": BUCKET, "checkpoint_bucket_cluster_name": CLUSTER},
        "tasks": [{
            "name": "Render the policy",
            "ansible.builtin.copy": {"content": "{{ lookup('ansible.builtin.template', '%s') }}" % template,
                                     "dest": "%s/policy-{{ index }}.json" % tmp_path, "mode": "0600"},
            "loop": "{{ resume_froms }}",
            "loop_control": {"index_var": "index"},
            "vars": {"checkpoint_bucket_resume_from": "{{ item }}"},
        }],
    }]
    path = tmp_path / "render.yml"
    path.write_text(yaml.safe_dump(play))
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps({"resume_froms": HOSTILE}))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
                           "-e", "ansible_python_interpreter=" + sys.executable, "-e", "@%s" % extra, str(path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    for index, resume_from in enumerate(HOSTILE):
        policy = json.loads((tmp_path / ("policy-%d.json" % index)).read_text())
        statements = {s["Sid"]: s for s in policy["Statement"]}
        assert sorted(statements) == ["CopyTheClusterCheckpoints", "ListTheClusterPrefix", "ListTheJobItResumes",
                                      "ReadTheJobItResumes"], (resume_from, policy)
        assert all(s["Effect"] == "Allow" and "*" not in json.dumps(s["Action"]) for s in policy["Statement"])
        assert statements["CopyTheClusterCheckpoints"]["Resource"] == "arn:aws:s3:::%s/%s/*" % (BUCKET, CLUSTER)
        bucket, prefix = resume_from[len("s3://"):].split("/", 1)
        literal = "".join("${%s}" % c if c in "$*?" else c for c in prefix)  # IAM's escapes: exactly this prefix
        assert statements["ReadTheJobItResumes"]["Resource"] == "arn:aws:s3:::%s/%s*" % (bucket, literal)
        assert statements["ListTheJobItResumes"]["Resource"] == "arn:aws:s3:::" + bucket
        assert statements["ListTheJobItResumes"]["Condition"] == {"StringLike": {"s3:prefix": [literal + "*"]}}


def test_a_boundary_that_does_not_exist_is_refused_saying_who_creates_it(cloud, tmp_path):
    """IAM refuses CreateRole with a boundary policy that does not exist (the local cloud too, moto_compat)."""
    with pytest.raises(ClientError) as err:
        cloud["iam"].create_role(RoleName="dt-no-boundary", AssumeRolePolicyDocument="{}",
                                 PermissionsBoundary="arn:aws:iam::%s:policy/not-created" % ACCOUNT)
    assert err.value.response["Error"]["Code"] == "NoSuchEntity"
    rc, out = _play(tmp_path, cloud, "main.yml", checkpoint_bucket_cluster_name="nobound",
                    checkpoint_bucket_permissions_boundary="arn:aws:iam::%s:policy/not-created" % ACCOUNT)
    assert rc != 0 and "created once per account by an administrator" in out, out[-3000:]


def _sts_reads(cloud):
    return sum(1 for c in request_log.read(cloud["calls"]) if c.get("action") == "GetCallerIdentity")


def test_name_takes_the_callers_identity_from_the_play_and_reads_it_only_without(cloud, tmp_path):
    before = _sts_reads(cloud)
    rc, out = _play(tmp_path, cloud, "name.yml",
                    checkpoint_bucket_caller={"account": ACCOUNT, "arn": "arn:aws:iam::%s:user/admin" % ACCOUNT})
    assert rc == 0, out[-3000:]
    assert _sts_reads(cloud) == before                    # preflight's aws_caller_identity: no STS call of its own
    rc, out = _play(tmp_path, cloud, "name.yml")
    assert rc == 0, out[-3000:]
    assert _sts_reads(cloud) == before + 1                # alone, the role reads it
