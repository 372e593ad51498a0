"""Fixtures shared by the module_utils tests."""
from __future__ import annotations

import socket

import pytest


@pytest.fixture
def free_port():
    """A function returning a loopback TCP port nothing listens on (bound, then closed)."""
    def pick():
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        return port

    return pick
