"""Bad settings are refused by the first task of every root playbook a user types, before any cloud
call: playbooks/tasks/check_settings.yml (plugins/module_utils/preflight.py's settings_problems).

The playbooks run against nothing: the local inventory's settings as a static inventory whose AWS
endpoint is a closed port, so a run that got past the check could create nothing either; each test
checks that the settings check was the last task run. The rules and every message are unit-tested in
tests/unit/plugins/module_utils/test_preflight.py; here each message comes out of the entry point that uses
the setting, typed as a user types it (-e key=value or -e JSON). Also: the training script's
arguments in each form reach the launcher as the same list (train.yml's launcher_script_args)."""
from __future__ import annotations

import json
import os
import re
import socket
import sys

import pytest
import yaml

from playbook_run import ROOT, local_inventory, output, playbook_env, run_playbook

NOTHING = "setting(s) to correct. Nothing was created or changed:"


def closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_inventory(directory):
    """The local inventory's settings, pointed at a closed port (no cloud), localhost only."""
    return local_inventory(directory / "inventory.yml", {"localhost": {"ansible_connection": "local"}},
                           dt_aws_endpoint_url=f"http://127.0.0.1:{closed_port()}", dt_state_dir=str(directory / "state"),
                           ansible_python_interpreter=sys.executable)


@pytest.fixture
def inventory(tmp_path):
    return write_inventory(tmp_path)


def run(tmp_path, inventory, playbook, *extra):
    """The playbook run in the repository root (the root playbooks are named as a user types them)."""
    proc = run_playbook(inventory, playbook, *extra, env=playbook_env(tmp_path, credentials=True))
    return proc.returncode, output(proc)


# Each command is typed as a user types it (-e key=value, or -e JSON) and run once; the check
# reports every problem at once, and each message below is a test of its own.
RUNS = {
    "bootstrap-kv": ("bootstrap.yml", [
        "-e", 'dt_train_script_args=["--epochs", "20"', "-e", "resume_from=s3://my-bucket/dtold",
        "-e", "dt_checkpoint_bucket=My_Checkpoints", "-e", "dt_job_name=run#2", "-e", "dt_vpc_cidr=10.0.0.0/16",
        "-e", "dt_resize_at=batch", "-e", "dt_engine=tensorflow", "-e", "min_workers=abc", "-e", "worker_count=two",
        "-e", "dt_master_lost_timeout=soon", "-e", "dt_root_volume_size=4", "-e", "dt_cluster_name=9lives",
        "-e", "dt_join_timeout=abc"]),
    "bootstrap-json": ("bootstrap.yml", ["-e", json.dumps({
        "dt_train_script_args": "--note 'unclosed", "dt_job_name": "my job", "resume_from": "s3://My_Bucket/dtold/job/",
        "dt_vpc_cidr": "10.77.0.0/8", "dt_subnet_cidr": "10.77.1.0/24", "worker_count": 8})]),
    "bootstrap-gpu": ("bootstrap.yml", ["-e", "dt_engine=mxnet", "-e", "dt_worker_instance_type=p5.48xlarge",
                                        "-e", "dt_master_instance_type=p5en.48xlarge", "-e", "dt_job_name=a b",
                                        "-e", json.dumps({"dt_train_script_args": {"epochs": 20}})]),
    "bootstrap-subnet": ("bootstrap.yml", ["-e", "dt_subnet_cidr=127.77.1.0/30", "-e", "max_workers=0"]),
    "add_workers": ("add_workers.yml", ["-e", "count=1", "-e", "dt_join_timeout=abc", "-e", "dt_engine=mxnet",
                                        "-e", "dt_worker_instance_type=p6-b200.48xlarge"]),
    "remove_workers": ("remove_workers.yml", ["-e", "count=1", "-e", "min_workers=abc", "-e", "dt_leave_timeout=0"]),
    "reconcile": ("reconcile.yml", ["-e", "dt_join_timeout=abc", "-e", "dt_desired_workers=many"]),
    "train": ("train.yml", ["-e", "train_fresh=true", "-e", "dt_job_name=new#job", "-e", "dt_resize_at=batch",
                            "-e", 'dt_train_script_args=["--epochs",']),
    "bake_image": ("bake_image.yml", ["-e", "dt_bake_instance_type=p5.48xlarge"]),
    "preflight": ("preflight.yml", ["-e", "dt_engine=jax"]),
    "job_array": ("job_array.yml", ["-e", "manifest=jobs.csv", "-e", "job_timeout=abc", "-e", "max_parallel=0",
                                    "-e", "dt_checkpoint_bucket=Bad_Bucket"]),
    # the rows get array_vars: a bad one is refused once, before the array exists
    "job_array-vars": ("job_array.yml", ["-e", "manifest=jobs.csv", "-e", json.dumps(
        {"array_vars": {"dt_train_script_args": "[x", "dt_engine": "tf", "dt_vpc_cidr": "rows-set-their-own"}})]),
    "run_job": ("playbooks/run_job.yml", ["-e", "job_vars_file=job.json", "-e", "result_timeout=abc",
                                          "-e", "job_poll=0"]),
}

