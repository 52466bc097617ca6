"""Stops every hf2q server a test started (what llama.cpp's conftest does for llama-server)."""
import pytest
import utils


@pytest.fixture(autouse=True)
def stop_server_after_each_test():
    yield
    for server in list(utils.server_instances):
        server.stop()
