"""make setup's commands: the README's `ansible-playbook ...` typed in a plain shell at the root runs
the checkout's .venv (scripts/install_commands.sh), and a user's own command is never shadowed."""
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(ROOT, "scripts", "install_commands.sh")
BARE = "/usr/sbin:/usr/bin:/sbin:/bin"


def install(bindir):
    env = {"PATH": "%s:%s" % (bindir, BARE), "HOME": os.environ.get("HOME", "/root"), "DT_COMMANDS_DIR": str(bindir)}
    return subprocess.run(["bash", SCRIPT], env=env, text=True, capture_output=True, check=True).stdout


def test_a_bare_path_at_the_root_runs_the_checkouts_ansible(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    first = install(bindir)
    assert "ansible-playbook" in first and "molecule" in first
    assert install(bindir) == ""                                # a second run changes nothing
    env = {"PATH": "%s:%s" % (bindir, BARE), "HOME": os.environ.get("HOME", "/root")}
    out = subprocess.run(["ansible-playbook", "--version"], cwd=ROOT, env=env, text=True,
                         capture_output=True, check=True).stdout
    assert "config file = %s" % os.path.join(ROOT, "ansible.cfg") in out
    out = subprocess.run(["ansible-playbook", "--syntax-check", "bootstrap.yml"], cwd=ROOT, env=env,
                         text=True, capture_output=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_users_own_command_is_left_alone(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    own = bindir / "ansible-playbook"
    own.write_text("#!/bin/sh\necho mine\n")
    out = install(bindir)
    assert "is not ours, left alone" in out
    assert own.read_text() == "#!/bin/sh\necho mine\n"
    assert (bindir / "ansible").exists()
