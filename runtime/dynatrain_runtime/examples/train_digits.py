"""Example elastic training script: an MLP (or a small conv net) on scikit-learn's digits (8x8, 10 classes).

MXNet Gluon (default, ``mxnet_digits``) or PyTorch (``--engine torch``, or ``$DT_ENGINE`` -- the launcher's
``--engine`` sets it -- ``torch_digits``): the same data, global batch, flags and accuracy; the command line,
the data, the report and the result are ``digits_common``'s.  Installed as ``dt-train-digits``.  Runs under
the launcher (kvstore dist_sync or a torch process group, one process per worker host) or alone (one
worker), on the node's devices.  Per epoch it prints loss/accuracy and appends an ``epoch`` record to
``$EFS_MOUNT/events.jsonl``; at the end rank 0 writes ``$EFS_MOUNT/results/final.json``.  Exit status:
0 = done, 75 = stopped at a boundary on the launcher's request (checkpoint written), other = failure.
"""
from __future__ import annotations

import sys

from dynatrain_runtime.examples.digits_common import load_data, parse_args
from dynatrain_runtime.examples.mxnet_digits import train_mxnet
from dynatrain_runtime.examples.torch_digits import train_torch

TRAINERS = {"mxnet": train_mxnet, "torch": train_torch}


def main(argv=None):
    args = parse_args(argv)
    x_train, y_train, x_val, y_val = load_data(args.data, args.seed, args.val_fraction)
    return TRAINERS[args.engine](args, x_train, y_train, x_val, y_val)


if __name__ == "__main__":
    sys.exit(main())
