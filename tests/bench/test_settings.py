"""``dspark bench``'s settings: ``--variant`` parsed into EngineConfig fields and
checked before any run, and the interleaved run order."""

from __future__ import annotations

import pytest

from dspark.bench.settings import Setting, job_order, parse_variant
from tests.bench.test_sweep import bench_args


def test_jobs_alternate_the_settings_order_between_repeats():
    settings = [Setting("none", 0), Setting("fixed", 2), Setting("adaptive", 7)]
    jobs = job_order(3, [1, 4], settings)
    assert jobs[:3] == [(0, 1, s) for s in settings]
    assert jobs[6:9] == [(1, 1, s) for s in reversed(settings)]
    assert jobs[15:] == [(2, 4, s) for s in settings]
    assert len(jobs) == 3 * 2 * 3


def test_variants_parse_into_engine_config_fields_of_their_types():
    setting = parse_variant("s2:settle=off, throughput_gate=off", 5)
    assert setting == Setting("adaptive", 5, "s2", (("settle", "off"), ("throughput_gate", False)))
    assert parse_variant("g:graph_padding_budget=0", 7).overrides == (
        ("graph_padding_budget", 0.0),
    )
    assert parse_variant("p:profile_path=none", 7).overrides == (("profile_path", None),)
    for bad, named in [
        ("nocolon", "TAG:FIELD=VALUE"),
        ("x=y:settle=off", "letters, digits and underscores"),
        (":settle=off", "TAG:FIELD=VALUE"),
        ("x:setle=off", "'setle=off'"),
        ("x:num_drafts=3", "other than spec"),
        ("x:adaptive=off", "'adaptive=off'"),
        ("x:fill_padding=maybe", "takes on or off"),
        ("x:graph_padding_budget=big", "takes a number"),
    ]:
        with pytest.raises(ValueError, match=named):
            parse_variant(bad, 7)


def test_bad_variants_fail_before_any_run():
    from dspark.bench.settings import checked_variants

    for argv, named in [
        (["--variant", "s:settle=sometimes"], "--variant s: settle must be 'auto', 'on' or"),
        (["--variant", "g:graph_padding_budget=-1"], "--variant g: graph_padding_budget"),
        (["--variant", "a:settle=on", "--variant", "a:settle=off"], "must differ"),
        (["--variant", "a:settle=on", "--no-adaptive"], "--no-adaptive"),
    ]:
        with pytest.raises(ValueError, match=named):
            checked_variants(bench_args(*argv))
    good = checked_variants(bench_args("--variant", "ng:throughput_gate=off"))
    assert [v.label for v in good] == ["adaptive≤7 ng"]
