"""``dspark bench``'s comparisons: ratios against the best fixed K, no speculation and
plain adaptive, paired within repeats."""

from __future__ import annotations

import numpy as np

from dspark.bench.report import compare
from dspark.bench.settings import Setting, parse_variant


def test_compare_reports_ratios_against_best_fixed_and_no_spec():
    rows = [
        {"concurrency": 1, "spec": "none", "label": "no spec", "tok_s": 10.0},
        {"concurrency": 1, "spec": "fixed", "label": "K=1", "tok_s": 12.0},
        {"concurrency": 1, "spec": "fixed", "label": "K=3", "tok_s": 15.0},
        {"concurrency": 1, "spec": "adaptive", "label": "adaptive≤7", "tok_s": 14.7},
    ]
    [line] = compare(rows)
    assert "0.980x best fixed (K=3)" in line and "1.470x no spec" in line
    assert np.isclose(14.7 / 15.0, 0.98)
    assert "paired" not in line  # one repeat: nothing to pair


def test_compare_pairs_repeats_that_shared_the_machine_speed():
    # The machine ran twice as fast in repeat 2: adaptive beats K=2 within two of the three
    # repeats (paired median 1.05) while the ratio of medians says it loses.
    rows = [
        {
            "concurrency": 4,
            "spec": "none",
            "label": "no spec",
            "tok_s": 20.0,
            "tok_s_runs": [10.0, 40.0, 20.0],
        },
        {
            "concurrency": 4,
            "spec": "fixed",
            "label": "K=2",
            "tok_s": 30.0,
            "tok_s_runs": [20.0, 40.0, 30.0],
        },
        {
            "concurrency": 4,
            "spec": "adaptive",
            "label": "adaptive≤7",
            "tok_s": 24.0,
            "tok_s_runs": [22.0, 42.0, 24.0],
        },
    ]
    [line] = compare(rows)
    assert "0.800x best fixed (K=2) [paired over 3 repeats: median 1.050, 0.800-1.100]" in line
    assert "1.200x no spec [paired over 3 repeats: median 1.200, 1.050-2.200]" in line


def test_compare_also_pairs_the_repeats_with_the_host_at_full_speed():
    # Four repeats; the host probe (ms) says the host ran slow in repeat 1 for K=3 and in
    # repeat 3 for adaptive (either end of a run counts), full speed otherwise (at most
    # 1.25 x the fastest reading, 0.40): the full-speed pairs are repeats 0 and 2.
    fast, slow, half = (0.40, 0.42), (0.70, 0.66), (0.41, 0.52)
    rows = [
        {
            "concurrency": 16,
            "spec": "fixed",
            "label": "K=3",
            "tok_s": 100.0,
            "tok_s_runs": [100.0, 80.0, 100.0, 100.0],
            "probe_ms_runs": [fast, slow, fast, fast],
        },
        {
            "concurrency": 16,
            "spec": "adaptive",
            "label": "adaptive≤7",
            "tok_s": 95.0,
            "tok_s_runs": [102.0, 60.0, 104.0, 80.0],
            "probe_ms_runs": [fast, fast, fast, half],
        },
    ]
    [line] = compare(rows)
    assert (
        "[paired over 4 repeats: median 0.910, 0.750-1.040; "
        "host at full speed in both: median 1.030 over 2]" in line
    )
    # Every repeat at full speed (or no probes): the paired median alone.
    rows[0]["probe_ms_runs"] = rows[1]["probe_ms_runs"] = [fast] * 4
    [line] = compare(rows)
    assert "0.750-1.040]" in line and "full speed" not in line


def test_a_variant_is_compared_with_the_plain_adaptive_of_its_repeats():
    plain = Setting("adaptive", 7)
    calibrated = parse_variant("cal:settle=on", 7)
    assert (plain.label, calibrated.label) == ("adaptive≤7", "adaptive≤7 cal")
    rows = [
        {
            "concurrency": 16,
            "spec": "fixed",
            "label": "K=3",
            "tok_s": 100.0,
            "tok_s_runs": [100.0, 90.0, 110.0],
        },
        {
            "concurrency": 16,
            "spec": "adaptive",
            "label": plain.label,
            "tok_s": 95.0,
            "tok_s_runs": [95.0, 99.0, 100.0],
        },
        {
            "concurrency": 16,
            "spec": "adaptive",
            "label": calibrated.label,
            "tok_s": 104.5,
            "tok_s_runs": [104.5, 90.0, 120.0],
        },
    ]
    first, second = compare(rows)
    assert first.startswith("concurrency 16: adaptive 95.0 tok/s, 0.950x best fixed (K=3)")
    assert "adaptive≤7 [" not in first  # the plain variant is not compared with itself
    # paired variant / plain: 1.1, 0.909, 1.2 -> median 1.100
    assert second.startswith("concurrency 16: adaptive cal 104.5 tok/s, 1.045x best fixed")
    assert second.endswith("1.100x adaptive≤7 [paired over 3 repeats: median 1.100, 0.909-1.200]")


def test_variants_are_compared_with_plain_adaptive_whatever_the_row_order():
    rows = [
        {"concurrency": 4, "spec": "adaptive", "label": "adaptive≤7 m", "tok_s": 12.0},
        {"concurrency": 4, "spec": "adaptive", "label": "adaptive≤7", "tok_s": 10.0},
    ]
    plain, variant = compare(rows)
    assert plain == "concurrency 4: adaptive 10.0 tok/s"
    assert variant == "concurrency 4: adaptive m 12.0 tok/s, 1.200x adaptive≤7"
