"""Where a source registered by reference may be (``service.sources.resolve``): whatever
path a request names, what is read lies under a configured root, real paths compared."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service import sources
from service.storage.objects import LocalStore

SEGMENTS = st.sampled_from(["a", "b", "a.parquet", "..", ".", "", "out", "out.parquet",
                            "%2e%2e", "root2"])


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``base/root`` (the allowed root) with Parquet files and links out of it, and
    ``base/root2`` and ``base/outside`` beside it."""
    base = tmp_path_factory.mktemp("tree")
    root, outside = base / "root", base / "outside"
    table = pa.table({"x": [1]})
    for folder in (root / "a", root / "b", outside, base / "root2"):
        folder.mkdir(parents=True)
        pq.write_table(table, folder / "a.parquet")
    (root / "out").symlink_to(outside, target_is_directory=True)
    (root / "out.parquet").symlink_to(outside / "a.parquet")
    return base, root


@settings(max_examples=300, deadline=None)
@given(st.lists(SEGMENTS, max_size=5))
def test_whatever_the_path_what_is_read_is_under_the_root(
        tree: tuple[Path, Path], segments: list[str]) -> None:
    _, root = tree
    url = "file://" + str(root) + "/" + "/".join(segments)
    try:
        source = sources.resolve(url, [root.as_uri()], endpoint=None, max_files=100)
    except sources.SourceError as err:
        assert err.status in {403, 422}
        inner = "/".join(segments).strip("/")
        if inner and any(s in {"..", ".", "", "%2e%2e"} for s in inner.split("/")):
            assert err.code == "source_invalid"
        return
    assert isinstance(source.store, LocalStore)
    for key in source.keys:
        real = Path(os.path.realpath(source.store.root / key))
        assert real.is_relative_to(root), (url, key)
    assert "out" not in segments and "out.parquet" not in segments


def test_a_root_is_a_whole_segment() -> None:
    assert sources._within("data/exports", "data")
    assert sources._within("data", "data")
    assert not sources._within("data2/x", "data")
    assert sources._within("anything", "")


def test_an_s3_source_is_checked_by_bucket_and_whole_segments() -> None:
    roots = ["s3://bucket/exports"]
    for url in ["s3://bucket/exports2/a.parquet", "s3://other/exports/a.parquet",
                "s3://bucket", "file:///exports"]:
        with pytest.raises(sources.SourceError) as caught:
            sources.resolve(url, roots, endpoint=None, max_files=10)
        assert (caught.value.status, caught.value.code) == (403, "source_not_allowed"), url
    for url in ["s3://bucket/exports/../x", "s3://bucket/exports/./x",
                "s3://bucket/exports//x", "s3:///exports", "s3://k:s@bucket/exports"]:
        with pytest.raises(sources.SourceError) as caught:
            sources.resolve(url, roots, endpoint=None, max_files=10)
        assert (caught.value.status, caught.value.code) == (422, "source_invalid"), url
