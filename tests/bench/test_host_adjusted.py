"""``scripts/host_adjusted.py``: settings compared at one host speed."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "host_adjusted.py"


def load_script():
    spec = importlib.util.spec_from_file_location("host_adjusted", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows_at(rates: dict[str, float], probes: dict[str, list[float]], slope: float, noise=None):
    """Runs whose tok/s is the setting's rate at a 0.5 ms probe, scaled by
    (probe / 0.5) ** slope (times ``noise`` per run, if given)."""
    rows = []
    for label, rate in rates.items():
        runs = [rate * (p / 0.5) ** slope for p in probes[label]]
        if noise is not None:
            runs = [r * n for r, n in zip(runs, noise[label], strict=True)]
        rows.append(
            {
                "label": label,
                "concurrency": 16,
                "tok_s_runs": runs,
                "probe_ms_runs": [[p, p] for p in probes[label]],
            }
        )
    return rows


def test_the_fit_reads_every_setting_at_one_host_speed(tmp_path):
    script = load_script()
    # K = 3 ran with the host slow (about 0.8 ms), K = 4 in between, adaptive fast
    # (0.45): by medians adaptive leads the fastest fixed K (K = 4) by 1.17x, yet at one
    # host speed it runs 0.95x K = 3 (and K = 4 0.90x).
    rates = {"K=3": 4000.0, "K=4": 3600.0, "adaptive≤7": 3800.0}
    probes = {"K=3": [0.8, 0.75, 0.85], "K=4": [0.5, 0.6, 0.55], "adaptive≤7": [0.45] * 3}
    rows = rows_at(rates, probes, slope=-0.5)
    constants, _, slope, spread = script.fit_level(rows)
    assert slope == pytest.approx(-0.5)
    assert np.exp(constants[2] - constants[0]) == pytest.approx(0.95)
    assert spread == pytest.approx(0.0, abs=1e-9)
    path = tmp_path / "run" / "bench.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"rows": rows}))
    (line,) = script.report(path)
    assert "at one host speed 0.950x K=3" in line
    medians = 3800 * 0.9**-0.5 / (3600 * 1.1**-0.5)  # adaptive at 0.45 ms, K = 4 at 0.55
    assert f"medians {medians:.3f}x K=4" in line


def test_noise_widens_the_error_and_runs_without_probes_are_skipped(tmp_path):
    script = load_script()
    rates = {"K=3": 4000.0, "adaptive≤7": 3800.0}
    probes = {"K=3": [0.5, 0.8, 0.6, 0.7], "adaptive≤7": [0.45, 0.7, 0.9, 0.5]}
    noise = {"K=3": [1.03, 0.97, 1.0, 1.01], "adaptive≤7": [0.98, 1.02, 1.01, 0.99]}
    constants, cov, _, spread = script.fit_level(rows_at(rates, probes, -0.5, noise))
    assert spread > 0.01 and cov[1, 1] > 0.0
    assert np.exp(constants[1] - constants[0]) == pytest.approx(0.95, abs=0.05)
    bare = rows_at(rates, probes, -0.5)
    del bare[0]["probe_ms_runs"]
    assert script.fit_level(bare) is None
