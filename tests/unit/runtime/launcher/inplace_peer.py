"""One member of a 3-process gloo group for test_inplace's peer transfer: ranks 0 and 1 hold a trained model
and optimizer (momentum), rank 2 (a joiner) holds a differently initialised one and receives the state.
Prints one JSON line: the stats and a digest of the state after the transfer."""
import json
import sys


import torch

from dynatrain_runtime.engines.torch import TorchSnapshot
from dynatrain_runtime.engines.torch_inplace import TransferError, settle
from inplace_group import HEADER, STEP, digest, join, leave

rank, port = int(sys.argv[1]), int(sys.argv[2])
engine = join(rank, port)
try:
    meta, stats, _healing = settle(engine, STEP if rank < 2 else -1, lambda: HEADER)
except TransferError as exc:                       # a chunk refused twice: every member hears of it, none hangs
    print(json.dumps({"rank": rank, "error": str(exc)}), flush=True)
    leave(engine)
value, count = digest(engine)
# a receiver's received bytes become its next boundary snapshot's memory: that snapshot copies into them
kept = len(engine._host._free)                     # pylint: disable=protected-access
snap = TorchSnapshot.issue(engine.module, engine.optimizer, {"step": STEP}, buffers=engine._host)  # pylint: disable=protected-access
same = all(torch.equal(a, b) for a, b in zip(snap.params.values(), engine.module.state_dict().values()))
print(json.dumps({"rank": rank, "meta": meta, "stats": stats, "digest": value, "tensors": count,
                  "kept_for_snapshot": kept, "reused": kept and not engine._host._free,  # pylint: disable=protected-access
                  "snapshot_equal": same}), flush=True)
leave(engine)
