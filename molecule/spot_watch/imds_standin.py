#!/usr/bin/env python3
"""A stand-in for the instance metadata service (IMDSv2), enough for dt-spot-watch.

PUT /latest/api/token gives a token; GET /latest/meta-data/<path> with it gives
``local-ipv4`` and, once the file INTERRUPT exists, ``spot/instance-action``;
anything else is 404, a GET without a valid token 401.
Usage: imds_standin.py INTERRUPT LOCAL_IPV4 HOST:PORT [HOST:PORT ...]
"""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN = "molecule-standin-token"


class Handler(BaseHTTPRequestHandler):
    def _text(self, body):
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self):
        if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            return self.send_error(400)
        return self._text(TOKEN)

    def do_GET(self):
        if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
            return self.send_error(401)
        body = metadata(self.server).get(self.path.removeprefix("/latest/meta-data/"))
        return self.send_error(404) if body is None else self._text(body)


def metadata(server):
    data = {"local-ipv4": server.local_ipv4}
    if os.path.exists(server.interrupt):
        data["spot/instance-action"] = json.dumps({"action": "terminate", "time": "2030-01-01T00:00:00Z"})
    return data


def main(interrupt, local_ipv4, *listen):
    servers = []
    for address in listen:
        host, port = address.rsplit(":", 1)
        server = ThreadingHTTPServer((host, int(port)), Handler)
        server.interrupt, server.local_ipv4 = interrupt, local_ipv4
        servers.append(server)
    for server in servers[1:]:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    servers[0].serve_forever()


if __name__ == "__main__":
    main(*sys.argv[1:])
