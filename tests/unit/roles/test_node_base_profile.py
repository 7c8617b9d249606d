"""node_base's /etc/profile.d/deeplearning.sh (templates/deeplearning.sh.j2), rendered by Ansible and sourced by
sh: DEEPLEARNING_WORKERS_COUNT is the number of addresses in host_worker when it is read, so it follows every
membership change without a rewrite; '#' comments, blank lines and malformed lines are not hosts (the launcher
skips them too); the count given at configuration time stands in when host_worker cannot be read."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TEMPLATE = os.path.join(ROOT, "roles", "node_base", "templates", "deeplearning.sh.j2")


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    """The rendered file, for a shared volume at <tmp>/efs and a configuration-time count of 7."""
    tmp = tmp_path_factory.mktemp("profile")
    (tmp / "efs").mkdir()
    dest = tmp / "deeplearning.sh"
    extra = {"node_base_efs_mount": str(tmp / "efs"), "node_base_workers_count": 7, "node_base_worker_gpu_count": 2}
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp / "ansible-tmp"))
    proc = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible"), "localhost", "-c", "local", "-i", "localhost,",
         "-e", "ansible_python_interpreter=" + sys.executable, "-e", json.dumps(extra),
         "-m", "ansible.builtin.template", "-a", f"src={TEMPLATE} dest={dest}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return dest


def sourced(profile, name):
    """$name after `. profile` in a POSIX sh (what a login shell does with /etc/profile.d)."""
    return subprocess.run(["sh", "-c", '. "$1" && printf %s "$' + name + '"', "sh", str(profile)],
                          capture_output=True, text=True, timeout=30, check=True).stdout


def write_host_worker(profile, text):
    path = profile.parent / "efs" / "host_worker"
    if text is None:
        if path.exists():
            path.unlink()
    else:
        path.write_text(text)


def test_the_count_is_the_addresses_in_host_worker_now(profile):
    write_host_worker(profile, "127.0.0.2\n127.0.0.1\n")
    assert sourced(profile, "DEEPLEARNING_WORKERS_COUNT") == "2"
    write_host_worker(profile, "127.0.0.3\n127.0.0.2\n127.0.0.4\n127.0.0.1\n")     # a membership change
    assert sourced(profile, "DEEPLEARNING_WORKERS_COUNT") == "4"


def test_comments_blank_and_malformed_lines_are_not_counted(profile):
    write_host_worker(profile, "# added by hand\n127.0.0.2\n\n   \nnot-an-address\n  127.0.0.1  # the master\n")
    assert sourced(profile, "DEEPLEARNING_WORKERS_COUNT") == "2"


def test_an_empty_job_counts_zero(profile):
    write_host_worker(profile, "# nothing yet\n")
    assert sourced(profile, "DEEPLEARNING_WORKERS_COUNT") == "0"


def test_the_configured_count_stands_in_when_host_worker_cannot_be_read(profile):
    write_host_worker(profile, None)
    assert sourced(profile, "DEEPLEARNING_WORKERS_COUNT") == "7"


def test_the_other_names_of_the_contract(profile):
    efs = str(profile.parent / "efs")
    assert sourced(profile, "EFS_MOUNT") == efs
    assert sourced(profile, "DEEPLEARNING_WORKERS_PATH") == efs + "/host_worker"
    assert sourced(profile, "DEEPLEARNING_WORKER_GPU_COUNT") == "2"