MESSAGES = [
    ("bootstrap-kv", "dt_train_script_args=[\"--epochs\", \"20\" starts with '[' but is not a JSON list: write the "
                     "list as JSON, e.g. -e '{\"dt_train_script_args\": [\"--epochs\", \"20\"]}'"),
    ("bootstrap-kv", "resume_from=s3://my-bucket/dtold is not an S3 job prefix: give the job's prefix as status.yml "
                     "of the old cluster printed it: -e resume_from=s3://<bucket>/<cluster>/<job>/."),
    ("bootstrap-kv", "dt_checkpoint_bucket=My_Checkpoints is not a valid bucket name: an S3 bucket name has 3 to 63 "
                     "lower-case letters"),
    ("bootstrap-kv", "Pass e.g. -e dt_checkpoint_bucket=my-checkpoints, or leave it empty"),
    ("bootstrap-kv", "dt_job_name='run#2' is not valid: use only letters, digits, '.', '_' and '-'"),
    ("bootstrap-kv", "e.g. -e dt_job_name=run-2."),
    ("bootstrap-kv", "dt_subnet_cidr=127.77.1.0/24 is not inside dt_vpc_cidr=10.0.0.0/16: pass a subnet of it, "
                     "e.g. -e dt_subnet_cidr=10.0.0.0/24."),
    ("bootstrap-kv", "dt_resize_at=batch is not valid: pass -e dt_resize_at=step"),
    ("bootstrap-kv", "dt_engine=tensorflow is not an engine: pass -e dt_engine=mxnet (Apache MXNet 1.9.1, the "
                     "default) or -e dt_engine=torch (PyTorch)."),
    ("bootstrap-kv", "min_workers=abc is not valid (workers the job keeps, the master counted): give a whole "
                     "number >= 1, e.g. -e min_workers=1."),
    ("bootstrap-kv", "worker_count=two is not valid (base workers besides the master): give a whole number >= 0"),
    ("bootstrap-kv", "dt_master_lost_timeout=soon is not valid"),
    ("bootstrap-kv", "dt_root_volume_size=4 is not valid (GiB of each node's root volume): it must be at least 8"),
    ("bootstrap-kv", "dt_cluster_name=9lives is not valid"),
    ("bootstrap-kv", "dt_join_timeout=abc is not valid (seconds to wait for the launcher's ADDED): give a "
                     "whole number >= 1, e.g. -e dt_join_timeout=600."),
    ("bootstrap-kv", "13 setting(s) to correct"),
    ("bootstrap-json", "dt_train_script_args=--note 'unclosed cannot be split like a shell line (No closing quotation)"),
    ("bootstrap-json", "dt_job_name='my job' is not valid"),
    ("bootstrap-json", "e.g. -e dt_job_name=my-job."),
    ("bootstrap-json", "resume_from=s3://My_Bucket/dtold/job/: the bucket 'My_Bucket' is not valid"),
    ("bootstrap-json", "dt_vpc_cidr=10.77.0.0/8 has host bits set: pass its network, -e dt_vpc_cidr=10.0.0.0/8."),
    ("bootstrap-json", "worker_count=8 is more than max_workers=8 allows (it counts the master too): pass at most "
                       "-e worker_count=7"),
    ("bootstrap-gpu", "dt_engine=mxnet cannot use dt_worker_instance_type=p5.48xlarge: its GPUs are H100 (hopper), "
                      "and MXNet 1.9.1's newest GPU build (mxnet-cu117) carries kernels for sm_50/60/70/80/86 only, "
                      "without PTX; pass -e dt_engine=torch"),
    ("bootstrap-gpu", "dt_engine=mxnet cannot use dt_master_instance_type=p5en.48xlarge: its GPUs are H200 (hopper)"),
    ("bootstrap-gpu", "-e 'dt_job_name=a b': Ansible's key=value form ends a value at a space, so 'b' would be "
                      "dropped (or made a variable of its own): quote a value with spaces inside the -e, "
                      "e.g. -e 'dt_job_name=\"a b\"'"),
    ("bootstrap-gpu", "dt_train_script_args is {'epochs': 20} (a mapping): give the script's arguments as a list"),
    ("bootstrap-subnet", "dt_subnet_cidr=127.77.1.0/30 is too small: it must be an IPv4 network of /16 or smaller, "
                         "down to /28 (AWS's limits), e.g. -e dt_subnet_cidr=127.77.1.0/28."),
    ("bootstrap-subnet", "max_workers=0 is not valid (workers the job may have, the master counted): it must be at least 1"),
    ("add_workers", "dt_join_timeout=abc is not valid (seconds to wait for the launcher's ADDED)"),
    ("add_workers", "dt_engine=mxnet cannot use dt_worker_instance_type=p6-b200.48xlarge: its GPUs are B200 "
                    "(blackwell)"),
    ("remove_workers", "min_workers=abc is not valid"),
    ("remove_workers", "dt_leave_timeout=0 is not valid (seconds to wait for the launcher's REMOVED): it must be "
                       "at least 1, e.g. -e dt_leave_timeout=600."),
    ("reconcile", "dt_join_timeout=abc is not valid"),
    ("reconcile", "dt_desired_workers=many is not valid"),
    ("train", "dt_job_name='new#job' is not valid"),
    ("train", "dt_resize_at=batch is not valid"),
    ("train", "dt_train_script_args=[\"--epochs\", starts with '[' but is not a JSON list"),
    ("bake_image", "dt_engine=mxnet cannot use dt_bake_instance_type=p5.48xlarge"),
    ("preflight", "dt_engine=jax is not an engine"),
    ("job_array", "job_timeout=abc is not valid (seconds a job may train)"),
    ("job_array", "max_parallel=0 is not valid (rows that run at once in a region): it must be at least 1"),
    ("job_array", "dt_checkpoint_bucket=Bad_Bucket is not a valid bucket name"),
    ("job_array-vars", "dt_train_script_args=[x starts with '['"),
    ("job_array-vars", "dt_engine=tf is not an engine"),
    ("job_array-vars", "2 setting(s) to correct"),  # not dt_vpc_cidr: the rows set their own
    ("run_job", "result_timeout=abc is not valid"),
    ("run_job", "job_poll=0 is not valid (seconds between two reads of the job): it must be at least 1"),
]


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    """Each of RUNS once (on first use): (rc, output, its directory)."""
    done = {}

    def get(key):
        if key not in done:
            directory = tmp_path_factory.mktemp(key)
            playbook, extra = RUNS[key]
            done[key] = run(directory, write_inventory(directory), playbook, *extra) + (directory,)
        return done[key]
    return get


