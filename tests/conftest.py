"""Make `ansible_collections.dynatrain.elastic` importable from this checkout."""
import os
import socket
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIONS = os.path.join(ROOT, ".collections")
link = os.path.join(COLLECTIONS, "ansible_collections", "dynatrain", "elastic")
if not os.path.exists(link):
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(ROOT, link)
if COLLECTIONS not in sys.path:
    sys.path.insert(0, COLLECTIONS)


@pytest.fixture(scope="module")
def moto_endpoint():
    """A moto server on a free 127.0.0.1 port for one test module; yields its URL."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield "http://127.0.0.1:%d" % port
    server.stop()
