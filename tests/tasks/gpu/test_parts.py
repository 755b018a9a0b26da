"""Kit files cut into parts and joined back, every checksum checked."""

import pytest

from serving.errors import BadInputError
from tasks.gpu.parts import join_file, split_file


def test_a_file_splits_into_parts_within_the_size_and_joins_back(tmp_path):
    source = tmp_path / "model.bin"
    source.write_bytes(bytes(range(256)) * 40)  # 10240 bytes
    entry = split_file(source, tmp_path / "kit", "model.bin", 4096)
    assert [p.bytes for p in entry.parts] == [4096, 4096, 2048]
    joined = join_file(tmp_path / "kit", entry, tmp_path / "there" / "model.bin")
    assert joined.read_bytes() == source.read_bytes()
    # Joined again: nothing to do (a re-run of setup).
    assert join_file(tmp_path / "kit", entry, joined) == joined


def test_an_exact_multiple_of_the_part_size_has_no_empty_part(tmp_path):
    source = tmp_path / "x"
    source.write_bytes(b"a" * 8192)
    entry = split_file(source, tmp_path / "kit", "x", 4096)
    assert [p.bytes for p in entry.parts] == [4096, 4096]


def test_a_damaged_or_missing_part_is_named(tmp_path):
    source = tmp_path / "x"
    source.write_bytes(b"abc" * 3000)
    kit = tmp_path / "kit"
    entry = split_file(source, kit, "x", 4096)
    (kit / entry.parts[1].path).write_bytes(b"z" * entry.parts[1].bytes)
    with pytest.raises(BadInputError, match=r"part parts/x\.part001 is damaged"):
        join_file(kit, entry, tmp_path / "out")
    (kit / entry.parts[1].path).unlink()
    with pytest.raises(BadInputError, match=r"part parts/x\.part001 is missing"):
        join_file(kit, entry, tmp_path / "out")
    assert not (tmp_path / "out").exists()
