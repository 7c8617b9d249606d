"""`ansible-galaxy collection build` makes an installable artifact whose
plugins, roles and playbooks resolve by FQCN (as the README shows), and that
ships the collection without the dev tooling (galaxy.yml build_ignore)."""
import os
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)

# Top-level entries of the checkout that are dev tooling (DESIGN section 2) and must not ship.
DEV_TOOLING = ("localcloud", "benchmarks", "scripts", ".ci")
# Local state of a checkout that must never ship either.
LOCAL_STATE = (".venv", ".localcloud", ".collections", ".cache", ".ansible", ".pytest_cache", "tests/output")
# ansible-galaxy turns galaxy.yml into MANIFEST.json; it never ships itself.
NOT_COPIED = ("galaxy.yml",)


def _run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=300, check=False, **kw)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    built = _run([os.path.join(BIN, "ansible-galaxy"), "collection", "build", "--output-path", str(out), ROOT])
    assert built.returncode == 0, built.stderr
    (path,) = list(out.glob("dynatrain-elastic-*.tar.gz"))
    return path


@pytest.fixture(scope="module")
def members(artifact):
    with tarfile.open(str(artifact)) as tar:
        return {name.rstrip("/") for name in tar.getnames()}


def _top_level(names):
    return {name.split("/", 1)[0] for name in names}


def _tracked_top_level():
    listed = _run(["git", "-C", ROOT, "ls-files"])
    if listed.returncode != 0 or not listed.stdout.strip():
        pytest.skip("not a git checkout")
    return _top_level(listed.stdout.splitlines())


def test_artifact_leaves_out_dev_tooling_and_local_state(members):
    for entry in DEV_TOOLING + LOCAL_STATE:
        assert not any(m == entry or m.startswith(entry + "/") for m in members), entry


def test_artifact_holds_the_collection(members):
    for path in ("MANIFEST.json", "FILES.json", "README.md", "meta/runtime.yml",
                 "plugins/modules/host_worker.py", "plugins/module_utils/shared_volume.py",
                 "plugins/inventory/ec2_elastic.py", "playbooks", "roles", "docs",
                 "files/iam/README.md", "files/iam/controller-policy.json",
                 "files/iam/master-boundary-policy.json", "files/iam/dynatrain-reconcile-policy.json",
                 "files/iam/ec2-assume-role-trust.json",
                 "tests/integration/targets/host_worker/tasks/main.yml"):
        assert path in members, path
    assert any(m.startswith("playbooks/") and m.endswith(".yml") for m in members)
    assert any(m.startswith("roles/") and m.endswith("/meta/argument_specs.yml") for m in members)


def test_every_tracked_top_level_entry_but_dev_tooling_ships(members):
    """New top-level directories (runtime/, molecule/, ...) ship unless named dev tooling above."""
    expected = _tracked_top_level() - set(DEV_TOOLING) - set(NOT_COPIED)
    assert expected - _top_level(members) == set()


def test_build_install_and_use_by_fqcn(artifact, tmp_path):
    # a clean environment, away from the checkout's ansible.cfg: only the
    # installed copy can answer
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    (tmp_path / "empty.cfg").write_text("[defaults]\n")
    env["ANSIBLE_CONFIG"] = str(tmp_path / "empty.cfg")
    dest = tmp_path / "collections"
    installed = _run([os.path.join(BIN, "ansible-galaxy"), "collection", "install", "--no-deps", "--offline",
                      "-p", str(dest), str(artifact)], env=env, cwd=str(tmp_path))
    assert installed.returncode == 0, installed.stderr
    coll = dest / "ansible_collections" / "dynatrain" / "elastic"
    assert (coll / "plugins" / "modules" / "host_worker.py").is_file()
    assert (coll / "meta" / "runtime.yml").is_file()
    for entry in (".venv", ".localcloud") + DEV_TOOLING:
        assert not (coll / entry).exists(), entry

    env["ANSIBLE_COLLECTIONS_PATH"] = str(dest)
    doc = _run([os.path.join(BIN, "ansible-doc"), "dynatrain.elastic.host_worker"], env=env, cwd=str(tmp_path))
    assert doc.returncode == 0 and "host_worker_log" in doc.stdout, doc.stderr
    inv = _run([os.path.join(BIN, "ansible-doc"), "-t", "inventory", "dynatrain.elastic.ec2_elastic"],
               env=env, cwd=str(tmp_path))
    assert inv.returncode == 0 and "dt_master" in inv.stdout, inv.stderr
    syntax = _run([os.path.join(BIN, "ansible-playbook"), "--syntax-check", "-i", "localhost,",
                   "dynatrain.elastic.teardown"], env=env, cwd=str(tmp_path))
    assert syntax.returncode == 0, syntax.stdout + syntax.stderr