def test_every_run_has_messages():
    assert {key for key, _message in MESSAGES} == set(RUNS)


@pytest.mark.parametrize("key, message", MESSAGES, ids=[f"{k}-{m[:48]}" for k, m in MESSAGES])
def test_refused_before_anything_with_what_to_type(refused, key, message):
    rc, out, directory = refused(key)
    flat = " ".join(out.split())
    assert rc != 0, out[-3000:]
    assert NOTHING in flat and message in flat, out[-3000:]
    tasks = re.findall(r"^TASK \[([^\]]*)\]", out, flags=re.M)
    assert tasks and tasks[-1] == "Check the settings", tasks  # nothing after it ran
    # only add_workers' own checks of its request ran before it
    assert not set(tasks) - {"Check the settings", "Check count", "Check count against max_workers",
                             "Check dt_worker_market and dt_spot_fallback"}, tasks
    assert not (directory / "state").exists()  # no cluster state, no array


# -- dt_engine=mxnet on GPUs it has no kernels for ----------------------------------------------------
def test_bootstrap_defers_an_untyped_engine_to_the_cluster(tmp_path, inventory):
    """Without -e dt_engine, bootstrap and add_workers take the engine of the cluster's job (a torch cluster
    stays torch): the first check leaves the instance types alone (here the run goes on to the AWS calls,
    which the closed port refuses); tasks/cluster_engine.yml checks them once the engine is known."""
    rc, out = run(tmp_path, inventory, "bootstrap.yml", "-e", "dt_worker_instance_type=p5.48xlarge")
    assert rc != 0 and "No usable AWS credentials" in out, out[-3000:]
    assert "cannot use dt_worker_instance_type" not in out


