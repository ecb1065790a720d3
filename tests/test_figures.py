"""dspark.figures: palette PNGs look like the figure and are smaller."""

from __future__ import annotations

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from PIL import Image  # noqa: E402

from dspark.figures import save_figure, shrink_png  # noqa: E402


def _line_figure():
    fig, ax = plt.subplots(figsize=(4, 3))
    x = np.linspace(0, 1, 50)
    for k in range(8):
        ax.plot(x, x**k, marker="o", label=f"K={k}")
    ax.legend(fontsize=6)
    ax.set_title("palette test")
    return fig


def test_saved_figure_is_a_palette_png_close_to_the_full_colour_one(tmp_path):
    fig = _line_figure()
    full = tmp_path / "full.png"
    fig.savefig(full, dpi=80)
    small = save_figure(fig, tmp_path / "small.png", dpi=80)
    plt.close(fig)
    with Image.open(small) as image:
        assert image.mode == "P"
        got = np.asarray(image.convert("RGB"), dtype=np.int16)
    with Image.open(full) as image:
        want = np.asarray(image.convert("RGB"), dtype=np.int16)
    assert got.shape == want.shape
    diff = np.abs(got - want)
    # Antialiased edges move to the nearest palette colour; nothing else changes much.
    assert diff.mean() < 1.0
    assert np.quantile(diff.max(axis=2), 0.999) < 48
    assert small.stat().st_size < full.stat().st_size


def test_shrink_rewrites_once_and_then_leaves_the_file_alone(tmp_path):
    fig = _line_figure()
    path = tmp_path / "plot.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    before, after = shrink_png(path)
    assert after < before
    assert path.stat().st_size == after
    again = shrink_png(path)
    assert again == (after, after)


def test_a_few_colours_survive_exactly(tmp_path):
    pixels = np.zeros((20, 30, 3), dtype=np.uint8)
    pixels[:, :10] = (255, 255, 255)
    pixels[:, 10:20] = (31, 119, 180)
    pixels[5:15, 20:] = (255, 127, 14)
    path = tmp_path / "flat.png"
    Image.fromarray(pixels).save(path)
    shrink_png(path)
    with Image.open(path) as image:
        assert np.array_equal(np.asarray(image.convert("RGB")), pixels)
