"""The benchmarks' usage lines typed as a new user types them: the script alone from the repository root, with a
bare PATH (its #! line finds the system's python3, which has neither the runtime nor MXNet, torch or boto3).
scripts/project_python.py moves such a run to the script's own venv; where that venv is missing it says to run
`make setup` instead of a traceback."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BARE = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
ENTRY_POINTS = [
    "benchmarks/add_workers/bench_add_workers.py",
    "benchmarks/checkpoint/bench_stall.py",
    "benchmarks/churn/bench_churn.py",
    "benchmarks/inplace/bench_resize.py",
    "benchmarks/inplace/loopback_floor.py",
    "benchmarks/inplace/report.py",
    "benchmarks/inventory/bench_inventory.py",
    "benchmarks/resize/bench_resize.py",
    "benchmarks/scale/bench_scale.py",
    "benchmarks/throughput/bench_throughput.py",
    "benchmarks/torch/bench_torch_elastic.py",
]


@pytest.mark.parametrize("script", ENTRY_POINTS)
def test_a_benchmark_typed_alone_with_a_bare_path_runs(script):
    proc = subprocess.run([script, "--help"], cwd=ROOT, env=BARE, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: "), proc.stdout[:500]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


def _require(venvs, *modules):
    code = ("import sys; sys.path.insert(0, %r); import project_python as p; p.VENVS.update(%r); "
            "p.require('node', *%r); print('went on')" % (os.path.join(ROOT, "scripts"), venvs, modules))
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)


def test_nothing_missing_goes_on_in_the_same_python():
    proc = _require({}, "json", "os")
    assert proc.returncode == 0 and proc.stdout.strip() == "went on", proc


def test_a_missing_venv_says_to_run_make_setup():
    proc = _require({"node": "no-such-venv"}, "json", "dt_no_such_module")
    assert proc.returncode == 1, proc
    assert "went on" not in proc.stdout
    assert "needs dt_no_such_module" in proc.stderr and "run `make setup` at %s" % ROOT in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_venv_that_lacks_the_module_too_does_not_run_itself_again():
    # the venv is this very python's: re-running would loop, so it stops with the message
    home = os.path.realpath(sys.prefix)
    proc = _require({"node": os.path.relpath(home, ROOT)}, "dt_no_such_module")
    assert proc.returncode == 1, proc
    assert "needs dt_no_such_module" in proc.stderr, proc.stderr
