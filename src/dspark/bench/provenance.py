"""Which code produced a result: a digest of the package's own source files.

A benchmark's JSON names the code it ran by this digest rather than by a commit: a copy
of a working tree (one synced to another machine, say) can carry stale git metadata,
and a tree with edits has no commit at all, while the digest follows exactly the files
that ran.
To match a result to a commit, check the commit out and run
``python -m dspark.bench.provenance`` (or compare digests of two checkouts).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

DIGEST_CHARS = 16


def source_digest(root: Path | None = None) -> str:
    """The first ``DIGEST_CHARS`` hex characters of a SHA-256 over every ``*.py`` file
    under ``root`` (default: the installed ``dspark`` package), by relative path and
    content, in path order: it changes when any file's content, name or presence does."""
    if root is None:
        import dspark

        root = Path(dspark.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:DIGEST_CHARS]


if __name__ == "__main__":
    print(source_digest())