@pytest.mark.parametrize("extra, master, refused", [
    ([], "p5.48xlarge", "mxnet"),                        # a new cluster (no job): dt_engine, default mxnet
    (["-e", "dt_engine=mxnet"], "p5.48xlarge", "mxnet"),
    (["-e", "dt_engine=torch"], "p5.48xlarge", None),
    (["-e", "dt_engine=torch"], "c5.xlarge", "mixed"),    # a CPU master with GPU workers (issue 40, item 6)
], ids=["default", "mxnet", "torch", "torch-mixed"])
def test_the_engine_taken_is_checked_before_anything_is_launched(tmp_path, inventory, extra, master, refused):
    play = [{"name": "Take the cluster's engine", "hosts": "localhost", "gather_facts": False,
             "vars": {"dt_worker_instance_type": "p5.48xlarge", "dt_master_instance_type": master},
             "tasks": [{"name": "Keep the cluster's engine", "ansible.builtin.include_tasks":
                        os.path.join(ROOT, "playbooks", "tasks", "cluster_engine.yml"),
                        "vars": {"_dt_engine_sources": []}}]}]
    path = tmp_path / "engine.yml"
    path.write_text(yaml.safe_dump(play))
    rc, out = run(tmp_path, inventory, str(path), *extra)
    flat = " ".join(out.split())
    if refused:
        assert rc != 0, out[-3000:]
        said = {"mxnet": "dt_engine=mxnet cannot use dt_worker_instance_type=p5.48xlarge: its GPUs are H100 (hopper)",
                "mixed": "dt_engine=torch cannot train on dt_master_instance_type=c5.xlarge (no GPU) with "
                         "dt_worker_instance_type=p5.48xlarge (H100 GPUs)"}[refused]
        assert said in flat and "Nothing was created or changed." in flat, out[-3000:]
        assert re.findall(r"^TASK \[([^\]]*)\]", out, flags=re.M)[-1] == "Check that the engine has kernels for the instance types"
    else:
        assert rc == 0, out[-3000:]


# -- the training script's arguments: the list the launcher gets -------------------------------------
def launcher_script_args_expression():
    """The launcher_script_args train.yml gives the launcher: the node mapping's (playbooks/vars/nodes.yml, a
    vars_files of the play that brings the launcher up), which no include of the launcher re-maps."""
    with open(os.path.join(ROOT, "playbooks", "train.yml")) as handle:
        plays = yaml.safe_load(handle)
    up = [play for play in plays for task in play.get("tasks", [])
          if task.get("ansible.builtin.include_role", {}).get("name") == "dynatrain.elastic.launcher"
          and "tasks_from" not in task["ansible.builtin.include_role"]]
    assert len(up) == 1 and up[0].get("vars_files") == ["vars/nodes.yml"], up
    remapped = [task["name"] for play in plays for task in play.get("tasks", [])
                if "launcher_script_args" in task.get("vars", {})]
    assert remapped == [], remapped
    with open(os.path.join(ROOT, "playbooks", "vars", "nodes.yml")) as handle:
        return yaml.safe_load(handle)["launcher_script_args"]


@pytest.mark.parametrize("extra, expected", [
    (["-e", json.dumps({"dt_train_script_args": ["--epochs", "20"]})], ["--epochs", "20"]),
    (["-e", json.dumps({"dt_train_script_args": ["--epochs", 20, "--lr", 0.1]})], ["--epochs", "20", "--lr", "0.1"]),
    (["-e", 'dt_train_script_args=["--epochs","20"]'], ["--epochs", "20"]),
    (["-e", 'dt_train_script_args=["--epochs", "20"]'], ["--epochs", "20"]),
    (["-e", "dt_train_script_args=--epochs 20 --lr 0.1"], ["--epochs", "20", "--lr", "0.1"]),
    (["-e", "dt_train_script_args=--epochs 20 --lr=0.1"], ["--epochs", "20", "--lr=0.1"]),
    (["-e", "dt_train_script_args='--epochs 20 --note \"a b\"'"], ["--epochs", "20", "--note", "a b"]),
    (["-e", json.dumps({"dt_train_script_args": "--epochs 20 --lr 0.1"})], ["--epochs", "20", "--lr", "0.1"]),
    ([], ["--epochs", "10"]),  # the inventory's list
], ids=["json-list", "json-numbers", "kv-json-list", "kv-json-list-spaced", "kv-line", "kv-line-equals",
        "kv-quoted-line", "json-line", "inventory"])
def test_each_form_reaches_the_launcher_as_one_list(tmp_path, inventory, extra, expected):
    play = [{"name": "Show what train.yml gives the launcher", "hosts": "localhost", "gather_facts": False,
             "tasks": [{"name": "Check the settings", "ansible.builtin.import_tasks":
                        os.path.join(ROOT, "playbooks", "tasks", "check_settings.yml")},
                       {"name": "Show", "ansible.builtin.debug": {
                           "msg": "ARGS={{ (" + launcher_script_args_expression().strip()[2:-2] + ") | to_json }}"}}]}]
    path = tmp_path / "show.yml"
    path.write_text(yaml.safe_dump(play))
    rc, out = run(tmp_path, inventory, str(path), *extra)
    assert rc == 0, out[-3000:]
    shown = re.search(r"ARGS=(\[.*\])", out).group(1)
    assert json.loads(shown.replace("\\\"", "\"")) == expected, out[-2000:]
