"""Run the host_worker integration target (tests/integration/targets/host_worker) with ansible-playbook.

check -> apply (changed) -> again (not changed) -> check again (not changed) for create, add and
remove; wait with a fake launcher; failure cases with ignore_errors. Local connection, temp dir.
"""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
PLAYBOOK = os.path.join(ROOT, "tests", "integration", "targets", "host_worker", "playbook.yml")


def _ansible_playbook():
    for candidate in (os.path.join(ROOT, ".venv", "bin", "ansible-playbook"),
                      os.path.join(os.path.dirname(sys.executable), "ansible-playbook")):
        if os.path.exists(candidate):
            return candidate
    pytest.skip("ansible-playbook not found (run `make setup`)")


@pytest.mark.integration
def test_host_worker_playbook(tmp_path):
    env = dict(os.environ)
    env.update(
        ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "local_tmp"),
        ANSIBLE_ASYNC_DIR=str(tmp_path / "async"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
    )
    proc = subprocess.run(
        [_ansible_playbook(), "-i", "localhost,", PLAYBOOK],
        cwd=ROOT, env=env, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300,
        universal_newlines=True,
    )
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert "failed=0" in proc.stdout
