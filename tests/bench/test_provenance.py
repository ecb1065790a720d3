import hashlib
import re

from dspark.bench.provenance import source_digest


def _tree(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_digest_is_the_sha256_of_paths_and_contents_in_path_order(tmp_path):
    _tree(tmp_path, {"b.py": "x = 1\n", "a/c.py": "y = 2\n", "notes.txt": "ignored"})
    by_hand = hashlib.sha256(b"a/c.py\0y = 2\n\0b.py\0x = 1\n\0").hexdigest()[:16]
    assert source_digest(tmp_path) == by_hand


def test_digest_follows_content_names_and_presence(tmp_path):
    _tree(tmp_path, {"a.py": "x = 1\n", "b.py": "y = 2\n"})
    first = source_digest(tmp_path)
    assert source_digest(tmp_path) == first  # stable
    (tmp_path / "a.py").write_text("x = 3\n")
    edited = source_digest(tmp_path)
    assert edited != first
    (tmp_path / "a.py").rename(tmp_path / "c.py")
    assert source_digest(tmp_path) not in (first, edited)
    (tmp_path / "c.py").unlink()
    assert source_digest(tmp_path) == hashlib.sha256(b"b.py\0y = 2\n\0").hexdigest()[:16]


def test_the_installed_package_has_a_digest():
    assert re.fullmatch(r"[0-9a-f]{16}", source_digest())
