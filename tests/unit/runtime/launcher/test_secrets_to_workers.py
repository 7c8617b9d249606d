"""The job's secrets (dt_train_env) reach the processes the launcher starts on other nodes on their stdin,
never on a command line: the transport names them, the child wrapper reads them before it starts the command."""
import json
import os
import subprocess
import sys

from dynatrain_runtime.launcher import cli, loop
from dynatrain_runtime.launcher.transport import Transport, secret_env

SECRET = "s3cr3t value with 'quotes' and $dollars"


def test_secret_env_takes_only_the_named_variables():
    environ = {"DT_TRAIN_ENV_NAMES": "WANDB_API_KEY HF_TOKEN", "WANDB_API_KEY": SECRET, "PATH": "/bin"}
    assert secret_env(environ) == {"WANDB_API_KEY": SECRET}
    assert secret_env({"WANDB_API_KEY": SECRET}) == {}


def test_a_remote_process_gets_its_secrets_on_stdin_not_the_command_line():
    transport = Transport("ssh", "/opt/dynatrain/venv/bin/python", local_ips=["10.0.0.1"],
                          secrets={"WANDB_API_KEY": SECRET})
    transport.master = "10.0.0.1"
    cmd = transport.command("10.0.0.7", ["python", "train.py"], {"A": "b"})
    assert cmd[0] == "ssh" and "--env-stdin" in cmd[-1]
    assert SECRET not in " ".join(cmd) and "WANDB_API_KEY" not in " ".join(cmd)
    assert json.loads(transport.stdin_head("10.0.0.7")) == {"WANDB_API_KEY": SECRET}
    # the master's processes inherit the launcher's environment: nothing on stdin, no flag
    assert transport.stdin_head("10.0.0.1") == b"" and "--env-stdin" not in transport.command("10.0.0.1", ["x"], {})
    bare = Transport("ssh", "python")
    assert bare.stdin_head("10.0.0.7") == b"" and "--env-stdin" not in bare.command("10.0.0.7", ["x"], {})[-1]


def test_the_launcher_hands_its_named_variables_to_the_transport(tmp_path, monkeypatch):
    monkeypatch.setenv("DT_TRAIN_ENV_NAMES", "HF_TOKEN")
    monkeypatch.setenv("HF_TOKEN", SECRET)
    args = cli.parse_args(["--efs-mount", str(tmp_path), "--script", "train.py", "--master", "10.0.0.1",
                           "--transport", "ssh"])
    la = loop.Launcher(args)
    assert json.loads(la.transport.stdin_head("10.0.0.9")) == {"HF_TOKEN": SECRET}


def run_child(stdin, *flags, lines=2):
    """The wrapper's first ``lines`` output lines (stdin kept open till then: its EOF ends the child), rc."""
    code = "import os, sys; print(os.environ.get('HF_TOKEN'), flush=True); print(sys.stdin.readline().strip())"
    proc = subprocess.Popen([sys.executable, "-m", "dynatrain_runtime.launcher", "child", *flags, "--",
                             sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={k: v for k, v in os.environ.items() if k != "HF_TOKEN"})
    try:
        proc.stdin.write(stdin)
        proc.stdin.flush()
        out = [proc.stdout.readline().decode().rstrip("\n") for _line in range(lines)]
        proc.stdin.close()
        rc = proc.wait(timeout=60)
        return out, rc, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_child_wrapper_reads_the_secrets_line_then_forwards_the_rest():
    head = json.dumps({"HF_TOKEN": SECRET}).encode() + b"\n"
    # (its exit status is the race of the command's exit with stdin's EOF, which ends it: not asserted)
    out, _rc, err = run_child(head + b'{"kind": "assign"}\n', "--env-stdin")
    assert out == [SECRET, '{"kind": "assign"}'], err
    out, _rc, err = run_child(b'{"kind": "assign"}\n')
    assert out == ["None", '{"kind": "assign"}'], err


def test_the_child_wrapper_refuses_a_line_that_is_not_an_object_of_strings():
    for bad in (b"not json\n", b'["a"]\n', b'{"A": 1}\n', b""):
        out, rc, err = run_child(bad + b"\n", "--env-stdin", lines=1)
        assert (out, rc) == ([""], 2) and b"--env-stdin" in err, bad
