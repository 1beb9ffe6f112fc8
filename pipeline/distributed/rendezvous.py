"""Rendezvous stores whose port cannot be taken by someone else.

Picking a "free" port and binding it later races with every other process on the host: under a
loaded test run or a busy node another socket (a gloo pair, a Ray worker) takes it in between and
the group dies with EADDRINUSE. The host of a group therefore binds its store's server on port 0,
keeps the store, and hands out the port the OS gave it; members join that port.
"""
from __future__ import annotations

import datetime

import torch.distributed as dist


def host_store(timeout_s: float, port: int = 0) -> dist.TCPStore:
    """The server side, listening on every interface (members may be on other nodes); ``port=0``
    lets the OS choose. Read the chosen port from ``.port``."""
    return dist.TCPStore("0.0.0.0", port, None, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


def join_store(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """A member's connection (retries until the host is up or ``timeout_s`` passes)."""
    return dist.TCPStore(host, port, None, is_master=False,
                         timeout=datetime.timedelta(seconds=timeout_s))
