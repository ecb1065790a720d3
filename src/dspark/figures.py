"""Saving matplotlib figures small enough to keep in the repository.

Our plots are lines and text on a white ground, so a 256-colour palette loses nothing a
reader can see and makes the files much smaller, which matters for figures kept in the
repository.
"""

from __future__ import annotations

from io import BytesIO
from pathlib import Path

from PIL import Image


def palette_png(image: Image.Image) -> Image.Image:
    """The image in at most 256 colours, without dithering (flat areas stay flat)."""
    if image.mode == "P":
        return image
    return image.convert("RGB").quantize(
        colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE
    )


def save_figure(fig, path: str | Path, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` as a palette PNG."""
    path = Path(path)
    buffer = BytesIO()
    fig.savefig(buffer, dpi=dpi, format="png")
    buffer.seek(0)
    with Image.open(buffer) as image:
        palette_png(image).save(path, format="PNG", optimize=True)
    return path


def shrink_png(path: str | Path) -> tuple[int, int]:
    """Rewrite one PNG as a palette PNG in place; returns (bytes before, bytes after).

    A file that would not get smaller is left as it is.
    """
    path = Path(path)
    before = path.stat().st_size
    with Image.open(path) as image:
        image.load()
        small = palette_png(image)
    buffer = BytesIO()
    small.save(buffer, format="PNG", optimize=True)
    if buffer.tell() >= before:
        return before, before
    path.write_bytes(buffer.getvalue())
    return before, buffer.tell()
