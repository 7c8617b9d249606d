"""The launcher's Prometheus metrics (issue 28): the text format, counters from its events, gauges from its
status, each host's state, and the HTTP endpoint (only /metrics; a port in use is said, never fatal)."""
import socket
import urllib.error
import urllib.request

from dynatrain_runtime.launcher.metrics import Metrics, serve

from conftest import parse


def test_counters_come_from_events_and_gauges_from_the_status(tmp_path):
    m = Metrics()
    m.observe("resize_end", {"reason": "add", "recomputed_steps": 0, "total_s": 1.2})
    m.observe("worker_failed", {"ip": "10.0.0.5"})
    m.observe("resize_end", {"reason": "failure", "recomputed_steps": 3, "total_s": 4.5})
    m.observe("drain_requested", {"ip": "10.0.0.6"})
    m.observe("generation_start", {"generation": 4})
    ckpt = tmp_path / "ckpt-0000000140"
    ckpt.mkdir()
    status = {"state": "running", "world_size": 3, "generation": 4, "step": 141, "epoch": 6,
              "samples_per_s": 391.25, "last_checkpoint": str(ckpt)}
    got = parse(m.render(status, {"10.0.0.2": "training", "10.0.0.6": "draining", "10.0.0.9": "joining"}))
    assert got["dynatrain_up"] == 1 and got['dynatrain_state{state="running"}'] == 1
    assert got['dynatrain_state{state="resizing"}'] == 0
    assert got["dynatrain_world_size"] == 3 and got["dynatrain_step"] == 141 and got["dynatrain_epoch"] == 6
    assert got["dynatrain_samples_per_second"] == 391.25 and got["dynatrain_generation"] == 4
    assert got['dynatrain_resizes_total{reason="add"}'] == 1 and got['dynatrain_resizes_total{reason="failure"}'] == 1
    assert got["dynatrain_worker_failures_total"] == 1 and got["dynatrain_spot_drains_total"] == 1
    assert got["dynatrain_recomputed_steps_total"] == 3 and got["dynatrain_recovery_seconds"] == 4.5
    assert 0 <= got["dynatrain_last_checkpoint_age_seconds"] < 60
    assert got['dynatrain_host_state{host="10.0.0.6",state="draining"}'] == 1
    assert got['dynatrain_host_state{host="10.0.0.9",state="joining"}'] == 1


def test_a_fresh_launcher_says_zeroes_not_nothing():
    got = parse(Metrics().render({}))
    assert got["dynatrain_world_size"] == 0 and got['dynatrain_resizes_total{reason="change"}'] == 0
    assert "dynatrain_recovery_seconds" not in got and "dynatrain_last_checkpoint_age_seconds" not in got


def test_the_endpoint_serves_metrics_only_and_a_taken_port_is_not_fatal():
    said = []
    server = serve("127.0.0.1", 0, lambda: Metrics().render({"state": "running", "world_size": 2}), said.append)
    try:
        port = server.server_address[1]
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert parse(resp.read().decode())["dynatrain_world_size"] == 2
        try:
            urllib.request.urlopen("http://127.0.0.1:%d/" % port, timeout=10)
            raise AssertionError("/ was served")
        except urllib.error.HTTPError as exc:
            assert exc.code == 404
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen(1)
            assert serve("127.0.0.1", taken.getsockname()[1], str, said.append) is None
        assert "cannot listen" in said[-1] and "goes on without them" in said[-1]
    finally:
        server.shutdown()
        server.server_close()


def test_the_sync_gauges_come_from_its_state_file_and_any_shape_there_is_no_error(tmp_path):
    path = tmp_path / "s3sync.json"
    assert "checkpoint_sync" not in Metrics(sync_state=str(path)).render({})          # no sync configured
    path.write_text('{"url": "s3://b/c/", "error": "NoSuchBucket", "failed_passes": 3, "last_step": 40}')
    got = parse(Metrics(sync_state=str(path)).render({}))
    assert got["dynatrain_checkpoint_sync_ok"] == 0 and got["dynatrain_checkpoint_sync_failed_passes_total"] == 3
    assert got["dynatrain_checkpoint_sync_latest_step"] == 40
    for hostile in ('[]', '"x"', '{"url": 7}', '{"url": "s3://b/c/", "failed_passes": "x", "last_ok_time": [],'
                    ' "last_step": true}', '\x00\xff', '[' * 100000,
                    '{"url": "s3://b/c/", "last_ok_time": -Infinity, "last_step": 1.5}'):
        path.write_text(hostile)
        got = parse(Metrics(sync_state=str(path)).render({}))
        assert got["dynatrain_up"] == 1
        assert "dynatrain_checkpoint_sync_failed_passes_total" not in got
        assert "dynatrain_checkpoint_sync_latest_step" not in got


def test_any_sync_state_file_renders(tmp_path):
    """Property: whatever a node writes at control/s3sync.json, a scrape answers well-formed text."""
    import json                                                      # pylint: disable=import-outside-toplevel
    from hypothesis import HealthCheck, given, settings              # pylint: disable=import-outside-toplevel
    from hypothesis import strategies as st                          # pylint: disable=import-outside-toplevel
    path = tmp_path / "s3sync.json"
    values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                      max_size=3), max_leaves=8)
    fields = st.fixed_dictionaries({}, optional={k: values for k in ("url", "error", "failed_passes", "last_ok_time",
                                                                     "last_step")})

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(fields.map(lambda d: json.dumps(d, allow_nan=True)), st.binary(max_size=64).map(
        lambda b: b.decode("latin-1"))))
    def check(text):
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        got = parse(Metrics(sync_state=str(path)).render({}))
        assert got["dynatrain_up"] == 1

    check()
