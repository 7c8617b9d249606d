"""benchmarks/add_workers/bench_add_workers.py --flow card (issue 43): the slowest tasks read from a playbook log
written with ansible.posix.profile_tasks, and the table of the card's flow (a bake said where it happened)."""
from __future__ import annotations

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def bench():
    spec = importlib.util.spec_from_file_location(
        "bench_add_workers", os.path.join(ROOT, "benchmarks", "add_workers", "bench_add_workers.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LOG = """TASK [Check the vCPU quotas] ****
ok: [localhost]
PLAY RECAP *****
localhost : ok=88 changed=3
Saturday 28 November 2026  09:42:30 +0000 (0:00:00.050)       0:00:20.100 *****
===============================================================================
Wait for the launcher's ADDED ------------------------------------------- 2.07s
dynatrain.elastic.warm_pool : Claim them for this add, start them and wait until they run --- 2.01s
Check the vCPU quotas --------------------------------------------------- 1.45s
Report ------------------------------------------------------------------ 0.11s
"""


def test_the_slowest_tasks_of_a_profiled_log(tmp_path):
    log = tmp_path / "add.log"
    log.write_text(LOG)
    top = bench().slowest_tasks(str(log), top=2)
    assert top == [(2.07, "Wait for the launcher's ADDED"),
                   (2.01, "dynatrain.elastic.warm_pool : Claim them for this add, start them and wait until they run")]
    assert bench().slowest_tasks(str(tmp_path / "missing.log")) == []


def test_the_card_table_has_each_column_and_says_where_the_image_was_baked():
    results = {"before": {"bootstrap": 106.0, "add1": 54.5, "add2": 56.3},
               "after": {"bootstrap": 194.9, "add1": 22.6, "add2": 24.8, "baked_by": ["bootstrap"]},
               "after+pool": {"bootstrap": 75.4, "add1": 18.0, "add2": 36.4, "refill": 34.5, "add3": 21.8}}
    lines = bench().card_table(results).splitlines()
    assert lines[0] == "| seconds | before | after | after+pool |"
    boot = [line for line in lines if line.startswith("| bootstrap.yml")][0]
    assert "| 106.0 | 194.9 (baked the image) | 75.4 |" in boot
    third = [line for line in lines if line.startswith("| 3rd")][0]
    assert third.endswith("| - | - | 21.8 |")
