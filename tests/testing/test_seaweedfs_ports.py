"""The SeaweedFS launcher's ports: a server's seven ports are distinct and avoid its S3 port."""

from __future__ import annotations

import socket

from deltaflow.testing._seaweedfs import _distinct_free_ports


def test_the_ports_are_distinct_free_and_not_the_s3_port() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        s3_port = int(held.getsockname()[1])
        for _ in range(50):
            ports = _distinct_free_ports(7, s3_port)
            assert len(set(ports)) == 7
            assert s3_port not in ports
        for port in ports:  # each was free: it can be bound now
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
