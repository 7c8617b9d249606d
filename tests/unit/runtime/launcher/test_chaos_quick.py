"""The quick subset of the fault campaign (``tests/chaos/campaign.py``, issues 24 and 40), in ``make test``'s unit stage:
crash leftovers (a torn log line, the launcher killed mid-checkpoint, a damaged newest checkpoint), a hostile
worker's ``@@DT`` lines (``"step": "x"``, a checkpoint path outside the volume) and a crash of the background
checkpoint writer mid-write.

Each fault runs a real three-host job (``--transport local``, the node venv's MXNet), injects the
fault at a moment drawn from the seed, lets the launcher recover under the harness's model of its
systemd unit, and checks the campaign's invariants (exactly-once audit, accuracy, host_worker_log,
a verifying checkpoint at every moment, no orphans, the launcher never down for good).  About 40 s
per fault on 2 cores.  ``DT_CHAOS_SEED=N`` replays another draw; the full campaign and its table:
``.localcloud/node-venv/bin/python tests/chaos/campaign.py``.
"""
import os
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests", "chaos"))
import campaign  # noqa: E402

SEED = int(os.environ.get("DT_CHAOS_SEED", "1"))


@pytest.mark.parametrize("index,fault", list(enumerate(campaign.QUICK)))
def test_fault_recovers_with_invariants(index, fault, node_python, digits_npz, tmp_path):
    cfg = campaign.JobConfig(timeout=150.0)
    result = campaign.run_fault(fault, SEED, cfg, node_python, digits_npz, str(tmp_path), index, port_base=24000)
    assert result.ok, "\n%s\n\n%s\n\nlauncher output (tail):\n%s" % (
        campaign.format_table([result]), campaign.format_details([result]), result.tail)
