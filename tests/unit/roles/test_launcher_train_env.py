"""roles/launcher train_env.yml (issue 27): the training job's secrets (dt_train_env) go into one
root-owned 0600 file that systemd reads for the launcher (EnvironmentFile=), never into the launcher's
settings file, its command line or Ansible's output. Run with ansible-playbook against localhost
(the file under tmp_path instead of /etc/dynatrain)."""
from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ROLE = os.path.join(ROOT, "roles", "launcher")
SECRETS = {
    "HF_TOKEN": "hf_Secret'Quote\"Double$HOME`id`\\back slash",
    "WANDB_API_KEY": "line one\nline two  ",
    "DB_PASSWORD": "p@ss word;rm -rf /",
}


def _run(tmp_path, train_env, *options):
    play = [{
        "name": "Training environment",
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "tasks": [{
            "name": "Write it",
            "ansible.builtin.include_role": {"name": "dynatrain.elastic.launcher", "tasks_from": "train_env.yml"},
            "vars": {"launcher_train_env": ("{{ lookup('ansible.builtin.file', '%s') | from_json }}"
                                            % (tmp_path / "secrets.json")),
                     "launcher_train_env_file": str(tmp_path / "etc" / "train.env")},
        }],
    }]
    (tmp_path / "secrets.json").write_text(json.dumps(train_env))
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump(play))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    # as root already: no sudo here (the variable wins over the tasks' become keyword)
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
                           "-e", "ansible_python_interpreter=" + sys.executable, "-e", "ansible_become=false",
                           *options, str(path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
                          check=False)
    return proc.returncode, proc.stdout + proc.stderr


def _sourced(path):
    """The variables a shell gets from the file (set -a; . file), as the runner or a node would."""
    script = "set -a; . \"$1\"; exec \"$2\" -c 'import json, os; print(json.dumps(dict(os.environ)))'"
    out = subprocess.run(["sh", "-c", script, "sh", str(path), sys.executable], capture_output=True, text=True,
                         env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, check=True).stdout
    return json.loads(out)


@pytest.mark.skipif(os.geteuid() != 0, reason="writes a root-owned file")
def test_secrets_land_root_owned_0600_and_never_in_the_output(tmp_path):
    rc, out = _run(tmp_path, SECRETS, "-vvv", "--diff")
    assert rc == 0, out[-3000:]
    for value in SECRETS.values():
        for fragment in value.split("\n"):
            assert fragment.strip() not in out, fragment
    path = tmp_path / "etc" / "train.env"
    info = path.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == 0 and info.st_gid == 0
    sourced = _sourced(path)
    for name, value in SECRETS.items():
        assert sourced[name] == value, name
    # the names alone, for the launcher to hand them to the processes it starts on other nodes
    assert sourced["DT_TRAIN_ENV_NAMES"].split() == sorted(SECRETS)
    rc, out = _run(tmp_path, SECRETS)  # a second run changes nothing
    assert rc == 0 and "changed=0" in out, out[-3000:]
    rc, out = _run(tmp_path, {})  # a secret removed from dt_train_env leaves the node too
    assert rc == 0, out[-3000:]
    assert not set(SECRETS) & set(_sourced(path)) and _sourced(path)["DT_TRAIN_ENV_NAMES"] == ""


@pytest.mark.parametrize("name", ["DT_MASTER_IP", "WORLD_SIZE", "1TOKEN", "MY-TOKEN", "DMLC_ROLE"])
def test_bad_or_reserved_names_are_refused_by_name_only(tmp_path, name):
    rc, out = _run(tmp_path, {name: "value-that-must-not-show", "OK_TOKEN": "x"})
    assert rc != 0
    assert name in out and "dt_train_env" in out, out[-3000:]
    assert "value-that-must-not-show" not in out
    assert not (tmp_path / "etc" / "train.env").exists()


def test_the_launcher_reads_the_file_and_nothing_else_carries_the_secrets():
    unit = open(os.path.join(ROLE, "templates", "dynatrain-launcher.service.j2"), encoding="utf-8").read()
    assert "EnvironmentFile=-{{ launcher_train_env_file }}" in unit
    # the settings file (0644), the runner's command line and the sync service never see them
    for name in ("dynatrain-launcher.default.j2", "dynatrain-launcher-run.sh.j2",
                 "dynatrain-checkpoint-sync.default.j2", "dynatrain-checkpoint-sync.service.j2"):
        text = open(os.path.join(ROLE, "templates", name), encoding="utf-8").read()
        assert "train_env" not in text, name
    # every task that handles the values hides its result
    users = []
    for name in os.listdir(os.path.join(ROLE, "tasks")):
        for task in yaml.safe_load(open(os.path.join(ROLE, "tasks", name), encoding="utf-8")) or []:
            handled = json.dumps({k: v for k, v in task.items() if k not in ("vars", "name")})
            if (re.search(r"launcher_train_env(?!_file)", handled) or "dynatrain-train.env.j2" in handled) \
                    and "ansible.builtin.assert" not in task:
                users.append((name, task.get("name")))
                assert task.get("no_log") is True, (name, task.get("name"))
    # train_env.yml writes the file; plan.yml hands it to node_apply (a baked worker), which logs no file content
    assert sorted(users) == [("plan.yml", "Plan the training environment (on the controller; the secrets are not logged)"),
                             ("train_env.yml", "Write the training environment (root-owned 0600, never logged)")], users
    specs = yaml.safe_load(open(os.path.join(ROLE, "meta", "argument_specs.yml"), encoding="utf-8"))
    assert specs["argument_specs"]["main"]["options"]["launcher_train_env"]["no_log"] is True
