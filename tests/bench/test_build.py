"""``dspark bench``'s engines: a setting's engine, a variant's fields in it."""

from __future__ import annotations

from dspark.bench.settings import Setting, parse_variant
from tests.bench.test_sweep import bench_args


def test_a_variant_reaches_the_engine(tiny, tmp_path):
    from dspark.bench.build import engine_for

    args = bench_args("--drafter", "ngram", "--out", str(tmp_path))
    assert args.variant == []
    variant = parse_variant("v:throughput_gate=off,kv_regions=off", 3)
    on = engine_for(tiny, variant, 2, args)
    off = engine_for(tiny, Setting("adaptive", 3), 2, args)
    assert on.policy.gate is None and off.policy.gate is not None  # an AdaptiveConfig field
    assert on.runner.kv_regions == 0 and off.runner.kv_regions == 2  # an EngineConfig one
    # A variant profiles apart, and may change a field the bench sets itself.
    assert on.config.profile_path != off.config.profile_path
    assert on.config.profile_path.endswith("-v.json")
    padded = engine_for(tiny, parse_variant("p:graph_padding_budget=0", 3), 2, args)
    assert padded.config.graph_padding_budget == 0.0
    assert off.config.graph_padding_budget == args.graph_padding_budget != 0.0
