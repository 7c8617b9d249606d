"""The launcher's seams: its settings (``LauncherConfig``), the launch strategy chosen once from the engine,
the script API and ``--resize-mode``, and the typed resize record whose events are what the dict's were."""
import dataclasses
import socket
import time

import pytest

from dynatrain_runtime.launcher import loop, parse_args
from dynatrain_runtime.launcher.config import LauncherConfig
from dynatrain_runtime.launcher.generation import Generation
from dynatrain_runtime.launcher.inplace import InPlace
from dynatrain_runtime.launcher.resize import ResizeRecord
from dynatrain_runtime.launcher.restart import MXNetLayout, Restart, ScriptRestart, TorchLayout
from dynatrain_runtime.launcher.torchenv import node_gpus

A, B, M = "127.0.6.1", "127.0.6.2", "127.0.6.9"


def launcher(tmp_path, *flags):
    return loop.Launcher(parse_args(["--efs-mount", str(tmp_path), "--script", "train.py", "--transport", "local",
                                     "--master", M, *flags]))


def test_the_config_is_built_once_frozen_and_typed(tmp_path):
    args = parse_args(["--efs-mount", str(tmp_path), "--script", "train.py", "--engine", "torch", "--procs-per-node",
                       "2", "--env", "A=1", "--local-ip", "10.0.0.1", "--", "--epochs", "3"])
    config = LauncherConfig.from_args(args)
    assert config.procs == 2 and config.procs_per_node == 2 and config.engine == "torch"
    assert config.env == ("A=1",) and config.local_ip == ("10.0.0.1",) and config.script_args == ("--epochs", "3")
    assert config.dead_timeout == 6.0 and config.resize_mode == "auto"      # the parser's defaults
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.dead_timeout = 1.0
    la = loop.Launcher(config)
    assert la.config is config and not hasattr(la, "args")
    # every option of the parser has its field (a new option without one would be dropped silently)
    fields = {f.name for f in dataclasses.fields(LauncherConfig)}
    assert set(vars(args)) <= fields


@pytest.mark.parametrize("flags,kind,layout,mode", [
    ([], Restart, MXNetLayout, "restart"),
    (["--engine", "torch", "--procs-per-node", "1", "--resize-mode", "in-place"], InPlace, TorchLayout, "in-place"),
    (["--engine", "torch", "--procs-per-node", "1", "--resize-mode", "restart"], Restart, TorchLayout, "restart"),
    (["--engine", "torch", "--procs-per-node", "2"], Restart, TorchLayout, "restart"),       # N per node: restart
    (["--engine", "torch", "--script-api", "torchrun"], ScriptRestart, TorchLayout, "restart"),
])
def test_the_strategy_is_chosen_once_from_engine_script_api_and_resize_mode(tmp_path, flags, kind, layout, mode):
    la = launcher(tmp_path, *flags)
    assert type(la.strategy) is kind  # pylint: disable=unidiomatic-typecheck
    assert isinstance(la.strategy.layout, layout) and la.strategy.mode == mode
    env = la.static_env(A)
    assert ("DT_ASSIGN" in env) is (kind is not ScriptRestart)          # a torchrun script gets its env at start
    assert env.get("DT_RESIZE_MODE") == ("in-place" if kind is InPlace else None)
    assert la.spares.enabled is (kind is not ScriptRestart) and la.spares.servers is (layout is MXNetLayout)


def test_auto_keeps_survivors_in_place_on_cpu_nodes_only(tmp_path):
    la = launcher(tmp_path, "--engine", "torch", "--procs-per-node", "1")
    assert type(la.strategy) is (Restart if node_gpus() else InPlace)  # pylint: disable=unidiomatic-typecheck


def test_a_resize_record_leaves_out_what_is_not_known_and_writes_what_is_unknown():
    g = Generation(4, [A, B, M], 9000, None)
    now = time.monotonic()
    record = ResizeRecord.for_change(g, [A, M], 1, now - 2.0, now, "step", {B: {"reason": "spot"}})
    fields = record.fields()
    assert fields["from"] == [A, B, M] and fields["removed"] == [B] and fields["warm_wait_s"] == 2.0
    assert fields["reason"] == "drain" and fields["drained"] == {B: "spot"}
    assert "stop_step" not in fields and "resume_step" not in fields       # not known yet: left out
    record.set(resume_step=None, recomputed_steps=None)                    # known to be unknown: null
    record.stop_step = 7
    fields = record.fields()
    assert fields["resume_step"] is None and "resume_step" in fields and fields["stop_step"] == 7
    record.set(resume_step=5)
    assert record.fields()["resume_step"] == 5
    with pytest.raises(AttributeError):
        record.set(no_such_field=1)
    wall = record.event_fields()["detected_at"]
    assert abs(wall - (time.time() - 2.0)) < 0.5                            # the events' clock


@pytest.mark.parametrize("flags", [[], ["--engine", "torch", "--procs-per-node", "1", "--resize-mode", "restart"]])
def test_a_generation_port_someone_listens_on_is_skipped_for_either_engine(tmp_path, monkeypatch, flags):
    # The launcher's metrics listen on 9110 = 9091 + 19 by default: every MXNet job's generation 19 once failed to
    # bind its scheduler (ps-lite "bind failed") and recovered from its checkpoint.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        la = launcher(tmp_path, "--port-base", str(taken - 19), *flags)
        monkeypatch.setattr(la.intake, "next_generation_id", lambda: 19)
        monkeypatch.setattr(la.strategy.layout, "group", lambda *a: ([], {M: {}}, "stub"))
        monkeypatch.setattr(la.strategy, "_worker", lambda host, gid, env: object())
        monkeypatch.setattr(la.spares, "plan", lambda *a: None)
        la.strategy.start([M])
        assert la.gen.port != taken and taken - 19 <= la.gen.port < taken - 19 + 500
