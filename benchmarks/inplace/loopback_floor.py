#!/usr/bin/env python3
"""The floor under a peer-to-peer state copy on this machine: how fast bytes cross the loopback at all.

Every "host" of bench_resize.py is a 127.0.x address of one machine, so the add's state copy (and DDP's
gradient exchange beside it) goes through the kernel's loopback, not a NIC.  This prints, for ``--mb`` of
state, the seconds and MB/s of (1) one TCP stream between two processes (``socket.sendall`` -> ``recv_into``,
the least any transfer over TCP can take here) and (2) torch.distributed gloo ``send``/``recv`` in chunks of
``--chunk-mb`` (what the product's transfer uses, without its checksums), medians of ``--repeat``.

    .localcloud/node-venv/bin/python benchmarks/inplace/loopback_floor.py [--mb 780] [--repeat 3]
"""
import argparse
import os
import socket
import statistics
import sys
import time


def tcp_once(nbytes):
    """One TCP stream of ``nbytes`` from a forked process to this one: seconds."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    addr = srv.getsockname()
    pid = os.fork()
    if pid == 0:                                   # the sender
        try:
            srv.close()
            with socket.create_connection(addr) as out:
                out.sendall(bytearray(nbytes))
        finally:
            os._exit(0)
    conn, _addr = srv.accept()
    view, got = memoryview(bytearray(nbytes)), 0
    start = time.monotonic()
    while got < nbytes:
        n = conn.recv_into(view[got:], min(nbytes - got, 4 << 20))
        if n == 0:
            raise RuntimeError("the sender closed early")
        got += n
    seconds = time.monotonic() - start
    conn.close()
    srv.close()
    os.waitpid(pid, 0)
    return seconds


def _gloo_peer(rank, nbytes, chunk, port, out):
    import torch  # pylint: disable=import-outside-toplevel
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    buf = torch.empty(nbytes, dtype=torch.uint8)
    dist.barrier()
    start = time.monotonic()
    for lo in range(0, nbytes, chunk):
        (dist.send if rank == 0 else dist.recv)(buf[lo:lo + chunk], 1 - rank)
    dist.barrier()
    if rank == 1:
        out.put(time.monotonic() - start)
    dist.destroy_process_group()


def gloo_once(nbytes, chunk):
    """gloo send/recv of ``nbytes`` in ``chunk``-byte pieces between two processes: seconds."""
    import multiprocessing  # pylint: disable=import-outside-toplevel
    ctx = multiprocessing.get_context("spawn")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = ctx.Queue()
    procs = [ctx.Process(target=_gloo_peer, args=(rank, nbytes, chunk, port, out)) for rank in (0, 1)]
    for proc in procs:
        proc.start()
    seconds = out.get(timeout=600)
    for proc in procs:
        proc.join(60)
    return seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=780.0, help="bytes to move, MB [%(default)s]")
    ap.add_argument("--chunk-mb", type=float, default=32 * 1.048576, help="gloo chunk, MB [32 MiB]")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                    "scripts"))
    import project_python  # pylint: disable=import-outside-toplevel
    project_python.require("node", "torch")  # the gloo row's
    nbytes, chunk = int(args.mb * 1e6), int(args.chunk_mb * 1e6)
    rows = [("one TCP stream (socket)", [tcp_once(nbytes) for _run in range(args.repeat)])]
    rows.append(("gloo send/recv, %.0f MB chunks" % args.chunk_mb,
                 [gloo_once(nbytes, chunk) for _run in range(args.repeat)]))
    print("| %.0f MB over 127.0.0.1 | seconds (median of %d) | MB/s | range (s) |" % (args.mb, args.repeat))
    print("|---|---:|---:|---|")
    for name, secs in rows:
        med = statistics.median(secs)
        print("| %s | %.2f | %.0f | %.2f-%.2f |" % (name, med, args.mb / med, min(secs), max(secs)))


if __name__ == "__main__":
    main()
