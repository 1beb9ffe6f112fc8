"""The rendezvous store holds its port from the moment it is chosen (the CI failure this fixes:
a port picked "free", then taken by another socket before the learner bound it: EADDRINUSE)."""

from __future__ import annotations

import socket

import pytest

from pipeline.distributed.rendezvous import host_store, join_store


def test_the_hosted_port_is_held_and_members_reach_it():
    store = host_store(10.0)
    with socket.socket() as s, pytest.raises(OSError):
        s.bind(("127.0.0.1", store.port))  # nobody else can take it between choosing and joining
    member = join_store("127.0.0.1", store.port, 10.0)
    member.set("rank1", "ready")
    assert store.get("rank1") == b"ready"


def test_two_hosts_never_share_a_port():
    a, b = host_store(10.0), host_store(10.0)
    assert a.port != b.port and a.port > 0 and b.port > 0


def test_a_member_with_no_host_times_out_instead_of_hanging():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but never listening: nothing answers
        with pytest.raises(Exception, match="(?i)timed out|timeout|connect"):
            join_store("127.0.0.1", port, 1.0)


def test_the_store_listens_on_its_address_only():
    """Not on every interface (what a TCPStore does on its own): a run on one machine serves
    nothing beyond the loopback interface."""
    import psutil

    store = host_store(10.0)
    listening = [
        c.laddr
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == store.port
    ]
    assert [a.ip for a in listening] == ["127.0.0.1"]
