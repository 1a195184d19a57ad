"""RAG_INGEST_ROOTS: nothing outside the roots is read, whatever the path says, and nothing when unset."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from iris_rag.errors import InvalidParametersError
from iris_rag.ingestion.paths import read_paths
from iris_rag.ingestion.roots import IngestRoots

MAX = 10_000_000


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """root/ with notes (one in a subfolder) and, beside it, a secret outside the root."""
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "a.md").write_text("# A\n\nInside the root.", encoding="utf-8")
    (root / "sub" / "b.txt").write_text("Also inside.", encoding="utf-8")
    (tmp_path / "secret.txt").write_text("Outside the root.", encoding="utf-8")
    return root


def test_setting_is_split_on_pathsep_and_commas_and_resolved(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    roots = IngestRoots.parse(f"{tmp_path}/x/../x{os.pathsep} {tmp_path}/y ,")
    assert roots.folders == ((tmp_path / "x").resolve(), (tmp_path / "y").resolve())


def test_unset_roots_refuse_every_path_naming_the_variable(tree: Path) -> None:
    with pytest.raises(InvalidParametersError, match="RAG_INGEST_ROOTS is not set"):
        IngestRoots.parse("").locate(str(tree / "a.md"))
    with pytest.raises(InvalidParametersError, match="RAG_INGEST_ROOTS"):
        read_paths([str(tree)], IngestRoots.parse(" , "), max_bytes=MAX)


def test_inside_is_allowed_and_located_under_its_root(tree: Path) -> None:
    roots = IngestRoots.parse(str(tree))
    assert roots.locate(str(tree / "sub" / "b.txt")) == (tree.resolve(), (tree / "sub" / "b.txt").resolve())
    assert roots.locate(str(tree)) == (tree.resolve(), tree.resolve())


def test_outside_and_dot_dot_escapes_are_refused(tree: Path) -> None:
    roots = IngestRoots.parse(str(tree))
    for path in [
        tree.parent / "secret.txt",
        tree / ".." / "secret.txt",
        tree / "sub" / ".." / ".." / "secret.txt",
    ]:
        with pytest.raises(InvalidParametersError, match="outside RAG_INGEST_ROOTS"):
            roots.locate(str(path))


def test_outside_paths_get_one_answer_whether_or_not_they_exist(tree: Path) -> None:
    roots = IngestRoots.parse(str(tree))
    messages = []
    for name in ["secret.txt", "no-such-file.txt"]:
        with pytest.raises(InvalidParametersError) as refused:
            roots.locate(str(tree.parent / name))
        messages.append(refused.value.message.replace(name, "NAME"))
    assert messages[0] == messages[1]


def test_relative_and_missing_paths_are_refused(tree: Path) -> None:
    roots = IngestRoots.parse(str(tree))
    with pytest.raises(InvalidParametersError, match="must be absolute"):
        roots.locate("a.md")
    with pytest.raises(InvalidParametersError, match="does not exist"):
        roots.locate(str(tree / "missing.md"))


def test_a_nul_character_in_a_path_is_refused_as_a_bad_parameter(tree: Path) -> None:
    roots = IngestRoots.parse(str(tree))
    with pytest.raises(InvalidParametersError, match="NUL"):
        roots.locate(f"{tree / 'a.md'}\x00.pdf")


def test_a_symlink_named_directly_that_leads_outside_is_refused(tree: Path) -> None:
    (tree / "link.txt").symlink_to(tree.parent / "secret.txt")
    (tree / "linked-dir").symlink_to(tree.parent, target_is_directory=True)
    roots = IngestRoots.parse(str(tree))
    for path in [tree / "link.txt", tree / "linked-dir" / "secret.txt"]:
        with pytest.raises(InvalidParametersError, match="outside RAG_INGEST_ROOTS"):
            roots.locate(str(path))


def test_symlinks_met_in_a_folder_walk_that_lead_outside_are_skipped_and_reported(tree: Path) -> None:
    (tree / "sub" / "leak.txt").symlink_to(tree.parent / "secret.txt")
    (tree / "escape").symlink_to(tree.parent, target_is_directory=True)
    (tree / "inside-link.md").symlink_to(tree / "a.md")
    read = read_paths([str(tree)], IngestRoots.parse(str(tree)), max_bytes=MAX)
    # inside-link.md is a.md itself, read once.
    assert sorted(d.id for d in read.documents if d.id) == ["a.md", "sub/b.txt"]
    assert all("Outside" not in d.content for d in read.documents)
    reported = sorted(Path(e["message"].split(":")[0]).name for e in read.errors)
    assert reported == ["escape", "leak.txt"]
    assert {e["code"] for e in read.errors} == {"UNREADABLE_FILE"}


def test_the_byte_cap_refuses_the_call_before_reading(tree: Path) -> None:
    size = sum(p.stat().st_size for p in tree.rglob("*") if p.is_file())
    roots = IngestRoots.parse(str(tree))
    with pytest.raises(InvalidParametersError, match="RAG_INGEST_MAX_BYTES") as refused:
        read_paths([str(tree)], roots, max_bytes=size - 1)
    assert refused.value.details == {"bytes": size, "max_bytes": size - 1}
    assert len(read_paths([str(tree)], roots, max_bytes=size).documents) == 2


def test_a_file_named_twice_is_read_once_and_ids_are_relative_to_the_root(tree: Path) -> None:
    paths = [str(tree / "sub"), str(tree / "sub" / "b.txt"), str(tree / "a.md")]
    read = read_paths(paths, IngestRoots.parse(str(tree)), max_bytes=MAX)
    assert [(d.id, d.metadata["source_path"]) for d in read.documents] == [
        ("sub/b.txt", "sub/b.txt"),
        ("a.md", "a.md"),
    ]
    assert read.origins == [0, 2]


def test_a_folder_without_supported_files_is_reported(tree: Path) -> None:
    (tree / "empty").mkdir()
    (tree / "empty" / "image.png").write_bytes(b"\x89PNG")
    read = read_paths([str(tree / "empty")], IngestRoots.parse(str(tree)), max_bytes=MAX)
    assert read.documents == []
    assert [e["code"] for e in read.errors] == ["NO_FILES"]
