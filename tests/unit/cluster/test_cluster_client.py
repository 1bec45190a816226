"""The cluster client's errors say what went wrong in words (issue 23: a cut SSH
connection during the cluster side showed urllib3's raw pool text)."""

import socket

import pytest
import urllib3
from urllib3.exceptions import MaxRetryError, NewConnectionError, ProtocolError

from bootstrap.cluster.client import connection_trouble


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def real_refusal() -> Exception:
    """What urllib3 raises for a tunnel whose local end no longer listens."""
    pool = urllib3.HTTPSConnectionPool("127.0.0.1", closed_port(), retries=0)
    with pytest.raises(MaxRetryError) as caught:
        pool.request("GET", "/api/v1/nodes")
    return caught.value


@pytest.mark.parametrize("error", [
    real_refusal(),
    MaxRetryError(None, "/api", NewConnectionError(urllib3.connection.HTTPSConnection("127.0.0.1", 1), "refused")),
    ProtocolError("Connection aborted.", ConnectionResetError(104, "Connection reset by peer")),
])
def test_a_lost_tunnel_is_said_without_urllib3s_pool_text(error):
    said = connection_trouble(error)
    assert said.startswith("the connection through the SSH tunnel failed (")
    assert "ConnectionPool(" not in said and "object at 0x" not in said and "host=" not in said, said
