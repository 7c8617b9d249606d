"""roles/launcher install.yml (issue 27, path 1): the node runtime a node installs as root is the controller's
wheel, pinned by its sha256 and copied from the controller, never the newest wheel of the shared volume's
wheelhouse, which any node can write. Run with ansible-playbook against localhost into a fresh venv."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CONTROLLER_WHEELHOUSE = os.path.join(ROOT, ".localcloud", "wheelhouse")
EVIL_VERSION = "9.9.9"


def runtime_wheel():
    found = glob.glob(os.path.join(CONTROLLER_WHEELHOUSE, "dynatrain_runtime-*.whl"))
    if not found:
        pytest.skip("no runtime wheel: make runtime builds it")
    return found[0]


def evil_wheel(directory):
    """A runtime wheel of a higher version that any node could drop into the shared wheelhouse."""
    name = f"dynatrain_runtime-{EVIL_VERSION}-py3-none-any.whl"
    dist = f"dynatrain_runtime-{EVIL_VERSION}.dist-info"
    with zipfile.ZipFile(os.path.join(directory, name), "w") as zf:
        zf.writestr("dynatrain_runtime/__init__.py", "__version__ = 'evil'\n")
        zf.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: dynatrain-runtime\nVersion: {EVIL_VERSION}\n")
        zf.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}/RECORD", "")
    return name


def install(tmp_path, **settings):
    play = [{"name": "Runtime", "hosts": "localhost", "connection": "local", "gather_facts": False,
             "tasks": [{"name": "Install it",
                        "ansible.builtin.include_role": {"name": "dynatrain.elastic.launcher",
                                                         "tasks_from": "install.yml"},
                        "vars": settings}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
                           "-e", "ansible_python_interpreter=" + sys.executable, "-e", "ansible_become=false",
                           str(tmp_path / "play.yml")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def installed_version(venv):
    code = "import importlib.metadata as m; print(m.version('dynatrain-runtime'))"
    return subprocess.run([os.path.join(venv, "bin", "python"), "-c", code], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


@pytest.fixture
def node(tmp_path):
    wheel = runtime_wheel()
    controller, shared = tmp_path / "controller", tmp_path / "efs-wheelhouse"
    controller.mkdir()
    shared.mkdir()
    shutil.copy(wheel, controller)
    shutil.copy(wheel, shared)
    evil_wheel(str(shared))                       # newest by name and by mtime
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    settings = {"launcher_venv": str(venv), "launcher_wheelhouse_dir": str(shared),
                "launcher_install_dir": str(tmp_path / "bin"), "launcher_runtime_wheel_dir": str(tmp_path / "rw"),
                "_launcher_python_stat": {"stat": {"exists": True}}}
    return tmp_path, settings, os.path.basename(wheel)


@pytest.mark.skipif(os.geteuid() != 0, reason="writes root-owned files")
def test_the_controllers_wheel_is_installed_pinned_not_the_shared_volumes_newest(node):
    tmp_path, settings, wheel = node
    settings = dict(settings, launcher_runtime_controller_dir=str(tmp_path / "controller"))
    rc, out = install(tmp_path, **settings)
    assert rc == 0, out[-3000:]
    want = wheel.split("-")[1]
    assert installed_version(settings["launcher_venv"]) == want
    lock = (tmp_path / "rw" / "requirements.txt").read_text()
    assert lock.startswith(f"dynatrain-runtime=={want} --hash=sha256:") and EVIL_VERSION not in lock
    assert sorted(os.listdir(tmp_path / "rw")) == sorted([wheel, "requirements.txt"])
    rc, out = install(tmp_path, **settings)                     # idempotent
    assert rc == 0 and "changed=0" in out, out[-3000:]
