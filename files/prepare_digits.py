#!/usr/bin/env python3
# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""Example "prepare data" step: write scikit-learn's digits data set to a node-local .npz.

Runs on every node before it joins (the prepare_data role writes
``prepare_data_success_<ip>`` only when this exits 0).  The data set ships inside
scikit-learn, so no download is needed.  Exit status: 0 on success, 1 on failure.

    prepare_digits.py [--out /var/lib/dynatrain/data/digits.npz]
"""
import argparse
import hashlib
import os
import sys
import tempfile

DEFAULT_OUT = "/var/lib/dynatrain/data/digits.npz"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--out", default=os.environ.get("DT_DATA_PATH", DEFAULT_OUT),
                    help="where to write the .npz (default %(default)s)")
    args = ap.parse_args(argv)
    try:
        import numpy as np
        from sklearn.datasets import load_digits
        digits = load_digits()
        x = (digits.data / 16.0).astype("float32")       # 1797 x 64, pixel values 0..16 -> 0..1
        y = digits.target.astype("int64")                 # 10 classes
        if x.shape != (1797, 64) or sorted(set(y.tolist())) != list(range(10)):
            raise ValueError("unexpected digits data set shape %r" % (x.shape,))
        out = os.path.abspath(args.out)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".digits.", suffix=".npz", dir=os.path.dirname(out))
        try:
            with os.fdopen(fd, "wb") as handle:
                np.savez(handle, x=x, y=y)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o644)
            os.rename(tmp, out)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        digest = hashlib.sha256(open(out, "rb").read()).hexdigest()[:16]
        print("prepare_digits: wrote %s (%d samples, %d features, sha256 %s)" % (out, x.shape[0], x.shape[1], digest))
        return 0
    except Exception as exc:  # any failure -> non-zero, with a reason
        print("prepare_digits: FAILED: %s: %s" % (type(exc).__name__, exc), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
