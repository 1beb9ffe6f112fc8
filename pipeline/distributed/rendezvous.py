"""Rendezvous stores whose port cannot be taken by someone else, on the address they serve.

Picking a "free" port and binding it later races with every other process on the host: under a
loaded test run or a busy node another socket (a gloo pair, a Ray worker) takes it in between and
the group dies with EADDRINUSE. The host of a group therefore binds the store's socket itself, on
port 0, keeps it, and hands out the port the OS gave it; members join that port. The socket is
bound to one address (127.0.0.1 for a run on one machine, the node's IP on a cluster), never to
every interface, which is what the store would do on its own.
"""

from __future__ import annotations

import datetime
import os
import socket

import torch.distributed as dist


def host_store(timeout_s: float, port: int = 0, host: str = "127.0.0.1") -> dist.TCPStore:
    """The server side, listening on ``host`` only; ``port=0`` lets the OS choose. Read the
    chosen port from ``.port``."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.bind((host, port))
        sock.listen(1024)
        port = sock.getsockname()[1]
    except BaseException:
        sock.close()
        raise
    fd = sock.detach()  # the store's server owns the listening socket from here on
    try:
        return dist.TCPStore(
            host,
            port,
            None,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=timeout_s),
            master_listen_fd=fd,
        )
    except BaseException:
        os.close(fd)
        raise


def join_store(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """A member's connection (retries until the host is up or ``timeout_s`` passes)."""
    return dist.TCPStore(host, port, None, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
