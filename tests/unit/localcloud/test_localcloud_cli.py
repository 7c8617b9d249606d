"""CLI pieces that need no daemon: env, wheel bookkeeping, preflight messages."""

import os

import pytest

from localcloud import cli, config, podman


def test_env_prints_exports(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("DT_LOCALCLOUD_HOME", str(tmp_path))
    monkeypatch.delenv("DT_LOCALCLOUD_PORT", raising=False)
    assert cli.main(["env"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "export AWS_ENDPOINT_URL=http://127.0.0.1:4599" in out
    assert "export AWS_ACCESS_KEY_ID=localcloud" in out
    assert "export AWS_SECRET_ACCESS_KEY=localcloud" in out
    assert "export AWS_DEFAULT_REGION=us-east-1" in out
    assert "export CONTAINERS_CONF=%s" % config.CONTAINERS_CONF in out
    assert "export DT_STATE_DIR=%s" % os.path.join(str(tmp_path), "clusters") in out


def test_default_home_is_repo_dot_localcloud(monkeypatch):
    monkeypatch.delenv("DT_LOCALCLOUD_HOME", raising=False)
    assert config.home() == os.path.join(config.REPO_DIR, ".localcloud")
    assert os.path.isfile(config.CONTAINERS_CONF)


def test_containers_conf_has_the_tested_settings():
    text = open(config.CONTAINERS_CONF).read()
    for needle in (
        'runtime = "runc"',
        'cgroup_manager = "cgroupfs"',
        'events_logger = "file"',
        '"nofile=1024:20000"',
        '"nproc=4096:4096"',
    ):
        assert needle in text


def test_wheel_bookkeeping(tmp_path):
    req = tmp_path / "req.txt"
    req.write_text("# c\nmxnet==1.9.1\nscikit-learn==1.5.2  # x\ncharset-normalizer==3.5.2\n\n")
    assert cli._wanted_wheels(str(req)) == [
        ("mxnet", "1.9.1"),
        ("scikit_learn", "1.5.2"),
        ("charset_normalizer", "3.5.2"),
    ]
    wd = tmp_path / "w"
    wd.mkdir()
    (wd / "mxnet-1.9.1-py3-none-manylinux2014_x86_64.whl").write_text("")
    (wd / "scikit_learn-1.5.2-cp311-cp311-manylinux_2_17_x86_64.whl").write_text("")
    assert cli._missing_wheels(str(req), str(wd)) == [("charset_normalizer", "3.5.2")]


def test_missing_tool_names_debian_package(monkeypatch):
    monkeypatch.setattr(podman.shutil, "which", lambda tool: None)
    with pytest.raises(podman.PodmanError, match=r"apt-get install debootstrap"):
        podman.require("debootstrap")


def test_up_without_image_says_how_to_build(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("DT_LOCALCLOUD_HOME", str(tmp_path))
    monkeypatch.setattr(podman, "require", lambda tool: None)
    monkeypatch.setattr(podman, "image_exists", lambda image=config.IMAGE: False)
    assert cli.main(["up"]) == 1
    assert "build-image" in capsys.readouterr().err


def test_down_when_nothing_runs_is_ok(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("DT_LOCALCLOUD_HOME", str(tmp_path))
    monkeypatch.setattr(cli.shutil, "which", lambda tool: None)  # no podman calls
    assert cli.main(["down"]) == 0
    assert cli.main(["down"]) == 0
    assert "down" in capsys.readouterr().out


def test_missing_wheels_per_python(tmp_path):
    req = tmp_path / "req.txt"
    req.write_text("numpy==1.23.5\nidna==3.20\nnvidia-cudnn-cu11==8.5.0.96\n")
    wd = tmp_path / "w"
    wd.mkdir()
    (wd / "numpy-1.23.5-cp311-cp311-manylinux_2_17_x86_64.whl").write_text("")
    (wd / "idna-3.20-py3-none-any.whl").write_text("")
    (wd / "nvidia_cudnn_cu11-8.5.0.96-2-py3-none-manylinux1_x86_64.whl").write_text("")
    assert cli._missing_wheels(str(req), str(wd)) == []
    # a cp311 build does not serve a Python 3.10 node (Ubuntu 22.04 Deep Learning AMI)
    assert cli._missing_wheels(str(req), str(wd), "3.10") == [("numpy", "1.23.5")]


def test_wheelhouse_gpu_is_opt_in(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(cli.config, "wheelhouse_dir", lambda: str(tmp_path))
    monkeypatch.setattr(cli.subprocess, "call", lambda cmd: calls.append(cmd) or 0)
    cli.main(["wheelhouse"])
    cli.main(["wheelhouse", "--gpu", "--python", "3.10"])
    assert not any(a.endswith("requirements-node-gpu.txt") for a in calls[0])
    assert any(a.endswith("requirements-node-gpu.txt") for a in calls[1])
    assert calls[1][calls[1].index("--python-version") + 1] == "3.10"


def test_wheelhouse_torch_is_opt_in_and_a_call_of_its_own(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(cli.config, "wheelhouse_dir", lambda: str(tmp_path))
    monkeypatch.setattr(cli.subprocess, "call", lambda cmd: calls.append(cmd) or 0)
    cli.main(["wheelhouse"])
    assert len(calls) == 1 and not any(a.startswith("requirements-node-torch") for a in map(os.path.basename, calls[0]))
    # (the MXNet path's setup does not grow)
    calls.clear()
    cli.main(["wheelhouse", "--engine", "torch", "--torch-index-url", "https://download.pytorch.org/whl/cpu"])
    base, torch = calls
    assert base[base.index("--platform") + 1] == "manylinux2014_x86_64" and base.count("--platform") == 1
    assert any(a.endswith("requirements-node-torch.txt") for a in torch)
    assert not any(a.endswith("requirements-node-torch-gpu.txt") or a.endswith("requirements-node-gpu.txt")
                   for a in base + torch)
    # PyTorch's wheels are manylinux_2_28 (its CUDA libraries 2_17 .. 2_28): each tag named
    assert {"manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"} <= {
        torch[i + 1] for i, a in enumerate(torch) if a == "--platform"}
    assert torch[torch.index("--extra-index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    calls.clear()
    cli.main(["wheelhouse", "--engine", "torch", "--gpu"])
    assert len(calls) == 3 and any(a.endswith("requirements-node-torch-gpu.txt") for a in calls[2])
    assert not any(a.endswith("requirements-node-gpu.txt") for a in calls[0])   # not MXNet's CUDA build


def test_torch_pins_count_as_present(tmp_path):
    req = tmp_path / "req.txt"
    req.write_text("torch==2.13.0+cpu\ntorch===2.13.0\ncuda-toolkit==13.0.3.0\n")
    assert cli._wanted_wheels(str(req)) == [("torch", "2.13.0+cpu"), ("torch", "2.13.0"), ("cuda_toolkit", "13.0.3.0")]
    wd = tmp_path / "w"
    wd.mkdir()
    (wd / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_text("")
    (wd / "cuda_toolkit-13.0.3.0-py2.py3-none-any.whl").write_text("")
    assert cli._missing_wheels(str(req), str(wd)) == [("torch", "2.13.0")]


def test_wheelhouse_dest_fills_the_wheelhouse_named(monkeypatch, tmp_path):
    """--dest: the wheelhouse a playbook's preflight found lacking (dt_wheelhouse_controller_dir, issue 43)."""
    calls = []
    monkeypatch.setattr(cli.config, "wheelhouse_dir", lambda: str(tmp_path / "default"))
    monkeypatch.setattr(cli.subprocess, "call", lambda cmd: calls.append(cmd) or 0)
    other = tmp_path / "other"
    assert cli.main(["wheelhouse", "--engine", "torch", "--dest", str(other)]) == 0
    assert [c[c.index("-d") + 1] for c in calls] == [str(other), str(other)]
    assert other.is_dir() and not (tmp_path / "default").exists()
