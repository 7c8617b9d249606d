"""The port a generation's rendezvous listens on, for both engines: torch's TCPStore and MXNet's ps-lite
scheduler bind it on the master (where the launcher runs)."""

from __future__ import annotations

import socket


def free_port(port_base, generation, tries=50):
    """The generation's rendezvous port: ``port_base + generation % 500``, or the next free one after it.

    torch's TCPStore and MXNet's ps-lite scheduler bind on the master (where the launcher runs); a port
    another job, or the launcher's metrics, listens on would fail the whole generation's start, so it is
    skipped (a TIME_WAIT one is fine).
    """
    for k in range(tries):
        port = port_base + (int(generation) + k) % 500
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("", port))
            except OSError:
                continue
        return port
    return port_base + int(generation) % 500
