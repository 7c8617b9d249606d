"""A pre-warmed ps-lite server or scheduler: ``python -m dynatrain_runtime.engines.mxnet_serve``.

Imports MXNet first (the slow part), then waits for the launcher's role assignment on
stdin and runs that role until the job ends.
"""

from __future__ import annotations

import os
import sys

from ..contract.protocol import emit, receive_assignment
from .denormals import flush_denormals


def main():
    os.environ.pop("DMLC_ROLE", None)   # MXNet would start a server loop at import time
    import mxnet  # noqa: F401  (done before the assignment arrives)
    if receive_assignment() is None:
        print("dynatrain_runtime.engines.mxnet_serve runs under the launcher only (DT_ASSIGN=stdin)", file=sys.stderr)
        return 2
    emit("serving", role=os.environ.get("DMLC_ROLE"))
    flush_denormals()       # a server runs the optimizer when the script's Trainer updates on the kvstore
    from mxnet.kvstore import kvstore_server
    kvstore_server._init_kvstore_server_module()   # runs the role's loop, then sys.exit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
