"""What the agent tests share: a fake engine to run, a bound on waits, free ports."""

import socket
import sys
from pathlib import Path

FAKE_ENGINE = [sys.executable, str(Path(__file__).with_name("fake_engine.py"))]
# A bound on waits so a broken agent fails the test instead of hanging it.
PATIENCE_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
