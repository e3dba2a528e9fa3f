"""The document store's files: content-addressed requests, write-once results, pruning."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.storage import room
from service.storage.release_documents import DIGEST_CHARS, DocumentStore, digest


@given(st.text())
def test_digest_is_the_sha1_prefix_lua_computed(text: str) -> None:
    """The old Valkey store's settle named a request file ``string.sub(redis.sha1hex(
    request), 1, 16)`` over the bytes: ``migrate-from-valkey`` finds it by that name."""
    want = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:DIGEST_CHARS]
    assert digest(text) == want and len(want) == 16


def test_requests_are_content_addressed_and_written_once(tmp_path: Path) -> None:
    docs = DocumentStore(tmp_path)
    a, b = docs.save_request("rel_1", '{"a": 1}'), docs.save_request("rel_1", '{"a": 2}')
    assert a != b and docs.save_request("rel_1", '{"a": 1}') == a  # idempotent
    assert docs.load_request("rel_1", a) == '{"a": 1}'
    assert docs.load_request("rel_1", b) == '{"a": 2}'
    assert docs.load_request("rel_1", "0" * 16) is None
    assert not list(tmp_path.glob("rel_1/.tmp-*"))  # no temporary file left behind


def test_results_are_never_replaced_and_prune_keeps_the_named_ones(tmp_path: Path) -> None:
    docs = DocumentStore(tmp_path)
    for attempt in (1, 2, 3):
        docs.save_result("rel_1", attempt, f'"{attempt}"')
    with pytest.raises(FileExistsError):
        docs.save_result("rel_1", 2, '"other"')
    assert docs.load_result("rel_1", 2) == '"2"'
    keep = docs.save_request("rel_1", "{}")
    docs.save_request("rel_1", '{"old": 1}')
    docs.save_analysis("rel_1", "ana_1", "{}")
    removed = docs.prune("rel_1", keep_result=2, keep_request=keep)
    assert len(removed) == 3 and "result.2.json" not in removed
    assert sorted(p.name for p in (tmp_path / "rel_1").iterdir()) == [
        "analyses", f"request.{keep}.json", "result.2.json"]
    docs.discard_result("rel_1", 2)
    docs.discard_result("rel_1", 2)  # gone already: fine
    assert docs.load_result("rel_1", 2) is None


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden", "a\\b"])
def test_ids_never_become_paths(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError):
        DocumentStore(tmp_path).folder(bad)


@pytest.mark.parametrize("allocates", [True, False])
def test_the_preflight_takes_room_and_leaves_nothing(tmp_path: Path, allocates: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``fallocate(2)`` (the file system allocates: no fsync) or without it (the
    bytes written, then fsynced): the release's folder made, no probe left behind."""
    if not allocates:
        monkeypatch.setattr(room, "_FALLOCATE", None)
    else:
        assert room._FALLOCATE is not None  # Linux's C library has it
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    docs = DocumentStore(tmp_path)
    docs.preflight("rel_1", 2)
    assert list(docs.folder("rel_1").iterdir()) == []
    assert len(synced) == (0 if allocates else 1)


def test_the_preflight_raises_what_the_file_system_answers(tmp_path: Path) -> None:
    """An error of ``fallocate(2)`` is the OSError the run refunds on (here EBADF: a
    file opened read-only), never taken for a file system without it."""
    probe = tmp_path / "probe"
    probe.touch()
    fd = os.open(probe, os.O_RDONLY)
    try:
        with pytest.raises(OSError) as caught:
            room.allocate(fd, 1 << 20)
    finally:
        os.close(fd)
    assert caught.value.errno == errno.EBADF
