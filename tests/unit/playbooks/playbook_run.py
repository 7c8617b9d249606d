"""One home for the ansible-playbook environment of the playbook tests (tests/unit/playbooks/): each test runs a
playbook of this checkout in a subprocess, with the repository's ansible.cfg, and nothing of the caller's
environment may reach it -- no AWS credentials, profile, config file or instance metadata, no ANSIBLE_ or DT_
setting -- so a test sees only what it sets. playbook_env builds that environment, run_playbook runs
ansible-playbook with it, local_inventory writes the local inventory's settings as a static inventory."""
from __future__ import annotations

import os
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.path.dirname(sys.executable)
ANSIBLE_PLAYBOOK = os.path.join(BIN, "ansible-playbook")
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}  # what moto accepts
LOCAL_SETTINGS = os.path.join(ROOT, "inventories", "local", "group_vars", "all", "dynatrain.yml")
LOCALHOST = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}  # this machine, this Python


def playbook_env(tmp_path, credentials=False, **extra):
    """The environment of an ansible-playbook run: os.environ without AWS_, ANSIBLE_ and DT_ variables, the
    repository's ansible.cfg, no color, Ansible's local temporary files under tmp_path, this venv's bin first on
    PATH, and AWS reduced to what the run is given: no config or credentials file (tmp_path/none does not exist),
    no instance metadata; credentials=True: moto's test key (CREDENTIALS). extra: variables set last (over all of
    these), e.g. AWS_MAX_ATTEMPTS="1" or ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json"."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "ANSIBLE_", "DT_"))}
    env.update(ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), PATH=BIN + os.pathsep + os.environ.get("PATH", ""),
               AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"))
    if credentials:
        env.update(CREDENTIALS)
    env.update(extra)
    return env


def run_playbook(inventory, playbook, *extra, env, cwd=ROOT, timeout=300):
    """ansible-playbook -i inventory playbook *extra, run in cwd with env (playbook_env's); the CompletedProcess
    (text output captured; a failed run does not raise, its returncode tells)."""
    return subprocess.run([ANSIBLE_PLAYBOOK, "-i", str(inventory), str(playbook), *extra], cwd=str(cwd), env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def output(proc):
    """What the run printed: stdout, then stderr."""
    return proc.stdout + proc.stderr


def flat_output(proc):
    """What the run printed on one line, each run of white space one blank (a message wrapped by Ansible matches)."""
    return " ".join(output(proc).split())


def local_inventory(path, hosts=None, children=None, **settings):
    """The local inventory's settings (inventories/local/group_vars/all/dynatrain.yml) with settings over them, as
    the vars of a static YAML inventory written to path, whose hosts are hosts (by default localhost: LOCALHOST)
    and whose groups are children; returns path."""
    with open(LOCAL_SETTINGS) as handle:
        variables = yaml.safe_load(handle)
    variables.update(settings)
    doc = {"all": {"vars": variables, "hosts": {"localhost": LOCALHOST} if hosts is None else hosts}}
    if children:
        doc["all"]["children"] = children
    path.write_text(yaml.safe_dump(doc))
    return path
