"""Spot interruption drain: the watcher against the local IMDS, the launcher's decisions (no MXNet)."""
import json
import os
import subprocess
import sys
import time

import pytest

from dynatrain_runtime.contract import shared_volume
from dynatrain_runtime.daemons import spot
from dynatrain_runtime.launcher import loop, parse_args
from dynatrain_runtime.launcher.generation import Generation
from localcloud.imds import ImdsRegistry, InstanceMetadata

from conftest import write_hosts

IP = "127.0.0.71"
PORT = 1391
M, A, B = "127.0.0.1", "127.0.0.2", "127.0.0.3"


@pytest.fixture
def imds():
    registry = ImdsRegistry(port=PORT)
    meta = InstanceMetadata("i-0spot0000000000001", IP, lifecycle="spot")
    registry.ensure(meta)
    yield registry, meta, f"http://{IP}:{PORT}/"
    registry.stop_all()


def test_no_notice_no_drain(imds, tmp_path):
    _registry, _meta, endpoint = imds
    files = shared_volume.JobFiles(str(tmp_path))
    assert spot.watch_once(spot.Imds(endpoint), files, IP) is None
    assert shared_volume.read_drain_requests(files) == {}


def test_interruption_notice_writes_one_drain_request(imds, tmp_path):
    registry, meta, endpoint = imds
    files = shared_volume.JobFiles(str(tmp_path))
    client = spot.Imds(endpoint)
    assert client.get("local-ipv4") == IP
    registry.interrupt(meta.instance_id, after=120)
    reason, detail = spot.watch_once(client, files, IP)
    assert reason == "spot" and detail["action"] == "terminate"
    req = shared_volume.read_drain_requests(files)[IP]
    assert req["reason"] == "spot" and req["notice"]["action"] == "terminate"
    first = req["time"]
    spot.watch_once(client, files, IP)                           # seen again: not rewritten
    assert shared_volume.read_drain_requests(files)[IP]["time"] == first


class FakeImds:
    def __init__(self, paths):
        self.paths = paths

    def get(self, path):
        return self.paths.get(path)


def test_rebalance_recommendation_drains_unless_ignored(tmp_path):
    rebalance_only = FakeImds({"events/recommendations/rebalance": '{"noticeTime": "2026-11-23T00:00:00Z"}'})
    assert spot.notice(rebalance_only) == ("rebalance", {"noticeTime": "2026-11-23T00:00:00Z"})
    assert spot.notice(rebalance_only, rebalance=False) is None
    files = shared_volume.JobFiles(str(tmp_path))
    spot.watch_once(rebalance_only, files, IP)
    assert shared_volume.read_drain_requests(files)[IP]["reason"] == "rebalance"
    both = FakeImds(dict(rebalance_only.paths, **{"spot/instance-action": '{"action": "stop"}'}))
    spot.watch_once(both, files, IP)                             # the notice upgrades the request
    assert shared_volume.read_drain_requests(files)[IP]["reason"] == "spot"


def test_expired_token_is_renewed(imds):
    _registry, _meta, endpoint = imds
    client = spot.Imds(endpoint)
    assert client.get("instance-id") == "i-0spot0000000000001"
    client._token = "expired-or-made-up"
    assert client.get("instance-id") == "i-0spot0000000000001"


def test_cli_once_exit_codes(imds, tmp_path):
    registry, meta, endpoint = imds
    cmd = [sys.executable, "-m", "dynatrain_runtime.daemons.spot", "--efs-mount", str(tmp_path),
           "--imds-endpoint", endpoint, "--once"]
    assert subprocess.run(cmd, timeout=30, check=False).returncode == 0
    registry.interrupt(meta.instance_id, after=120)
    out = subprocess.run(cmd, timeout=30, check=False, stdout=subprocess.PIPE, text=True)
    assert out.returncode == 10 and f"spot notice for {IP}" in out.stdout
    assert os.path.exists(os.path.join(str(tmp_path), "control", "drain", f"{IP}.json"))


def launcher(efs, *extra):
    return loop.Launcher(parse_args(["--efs-mount", str(efs), "--script", "/bin/true", "--transport", "local",
                                     "--master", M, "--resize-at", "epoch", *extra]))


def test_launcher_drains_at_the_next_step_even_with_epoch_boundaries(tmp_path):
    la = launcher(tmp_path)
    write_hosts(tmp_path, [A, B, M])
    g = Generation(1, [A, B, M], 9000, None)
    la.members.confirm(g.membership)
    shared_volume.write_drain_request(la.files, B, "spot", notice={"action": "terminate"})
    la._check_host_worker(g, time.time())
    assert open(os.path.join(str(tmp_path), "host_worker")).read() == f"{A}\n{M}\n"
    assert g.stop_at is not None and g.stop_reason == "drain"
    assert shared_volume.read_stop_request(la.files)["at"] == "step"
    assert la.pending_resize.reason == "drain" and la.pending_resize.drained == {B: "spot"}
    la.intake.confirm([A, M])                                           # the smaller group has taken its first step
    with open(os.path.join(str(tmp_path), "host_worker_log")) as handle:
        assert [line.split()[1:3] for line in handle][-1] == ["REMOVED", B]
    evs = [json.loads(line) for line in open(os.path.join(str(tmp_path), "events.jsonl"))]
    assert [e for e in evs if e.get("log_event") == "REMOVED"][0]["reason"] == "spot"
    assert shared_volume.read_drain_requests(la.files) == {} and la.intake.draining == {}


def test_launcher_refuses_to_drain_the_master(tmp_path):
    la = launcher(tmp_path)
    write_hosts(tmp_path, [A, M])
    g = Generation(1, [A, M], 9000, None)
    shared_volume.write_drain_request(la.files, M, "spot")
    la._check_host_worker(g, time.time())
    assert open(os.path.join(str(tmp_path), "host_worker")).read() == f"{A}\n{M}\n"
    assert g.stop_at is None and shared_volume.read_drain_requests(la.files) == {}
    evs = [json.loads(line) for line in open(os.path.join(str(tmp_path), "events.jsonl"))]
    assert any(e["event"] == "drain_refused" and e["ip"] == M for e in evs)


def test_a_survivor_that_gives_an_existing_checkpoint_of_its_step_is_a_survivor_recovery(tmp_path):
    """The last completed step was checkpointed already (a periodic save): the survivor's answer names
    that checkpoint (CheckpointStore.write keeps a verified one), and the job lost nothing."""
    from dynatrain_runtime.contract.checkpoint import CheckpointStore
    la = launcher(tmp_path)
    write_hosts(tmp_path, [A, B, M])
    g = Generation(2, [A, B, M], 9000, None)
    la.members.confirm(g.membership)
    store = CheckpointStore(os.path.join(str(tmp_path), "checkpoints"))
    path = store.write(40, {"step": 40, "epoch": 1, "pos": 0, "generation": 2})
    g.max_step = 40
    answer = {"ok": True, "path": path, "step": 40, "seconds_total": 0.05}
    la.pending_resize = la.failures.handle(g, {B: "no sign of life"}, recovery=answer)
    assert la.pending_resize.recovered_from == "survivor", la.pending_resize
    assert la.pending_resize.recomputed_steps == 0
