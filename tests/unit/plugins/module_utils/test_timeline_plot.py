"""The run's timeline: module_utils/job_events.py (reading events.jsonl, the timeline it tells),
module_utils/timeline_plot.py (the PNG, its CLI) and the dynatrain.elastic.timeline_plot module.

The fixture tests/unit/fixtures/events_elastic_run.jsonl is a run recorded in the launcher's
format: 3 workers, 2 added, a spot drain, a lost worker (recovered from a survivor), one
removed on request, 8 epochs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from PIL import Image

from ansible.module_utils.testing import patch_module_args

from ansible_collections.dynatrain.elastic.plugins.module_utils import job_events, shared_volume
from ansible_collections.dynatrain.elastic.plugins.module_utils import timeline_plot
from ansible_collections.dynatrain.elastic.plugins.modules import timeline_plot as timeline_module

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
FIXTURE = os.path.join(ROOT, "tests", "unit", "fixtures", "events_elastic_run.jsonl")
# events.jsonl as a local-cloud run wrote it (make demo's job, resized while it trained)
RECORDED = os.path.join(ROOT, "tests", "unit", "fixtures", "events_localcloud_run.jsonl")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def fixture_records(path=FIXTURE):
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def count(records, event, **match):
    return sum(1 for r in records if r["event"] == event and all(r.get(k) == v for k, v in match.items()))


# --- job_events ------------------------------------------------------------------------


def test_parse_keeps_good_lines_and_numbers_the_bad_ones():
    text = '{"event": "epoch", "time": 2}\n\nnot json\n[1]\n{"event": "x"}\n{"event": "y", "time": true}\n{"ev'
    records, bad = shared_volume.parse_events(text)
    assert records == [{"event": "epoch", "time": 2}]
    assert bad == [3, 4, 5, 6, 7]


def test_missing_file_is_no_events(tmp_path):
    assert shared_volume.read_events(str(tmp_path / "events.jsonl")) == ([], [])


def test_timeline_of_the_recorded_run():
    records = fixture_records()
    tl = job_events.timeline(records)
    assert tl["t0"] == records[0]["time"] and tl["end"] == pytest.approx(records[-1]["time"] - records[0]["time"], abs=1e-3)
    # the world size follows the generations (0 while resizing, 0 after the end)
    worlds = [w for _t, w in tl["world"] if w]
    assert worlds == [r["world"] for r in records if r["event"] == "generation_start"] == [3, 5, 4, 3, 2]
    assert tl["world"][-1][1] == 0
    assert [(r["from_world"], r["to_world"], r["reason"]) for r in tl["resizes"]] == [
        (3, 5, "membership"), (5, 4, "drain"), (4, 3, "failure"), (3, 2, "membership")]
    assert all(r["end"] is not None and r["end"] > r["start"] for r in tl["resizes"])
    assert len(tl["epochs"]) == count(records, "epoch") == 8
    assert [f["ip"] for f in tl["failures"]] == [r["ip"] for r in records if r["event"] == "worker_failed"]
    assert [(d["ip"], d["reason"]) for d in tl["drains"]] == [("172.31.70.5", "spot")]
    assert tl["final_val_acc"] == records[-3]["val_acc"]


def test_a_resize_in_progress_has_no_end():
    tl = job_events.timeline([{"event": "generation_start", "time": 10, "world": 2},
                              {"event": "resize_start", "time": 20, "from_world": 2, "to": ["a", "b", "c"]}])
    assert tl["resizes"] == [{"start": 10, "end": None, "from_world": 2, "to_world": 3, "reason": "membership",
                              "added": [], "removed": []}]
    assert tl["world"] == [(0, 2), (10, 0)]


def test_no_events_is_a_clear_error():
    with pytest.raises(job_events.JobEventsError, match="has not started"):
        job_events.timeline([])


# --- the picture -----------------------------------------------------------------------


def pixels_near(image, box, hex_color, tolerance=40):
    """How many pixels in ``box`` have about the colour ``#rrggbb`` (antialiased edges excluded)."""
    want = tuple(int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    region = image.crop(box).convert("RGB")
    return sum(n for n, rgb in region.getcolors(maxcolors=1 << 22)
               if sum(abs(a - b) for a, b in zip(rgb, want)) <= tolerance)


def test_render_the_recorded_run(tmp_path):
    records = fixture_records()
    out = tmp_path / "sub" / "timeline.png"
    summary = timeline_plot.render_file(FIXTURE, str(out), title="test run")
    data = out.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    with Image.open(out) as image:
        assert image.size == (summary["width_px"], summary["height_px"]) == (
            int(timeline_plot.WIDTH_IN * timeline_plot.DPI), int(timeline_plot.HEIGHT_IN * timeline_plot.DPI))
        image.load()
        assert len(summary["axes"]) == 3
        series = ("world", "rate", "acc")
        for box, name in zip(summary["axes"], series):
            left, top, right, bottom = box
            assert 0 <= left < right <= image.size[0] and 0 <= top < bottom <= image.size[1]
            # each panel holds its own series' line (not just a frame and a grid) and the resize shading
            inner = (left + 3, top + 3, right - 3, bottom - 3)
            assert pixels_near(image, inner, timeline_plot.COLORS[name]) > 300, name
            assert pixels_near(image, inner, "#fce9c0", tolerance=12) > 1000, name  # resize at alpha 0.25
            for other in set(series) - {name}:
                assert pixels_near(image, inner, timeline_plot.COLORS[other]) < 50, (name, other)
        world_box = summary["axes"][0]
        assert pixels_near(image, world_box, timeline_plot.COLORS["failure"]) > 20  # the lost worker's X
        assert pixels_near(image, world_box, timeline_plot.COLORS["drain"]) > 20  # the spot drain's triangle
    # a marker for each event of its kind in the recording
    assert summary["epochs"] == count(records, "epoch") == 8
    assert summary["resizes"] == count(records, "resize_start") == 4
    assert summary["failures"] == count(records, "worker_failed") == 1
    assert summary["spot_drains"] == count(records, "drain_requested", reason="spot") == 1
    assert summary["drains"] == 0
    assert summary["world_max"] == 5 and summary["final_val_acc"] == pytest.approx(0.9694)
    assert summary["bad_lines"] == [] and summary["path"] == str(out)


@pytest.mark.parametrize("path", [FIXTURE, RECORDED], ids=["fixture", "local-cloud"])
def test_a_marker_per_event_of_the_recording(tmp_path, path):
    records = fixture_records(path)
    summary = timeline_plot.render_file(path, str(tmp_path / "t.png"))
    assert summary["epochs"] == count(records, "epoch") > 0
    assert summary["resizes"] == count(records, "resize_start") > 0
    assert summary["failures"] == count(records, "worker_failed")
    assert summary["spot_drains"] == count(records, "drain_requested", reason="spot")
    assert summary["world_max"] == max(r["world"] for r in records if r["event"] == "generation_start")
    assert summary["bad_lines"] == []


def test_render_without_epochs_still_draws(tmp_path):
    out = tmp_path / "t.png"
    summary = timeline_plot.render([{"event": "generation_start", "time": 1.0, "world": 2},
                                    {"event": "worker_failed", "time": 5.0, "ip": "10.0.0.2", "reason": "gone"}], str(out))
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    assert summary["epochs"] == 0 and summary["failures"] == 1 and summary["final_val_acc"] is None


@pytest.mark.parametrize("content", [None, "", "\n\n"])
def test_missing_or_empty_events_file_is_a_clear_error(tmp_path, content):
    path = tmp_path / "events.jsonl"
    if content is not None:
        path.write_text(content)
    out = tmp_path / "t.png"
    with pytest.raises(timeline_plot.TimelinePlotError, match="no timeline to draw"):
        timeline_plot.render_file(str(path), str(out))
    assert not out.exists()


def test_unwritable_destination_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(timeline_plot.TimelinePlotError, match="cannot write the timeline"):
        timeline_plot.render(fixture_records(), str(tmp_path / "file" / "t.png"))


def run_cli(*args):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, ".collections"))
    return subprocess.run([sys.executable, "-m", "ansible_collections.dynatrain.elastic.plugins.module_utils.timeline_plot",
                           *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_cli(tmp_path):
    out = tmp_path / "cli.png"
    proc = run_cli(FIXTURE, str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    assert "8 epochs, 4 resizes, 1 failures, 1 spot drains" in proc.stdout


def test_cli_missing_file_says_so_without_a_traceback(tmp_path):
    proc = run_cli(str(tmp_path / "events.jsonl"), str(tmp_path / "x.png"))
    assert proc.returncode == 1
    assert "does not exist: no timeline to draw" in proc.stderr and "Traceback" not in proc.stderr


# --- the module --------------------------------------------------------------------------


def module_params(**kw):
    return dict(dict(events=None, src=None, dest="/nonexistent/t.png", title="t"), **kw)


def test_module_draws_from_records(tmp_path):
    res = timeline_module.run(module_params(events=fixture_records(), dest=str(tmp_path / "m.png")))
    assert res["changed"] is True and res["dest"] == str(tmp_path / "m.png")
    assert res["summary"]["resizes"] == 4 and "axes" not in res["summary"]
    assert (tmp_path / "m.png").read_bytes()[:8] == PNG_SIGNATURE


def test_module_check_mode_writes_nothing(tmp_path):
    res = timeline_module.run(module_params(src=FIXTURE, dest=str(tmp_path / "m.png")), check_mode=True)
    assert res["changed"] is False and res["bad_lines"] == [] and not (tmp_path / "m.png").exists()


@pytest.mark.parametrize("kw, message", [
    (dict(events=[]), "missing or empty"),
    (dict(src="/nonexistent/events.jsonl"), "does not exist"),
])
def test_module_without_events_fails_clearly(capsys, tmp_path, kw, message):
    args = dict(dest=str(tmp_path / "m.png"), **kw)
    with patch_module_args(args):
        with pytest.raises(SystemExit) as info:
            timeline_module.main()
    out = json.loads(capsys.readouterr().out)
    assert info.value.code == 1 and out["failed"] is True
    assert message in out["msg"] and "no timeline to draw" in out["msg"]
    assert not (tmp_path / "m.png").exists()
