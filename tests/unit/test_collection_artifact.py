"""`ansible-galaxy collection build` makes an installable artifact whose
plugins, roles and playbooks resolve by FQCN (as the README shows)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)


def _run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=300, check=False, **kw)


def test_build_install_and_use_by_fqcn(tmp_path):
    # a clean environment, away from the checkout's ansible.cfg: only the
    # installed copy can answer
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    (tmp_path / "empty.cfg").write_text("[defaults]\n")
    env["ANSIBLE_CONFIG"] = str(tmp_path / "empty.cfg")
    out = tmp_path / "dist"
    built = _run([os.path.join(BIN, "ansible-galaxy"), "collection", "build", "--output-path", str(out), ROOT])
    assert built.returncode == 0, built.stderr
    (artifact,) = list(out.glob("dynatrain-elastic-*.tar.gz"))

    dest = tmp_path / "collections"
    installed = _run([os.path.join(BIN, "ansible-galaxy"), "collection", "install", "--no-deps", "--offline",
                      "-p", str(dest), str(artifact)], env=env, cwd=str(tmp_path))
    assert installed.returncode == 0, installed.stderr
    coll = dest / "ansible_collections" / "dynatrain" / "elastic"
    assert (coll / "plugins" / "modules" / "host_worker.py").is_file()
    assert not (coll / ".venv").exists() and not (coll / ".localcloud").exists()

    env["ANSIBLE_COLLECTIONS_PATH"] = str(dest)
    doc = _run([os.path.join(BIN, "ansible-doc"), "dynatrain.elastic.host_worker"], env=env, cwd=str(tmp_path))
    assert doc.returncode == 0 and "host_worker_log" in doc.stdout, doc.stderr
    inv = _run([os.path.join(BIN, "ansible-doc"), "-t", "inventory", "dynatrain.elastic.ec2_elastic"],
               env=env, cwd=str(tmp_path))
    assert inv.returncode == 0 and "dt_master" in inv.stdout, inv.stderr
    syntax = _run([os.path.join(BIN, "ansible-playbook"), "--syntax-check", "-i", "localhost,",
                   "dynatrain.elastic.teardown"], env=env, cwd=str(tmp_path))
    assert syntax.returncode == 0, syntax.stdout + syntax.stderr
