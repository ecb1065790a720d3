"""The soak (dspark.bench.soak) against a real server, 64 clients of which half hang up at
random: three rounds of 3 s in the default suite, the full three rounds of 20 s behind
``-m slow`` (scripts/soak.py runs that against ``dspark serve``)."""

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


@pytest.mark.parametrize(
    "seconds", [3.0, pytest.param(20.0, marks=pytest.mark.slow)], ids=["short", "full"]
)
def test_a_soak_loses_nothing_and_leaks_nothing(soak_server, seconds):
    result = soak(soak_server, rounds=3, seconds=seconds)
    assert problems(result) == []
    rounds = result["rounds"]
    assert sum(r.cancelled for r in rounds) > 0  # hang-ups really happened
    assert sum(r.completed for r in rounds) >= 3
