"""Rewrite PNGs as palette PNGs in place (see dspark.figures); prints what it saved.

PYTHONPATH=src python scripts/shrink_pngs.py docs/results [more folders or files]
"""

from __future__ import annotations

import sys
from pathlib import Path

from dspark.figures import shrink_png


def main(paths: list[str]) -> None:
    files = []
    for name in paths or ["docs/results"]:
        p = Path(name)
        files.extend(sorted(p.rglob("*.png")) if p.is_dir() else [p])
    total_before = total_after = 0
    for f in files:
        before, after = shrink_png(f)
        total_before += before
        total_after += after
    print(f"{len(files)} files: {total_before / 1e6:.1f} MB -> {total_after / 1e6:.1f} MB")


if __name__ == "__main__":
    main(sys.argv[1:])
