"""The soak (dspark.bench.soak) against a real server: 64 clients for three rounds of 20 s,
half of them hanging up at random (scripts/soak.py runs the same against ``dspark serve``)."""

import pytest

from dspark.bench.soak import SoakConfig, problems, run_soak


@pytest.fixture(scope="module")
def soak_server(smollm2):
    from tests.server.conftest import RunningServer

    running = RunningServer(max_pending=256, max_num_seqs=16, api_key="soak-key")
    yield running
    running.close()


def soak(server, rounds: int, seconds: float) -> dict:
    config = SoakConfig(server.base, clients=64, api_key=server.api_key, max_tokens=(2, 12))
    return run_soak(config, rounds, seconds)


def test_a_soak_loses_nothing_and_leaks_nothing(soak_server):
    result = soak(soak_server, rounds=3, seconds=20.0)
    assert problems(result) == []
    rounds = result["rounds"]
    assert sum(r.cancelled for r in rounds) > 0  # hang-ups really happened
    assert sum(r.completed for r in rounds) >= 3
