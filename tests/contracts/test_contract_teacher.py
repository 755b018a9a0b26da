"""The teacher cache's manifest (tests/fixtures/contracts/teacher-manifest.json), as
today's ``build_teacher_cache`` wrote it: today's reader takes it, and today's builder
writes the same."""

from __future__ import annotations

import shutil

from tasks.train.teacher import MANIFEST, TEACHER_FORMAT, TeacherManifest, read_manifest


def test_todays_reader_takes_the_manifest(fixtures, tmp_path):
    shutil.copy(fixtures / "teacher-manifest.json", tmp_path / MANIFEST)
    manifest = read_manifest(tmp_path)
    assert isinstance(manifest, TeacherManifest) and manifest.format == TEACHER_FORMAT
    assert manifest.shards and manifest.tokens == sum(s.tokens for s in manifest.shards)
    assert set(manifest.target) >= {"hidden_size", "vocab_size", "embedding_digest"}


def test_todays_builder_writes_the_same_manifest(world, gen, fixtures):
    built = gen.build_teacher_manifest(world)
    stored = gen.read_json(fixtures / "teacher-manifest.json")
    assert gen.name_paths(built) == gen.name_paths(stored)  # names a key changed
    assert built == stored
