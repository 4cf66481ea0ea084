import os

import pytest

from .harness import Cluster
from .real_engines import in_ci, llama_server

MODES = ["embedded"]
if os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"):
    MODES.append("production")


@pytest.fixture(params=MODES)
def cluster(request, tmp_path):
    """A control plane with no agents yet; embedded, and production when CI gives PostgreSQL and Redis."""
    c = Cluster(tmp_path, production=request.param == "production")
    try:
        c.start_server()
        yield c
    finally:
        c.close()


def pytest_collection_modifyitems(items):
    for item in items:
        if "/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def llama_server_binary():
    """The llama-server llmgw built (`llmgw engines build llamacpp`): skipped without it,
    failed in CI, which must test a real one."""
    path, why = llama_server()
    if path is None:
        if in_ci():
            pytest.fail(f"CI must test a real llama-server, and cannot: {why}.")
        pytest.skip(why)
    return path
