"""Example "prepare data" step: write scikit-learn's digits data set to a node-local .npz.

Installed as ``dt-prepare-digits``.  Runs on every node before it joins (the
prepare_data role writes ``prepare_data_success_<ip>`` only when this exits 0).  The
data set ships inside scikit-learn, so no download is needed.  Exit status: 0 on
success, 1 on failure.

    dt-prepare-digits [--out /var/lib/dynatrain/data/digits.npz]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import sys

from dynatrain_runtime.contract.shared_volume import atomic_write

DEFAULT_OUT = "/var/lib/dynatrain/data/digits.npz"


def digits_arrays():
    """The digits images scaled to 0..1 (1797 x 64 float32) and their labels (int64)."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")       # pixel values 0..16 -> 0..1
    y = digits.target.astype("int64")                 # 10 classes
    if x.shape != (1797, 64) or sorted(set(y.tolist())) != list(range(10)):
        raise ValueError(f"unexpected digits data set shape {x.shape!r}")
    return x, y


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--out", default=os.environ.get("DT_DATA_PATH", DEFAULT_OUT),
                    help="where to write the .npz (default %(default)s)")
    args = ap.parse_args(argv)
    try:
        import numpy as np
        x, y = digits_arrays()
        buf = io.BytesIO()
        np.savez(buf, x=x, y=y)
        out = os.path.abspath(args.out)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        atomic_write(out, buf.getvalue(), mode=0o644)
        digest = hashlib.sha256(buf.getvalue()).hexdigest()[:16]
        print(f"prepare_digits: wrote {out} ({x.shape[0]} samples, {x.shape[1]} features, sha256 {digest})")
        return 0
    except Exception as exc:  # any failure -> non-zero, with a reason
        print(f"prepare_digits: FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
