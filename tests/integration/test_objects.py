"""The object store's contract, run over both backends: a local directory and a real
S3-protocol server over HTTP on loopback (moto's, from the ``s3_server`` fixture; the
store knows only its endpoint and credentials)."""

from __future__ import annotations

import io
import socket
import threading
import time
import traceback
import tracemalloc
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.config import Config
from service.storage import objects
from service.storage.objects import (
    AlreadyExists,
    Credentials,
    LocalStore,
    NotFound,
    ObjectStore,
    ObjectStoreError,
    S3Store,
    Unavailable,
)
from service.storage.precompute_objects import ObjectCache
from tests.conftest import S3Server

MIB = 1024 * 1024


def s3_store(s3: S3Server, **options: Any) -> S3Store:
    """A store on a fresh prefix of the session's bucket (tests do not see each other)."""
    return S3Store(s3.bucket, "t-" + uuid.uuid4().hex, s3.endpoint_url,
                   Credentials(s3.access_key, s3.secret_key), "us-east-1", **options)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return LocalStore(tmp_path / "objects")
    return s3_store(request.getfixturevalue("s3_server"))


@pytest.fixture()
def boto(s3_server: S3Server) -> Any:
    """A plain boto3 client, to look at the bucket behind a store's back."""
    return boto3.client("s3", endpoint_url=s3_server.endpoint_url, region_name="us-east-1",
                        aws_access_key_id=s3_server.access_key,
                        aws_secret_access_key=s3_server.secret_key)


def test_round_trip(store: ObjectStore) -> None:
    body = np.random.default_rng(1).bytes(100_000)
    etag = store.put_new("datasets/d1/v1/data.parquet", body)
    assert store.get("datasets/d1/v1/data.parquet") == body
    assert store.head("datasets/d1/v1/data.parquet") == (len(body), etag)
    assert store.exists("datasets/d1/v1/data.parquet")
    with store.open("datasets/d1/v1/data.parquet") as fh:
        assert fh.seekable() and fh.size() == len(body)
        fh.seek(50_000)
        assert fh.read(10) == body[50_000:50_010]
    assert list(store.list()) == ["datasets/d1/v1/data.parquet"]
    store.delete("datasets/d1/v1/data.parquet")
    for call in (store.get, store.head, store.open):
        with pytest.raises(NotFound, match=r"no object datasets/d1/v1/data\.parquet"):
            call("datasets/d1/v1/data.parquet")
    assert not store.exists("datasets/d1/v1/data.parquet")
    assert list(store.list()) == []
    store.delete("datasets/d1/v1/data.parquet")  # gone already: not an error


def test_the_room_checks_answer_and_leave_nothing(store: ObjectStore) -> None:
    """What a POST and a run ask before a table is stored: both answer on a store that
    can take it, and the run's probe is gone after it (no key listed)."""
    store.check_room(1 << 20)
    store.preflight(1 << 20)
    assert list(store.list()) == []


def test_streams_and_empty_objects(store: ObjectStore) -> None:
    body = np.random.default_rng(2).bytes(3 * MIB + 17)
    etag = store.put_new("a/stream", io.BytesIO(body))
    assert store.get("a/stream") == body and store.head("a/stream").etag == etag
    store.put_new("a/empty", b"")
    store.put_new("a/empty-stream", io.BytesIO(b""))
    assert store.get("a/empty") == b"" and store.head("a/empty-stream").size == 0


def test_put_new_never_overwrites(store: ObjectStore) -> None:
    etag = store.put_new("k", b"first")
    for second in (b"second", io.BytesIO(b"second"), b"first"):
        with pytest.raises(AlreadyExists, match="object k already exists"):
            store.put_new("k", second)
    assert store.get("k") == b"first" and store.head("k") == (5, etag)


def test_a_replaced_object_gets_a_new_etag(store: ObjectStore) -> None:
    first = store.put_new("k", b"one")
    store.delete("k")
    time.sleep(0.01)
    assert store.put_new("k", b"two") != first


def test_racing_puts_one_wins(store: ObjectStore) -> None:
    """Eight threads put different bytes under one key at once, for 10 keys: exactly
    one put succeeds per key and the object holds its bytes."""
    writers = 8
    for round_ in range(10):
        key = f"race/{round_}"
        start = threading.Barrier(writers)
        won: list[int] = []
        refused: list[int] = []

        def put(n: int, key: str = key, start: threading.Barrier = start,
                won: list[int] = won, refused: list[int] = refused) -> None:
            start.wait()
            try:
                store.put_new(key, b"writer %d" % n)
                won.append(n)
            except AlreadyExists:
                refused.append(n)

        threads = [threading.Thread(target=put, args=(n,)) for n in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1 and len(refused) == writers - 1
        assert store.get(key) == b"writer %d" % won[0]


def test_a_failed_write_leaves_nothing(store: ObjectStore, boto: Any) -> None:
    """A stream that breaks midway (after a first S3 part was sent) leaves no object
    under the key, no temporary file and no pending multipart upload."""

    class Breaks(io.RawIOBase):
        def __init__(self) -> None:
            self.sent = 0

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            if self.sent >= 7 * MIB:
                raise OSError("the upload was cut")
            n = min(len(buffer), MIB)
            buffer[:n] = b"x" * n
            self.sent += n
            return n

    if isinstance(store, S3Store):
        store = s3_store_of(store, part_bytes=5 * MIB)
    with pytest.raises(OSError, match="the upload was cut"):
        store.put_new("broken", io.BufferedReader(Breaks()))
    assert not store.exists("broken") and list(store.list()) == []
    if isinstance(store, LocalStore):
        assert list((store.root / objects.TMP_DIR).iterdir()) == []
    elif isinstance(store, S3Store):
        pending = boto.list_multipart_uploads(Bucket=store.bucket, Prefix=store.prefix)
        assert pending.get("Uploads", []) == []


def s3_store_of(store: S3Store, **options: Any) -> S3Store:
    """The same bucket and prefix with other options."""
    return S3Store(store.bucket, store.prefix, store.endpoint, store._credentials,
                   "us-east-1", **options)


def test_multipart_upload_round_trip_and_condition(s3_server: S3Server, boto: Any) -> None:
    """A stream of more than one part goes up in parts; the condition is checked when
    the upload completes, and a refused upload is abandoned, not left pending."""
    store = s3_store(s3_server, part_bytes=5 * MIB)
    body = np.random.default_rng(3).bytes(11 * MIB + 5)
    etag = store.put_new("big", io.BytesIO(body))
    assert etag.endswith("-3")  # S3's tag of a 3-part upload
    assert store.get("big") == body and store.head("big") == (len(body), etag)
    with pytest.raises(AlreadyExists):
        store.put_new("big", io.BytesIO(body[::-1]))
    assert store.get("big") == body
    pending = boto.list_multipart_uploads(Bucket=s3_server.bucket, Prefix=store.prefix)
    assert pending.get("Uploads", []) == []


def _parquet(path: Path, row_groups: int, rows: int) -> int:
    """A Parquet file of incompressible columns, ``row_groups`` groups; its size."""
    rng = np.random.default_rng(4)
    schema = pa.schema([("x", pa.float64()), ("n", pa.int64())])
    with pq.ParquetWriter(path, schema, compression="none", use_dictionary=False) as writer:
        for _ in range(row_groups):
            writer.write_table(pa.table({"x": rng.random(rows),
                                         "n": rng.integers(0, 2**62, rows)}, schema=schema))
    return path.stat().st_size


#: every proxy pool a Peak made: a buffer allocated through one frees through it, so
#: none may be destroyed while pyarrow may still hold such a buffer (kept to the end)
_POOLS: list[pa.MemoryPool] = []


class Peak:
    """Peak bytes held by pyarrow (a proxy of the default memory pool, which Parquet
    decoding and S3 range reads allocate from) and by Python's heap (tracemalloc) while
    the block runs."""

    def __enter__(self) -> Peak:
        self._saved = pa.default_memory_pool()
        self._pool = pa.proxy_memory_pool(self._saved)
        _POOLS.append(self._pool)
        pa.set_memory_pool(self._pool)
        tracemalloc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.python = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        pa.set_memory_pool(self._saved)
        self.arrow = self._pool.max_memory()


def test_parquet_streams_row_group_by_row_group(store: ObjectStore, tmp_path: Path) -> None:
    """16 row groups of 1 MiB of values each: reading one group at a time through
    ``open`` holds a small part of them, while reading the file whole (the control,
    same measure) holds all of them; pyarrow.dataset reads the keys through
    ``filesystem``."""
    groups, rows = 16, 65_536
    values = groups * rows * 16  # bytes of the two 8-byte columns
    size = _parquet(tmp_path / "v.parquet", groups, rows)
    assert size >= values
    with (tmp_path / "v.parquet").open("rb") as fh:
        store.put_new("datasets/d/v1/data.parquet", fh)
    with Peak() as streamed, store.open("datasets/d/v1/data.parquet") as source:
        parquet = pq.ParquetFile(source)
        assert parquet.num_row_groups == groups
        total = 0.0
        for i in range(groups):
            total += pa.compute.sum(parquet.read_row_group(i).column("x")).as_py()
    with Peak() as whole, store.open("datasets/d/v1/data.parquet") as source:
        table = pq.read_table(source)
        assert table.num_rows == groups * rows
        assert total == pytest.approx(pa.compute.sum(table.column("x")).as_py(), rel=1e-12)
        del table
    print(f"file {size} B: streamed peak arrow {streamed.arrow} B, python "
          f"{streamed.python} B; whole arrow {whole.arrow} B")
    assert whole.arrow >= values  # the measure sees a whole read
    assert streamed.arrow < values / 4
    if isinstance(store, LocalStore):  # moto serves S3 from this process's Python heap
        assert streamed.python < values / 100
    dataset = pads.dataset(["datasets/d/v1/data.parquet"], format="parquet",
                           filesystem=store.filesystem)
    assert dataset.count_rows() == groups * rows
    assert dataset.to_table(filter=pads.field("n") < 0).num_rows == 0


def test_listing_pages_and_order(store: ObjectStore) -> None:
    """1,100 keys (S3 answers 1,000 a page) come back whole and in S3's order, which a
    local folder follows too (``a-c`` before ``a/...`` before ``a.c``); prefixes may
    end inside a segment."""
    keys = [f"many/{i:05d}" for i in range(1100)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: store.put_new(k, b""), keys))
    odd = ["a-c", "a/b", "a/b-x/y", "a.c", "a_d", "b"]
    for key in odd:
        store.put_new(key, b"")
    listed = store.list("many/")
    assert isinstance(listed, Iterator)
    assert list(listed) == keys
    assert list(store.list("many/010")) == keys[1000:1100]
    assert list(store.list("many/0109")) == keys[1090:1100]
    assert list(store.list()) == sorted(keys + odd)
    assert list(store.list("a")) == ["a-c", "a.c", "a/b", "a/b-x/y", "a_d"]
    assert list(store.list("a/")) == ["a/b", "a/b-x/y"]
    assert list(store.list("a/b")) == ["a/b", "a/b-x/y"]
    assert list(store.list("nothing/")) == []
    with_times = list(store.listed("many/"))
    assert [item.key for item in with_times] == keys


def test_listed_keys_carry_their_write_times_and_sizes(store: ObjectStore) -> None:
    """What the orphan sweeps read: each key's last write, within S3's one second."""
    before = time.time()
    store.put_new("t/a", b"x")
    store.put_new("t/b", b"yz")
    after = time.time()
    listed = list(store.listed("t/"))
    assert [item.key for item in listed] == ["t/a", "t/b"]
    assert all(before - 1.0 <= item.modified <= after + 1.0 for item in listed)
    assert [item.size for item in listed] == [1, 2]  # what a bounded cache sums
    assert list(store.listed("none/")) == []


BAD_KEYS: list[Any] = [
    "", "/abs", "trailing/", "a//b", "..", "../up", "a/../b", "./a", ".tmp/x", ".hidden",
    "a b", "a\nb", "a\x00b", "ä", "a?b", "a%2Fb", "a\\b", "a:b", "x" * 1000, None, b"key", 7,
]



def test_the_precompute_cache_shares_values_and_stays_bounded(store: ObjectStore) -> None:
    """Two processes' caches over one store: a value one stores the other reads; the
    same key stored twice keeps the first (a pure function of its key); past the cap
    the oldest written go, down to 80 %; a store away is a miss, not an error."""
    one, two = ObjectCache(store, max_bytes=1000), ObjectCache(store, max_bytes=1000)
    one.put("ab12", b"x" * 300)
    assert two.get("ab12") == b"x" * 300 and two.get("cd34") is None
    two.put("ab12", b"y" * 300)
    assert one.get("ab12") == b"x" * 300
    for i, key in enumerate(["c1", "c2", "c3"]):
        time.sleep(1.1 if isinstance(store, S3Store) else 0.02)  # S3 times are seconds
        one.put(key + "00", bytes([i]) * 300)
    kept = [item.key for item in store.listed("precompute/")]
    assert sum(item.size for item in store.listed("precompute/")) <= 800
    assert "precompute/ab/ab12" not in kept and "precompute/c3/c300" in kept
    away = ObjectCache(S3Store("bucket", "p", f"http://127.0.0.1:{_closed_port()}",
                               Credentials("AKIAEXAMPLE", SECRET), "us-east-1"))
    assert away.get("ab12") is None
    away.put("ab12", b"z")  # nothing raised: recomputed next time

@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
def test_odd_keys_are_refused(store: ObjectStore, key: Any) -> None:
    for call in (lambda: store.put_new(key, b"x"), lambda: store.get(key),
                 lambda: store.head(key), lambda: store.open(key),
                 lambda: store.delete(key), lambda: store.exists(key)):
        with pytest.raises(ValueError, match="object key must"):
            call()
    assert list(store.list()) == []


@given(st.text(max_size=40))
def test_an_accepted_key_stays_inside_the_root(key: str) -> None:
    """Whatever the text, a key is refused or names a file strictly inside the root,
    outside its temporary folder."""
    root = Path("/srv/objects")
    try:
        objects.check_key(key)
    except ValueError:
        return
    resolved = (root / key).resolve()
    assert resolved.is_relative_to(root) and resolved != root
    assert not resolved.is_relative_to(root / objects.TMP_DIR)
    assert key == str(resolved.relative_to(root))


def test_local_keys_cannot_be_both_object_and_folder(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put_new("a", b"1")
    with pytest.raises(ObjectStoreError, match="lies under another object"):
        store.put_new("a/b/c", b"2")
    store.put_new("f/x", b"3")
    with pytest.raises(ObjectStoreError, match="folder of other keys"):
        store.put_new("f", b"4")
    assert list(store.list()) == ["a", "f/x"]


def test_local_delete_removes_emptied_folders_and_sweep_clears_leftovers(
        tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put_new("d/v1/a", b"1")
    store.put_new("d/v2/a", b"2")
    store.delete("d/v1/a")
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["v2"]
    # what a put that crashed before its link leaves: a temporary file, seen nowhere
    leftover = tmp_path / objects.TMP_DIR / "put-crashed"
    leftover.write_bytes(b"half")
    assert list(store.list()) == ["d/v2/a"]
    assert store.sweep_tmp(older_than=3600) == 0
    assert store.sweep_tmp(older_than=0) == 1 and not leftover.exists()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


SECRET = "never-print-this-" + uuid.uuid4().hex


def _no_secret(exc: BaseException) -> None:
    text = "".join(traceback.format_exception(exc))
    assert SECRET not in text and "never-print-this" not in repr(exc)


def test_an_unreachable_endpoint_fails_fast_and_clearly() -> None:
    port = _closed_port()
    store = S3Store("bucket", "p", f"http://127.0.0.1:{port}",
                    Credentials("AKIAEXAMPLE", SECRET), "us-east-1")
    assert store.filesystem is not None  # the clients exist: the calls time the network
    for call in (lambda: store.put_new("k", b"x"), lambda: store.get("k"),
                 lambda: store.head("k"), lambda: list(store.list()),
                 lambda: store.delete("k"), lambda: store.open("k"),
                 lambda: store.check_room(1 << 20), lambda: store.preflight(1 << 20)):
        started = time.monotonic()
        with pytest.raises(Unavailable, match=f"127.0.0.1:{port}") as caught:
            call()
        assert time.monotonic() - started < 5
        _no_secret(caught.value)


def test_a_silent_endpoint_times_out() -> None:
    """A server that accepts connections and never answers: the request timeout ends
    each call (one attempt of 1 s here) with Unavailable."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        port = listener.getsockname()[1]
        store = S3Store("bucket", "", f"http://127.0.0.1:{port}",
                        Credentials("AKIAEXAMPLE", SECRET), "us-east-1",
                        connect_timeout=1, request_timeout=1, max_attempts=1)
        for call in (lambda: store.head("k"), lambda: store.open("k"),
                     lambda: store.put_new("k", b"x")):
            started = time.monotonic()
            with pytest.raises(Unavailable) as caught:
                call()
            assert time.monotonic() - started < 8
            _no_secret(caught.value)


def test_errors_name_no_credentials_or_data(s3_server: S3Server) -> None:
    store = S3Store("no-such-bucket", "p", s3_server.endpoint_url,
                    Credentials(s3_server.access_key, SECRET), "us-east-1")
    for call in (lambda: store.put_new("k", b"private row 42"), lambda: store.head("k")):
        with pytest.raises(ObjectStoreError) as caught:
            call()
        _no_secret(caught.value)
        assert "private row" not in str(caught.value)
    assert SECRET not in repr(store.__dict__) and SECRET not in repr(
        Credentials("a", SECRET))
    real = s3_store(s3_server)
    real.put_new("k", b"private row 42")
    with pytest.raises(AlreadyExists) as caught:
        real.put_new("k", b"private row 43")
    assert "private row" not in str(caught.value)
    _no_secret(caught.value)


@pytest.mark.parametrize(("url", "endpoint", "problem"), [
    ("http://bucket/p", None, "must start with file:// or s3://"),
    ("var/objects", None, "must start with file:// or s3://"),
    ("file://relative/x", None, "local absolute path"),
    ("file:///x?y=1", None, "file:///absolute/path"),
    ("s3://", None, "must name a bucket"),
    ("s3://ab", None, "bucket name must be 3-63"),
    ("s3://Bad_Bucket/p", None, "bucket name must be 3-63"),
    ("s3://user:hunter2@bucket/p", None, "must not carry credentials"),
    ("s3://bucket/a/../b", None, "object key must"),
    ("s3://bucket/a b", None, "object key must"),
    ("s3://bucket/p", "ftp://host", "http://host"),
    ("s3://bucket/p", "http://user:hunter2@host:9000", "must not carry credentials"),
    ("s3://bucket/p", "http://host:9000/path", "must not have a path"),
    ("s3://bucket/p", "http://host:99999", "invalid port"),
])
def test_bad_urls_say_what_is_wrong(url: str, endpoint: str | None, problem: str) -> None:
    with pytest.raises(ValueError, match=problem.replace("?", r"\?")) as caught:
        objects.from_url(url, endpoint)
    assert "hunter2" not in str(caught.value)


def test_from_url_picks_the_backend(tmp_path: Path) -> None:
    local = objects.from_url(tmp_path.as_uri())
    assert isinstance(local, LocalStore) and local.root == tmp_path.resolve()
    remote = objects.from_url("s3://my-bucket/some/prefix/", "https://s3.example.org:9000/")
    assert isinstance(remote, S3Store)
    assert (remote.bucket, remote.prefix, remote.endpoint) == (
        "my-bucket", "some/prefix", "https://s3.example.org:9000")
    assert remote.url == "s3://my-bucket/some/prefix at https://s3.example.org:9000"


def test_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, s3_server: S3Server
                  ) -> None:
    """Unset: the data directory; an s3:// URL with its endpoint and the AWS variables
    reaches the server; a bad value stops the process naming the variable."""
    for name in ("STORAGE_URL", "S3_ENDPOINT_URL"):
        monkeypatch.delenv("PRIVRELEASE_" + name, raising=False)
    monkeypatch.setenv("PRIVRELEASE_DATA_DIR", str(tmp_path))
    config = Config.from_env()
    assert config.object_store_url == tmp_path.resolve().as_uri()
    assert isinstance(objects.from_config(config), LocalStore)

    prefix = "cfg-" + uuid.uuid4().hex
    monkeypatch.setenv("PRIVRELEASE_STORAGE_URL", f"{s3_server.url}/{prefix}")
    monkeypatch.setenv("PRIVRELEASE_S3_ENDPOINT_URL", s3_server.endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    store = objects.from_config(Config.from_env())
    store.put_new("k", b"v")
    assert store.get("k") == b"v" and list(store.list()) == ["k"]

    for name, bad, problem in [("STORAGE_URL", "gs://bucket", "must start with file:// or s3://"),
                               ("S3_ENDPOINT_URL", "minio:9000", "must start with http://")]:
        monkeypatch.setenv("PRIVRELEASE_" + name, bad)
        with pytest.raises(SystemExit, match=f"PRIVRELEASE_{name} {problem}"):
            Config.from_env()
        monkeypatch.setenv("PRIVRELEASE_STORAGE_URL", f"{s3_server.url}/{prefix}")
        monkeypatch.setenv("PRIVRELEASE_S3_ENDPOINT_URL", s3_server.endpoint_url)
    # the rest of a URL is checked when the store is opened, naming the setting
    for name, bad, problem in [("STORAGE_URL", "s3://x", "bucket name"),
                               ("STORAGE_URL", "file://relative", "absolute path"),
                               ("S3_ENDPOINT_URL", "http://k:hunter2@minio:9000",
                                "must not carry credentials")]:
        monkeypatch.setenv("PRIVRELEASE_" + name, bad)
        with pytest.raises(SystemExit, match=f"PRIVRELEASE_{name}: .*{problem}") as caught:
            objects.from_config(Config.from_env())
        assert "hunter2" not in str(caught.value)
        monkeypatch.setenv("PRIVRELEASE_STORAGE_URL", f"{s3_server.url}/{prefix}")
        monkeypatch.setenv("PRIVRELEASE_S3_ENDPOINT_URL", s3_server.endpoint_url)


#: keys of the model test: none is the folder of another (the local backend cannot
#: hold ``b`` and ``b/c``), and their order mixes '-', '.', '/' and '_'
MODEL_KEYS = ["a", "b-e", "b.f", "b/c", "b/d/x", "b_g", "c/a/b/c"]
MODEL_PREFIXES = ["b", "b/", "b/d", "c/a/", "z"]


def test_both_backends_follow_one_model(s3_server: S3Server, tmp_path_factory:
                                        pytest.TempPathFactory) -> None:
    """Random sequences of puts, deletes, reads and lists on both backends agree with
    a dict: the same refusals, contents, sizes and listings."""
    from hypothesis import settings
    from hypothesis.stateful import (
        RuleBasedStateMachine,
        initialize,
        invariant,
        precondition,
        rule,
    )

    class Model(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.stores = [LocalStore(tmp_path_factory.mktemp("model")), s3_store(s3_server)]
            self.model: dict[str, bytes] = {}

        @initialize(keys=st.sets(st.sampled_from(MODEL_KEYS), min_size=2))
        def some(self, keys: set[str]) -> None:
            for key in sorted(keys):
                self.put(key, key.encode())

        @rule(key=st.sampled_from(MODEL_KEYS), body=st.binary(max_size=64))
        def put(self, key: str, body: bytes) -> None:
            for store in self.stores:
                if key in self.model:
                    with pytest.raises(AlreadyExists):
                        store.put_new(key, body)
                else:
                    store.put_new(key, io.BytesIO(body) if len(body) % 2 else body)
            self.model.setdefault(key, body)

        @rule(key=st.sampled_from(MODEL_KEYS))
        def delete(self, key: str) -> None:
            for store in self.stores:
                store.delete(key)
            self.model.pop(key, None)

        @precondition(lambda self: bool(self.model))
        @rule(data=st.data())
        def read(self, data: st.DataObject) -> None:
            key = data.draw(st.sampled_from(sorted(self.model)))
            for store in self.stores:
                assert store.get(key) == self.model[key]
                assert store.head(key).size == len(self.model[key])

        @rule(key=st.sampled_from(MODEL_KEYS))
        def missing(self, key: str) -> None:
            if key not in self.model:
                for store in self.stores:
                    with pytest.raises(NotFound):
                        store.head(key)

        @rule(prefix=st.sampled_from(MODEL_PREFIXES))
        def listing(self, prefix: str) -> None:
            expected = sorted(k for k in self.model if k.startswith(prefix))
            for store in self.stores:
                assert list(store.list(prefix)) == expected

        @invariant()
        def everything_listed(self) -> None:
            self.listing("")

    Model.TestCase.settings = settings(max_examples=20, stateful_step_count=15,
                                       deadline=None, derandomize=True)
    Model.TestCase().runTest()


def test_a_forked_process_makes_its_own_clients(s3_server: S3Server) -> None:
    """Celery's prefork pool forks after the parent used the store: the child opens
    its own boto3 client and pyarrow filesystem (neither survives a fork) and reads
    and writes; the parent sees the child's object."""
    import multiprocessing

    store = s3_store(s3_server)
    store.put_new("parent", b"p")
    assert store.get("parent") == b"p"  # both clients made in the parent
    parents = store.filesystem
    context = multiprocessing.get_context("fork")
    answers = context.Queue()

    def child() -> None:
        store.put_new("child", b"c")
        answers.put((store.get("child"), store.get("parent"), store.filesystem is parents))

    process = context.Process(target=child)
    process.start()
    process.join(60)
    assert process.exitcode == 0
    assert answers.get(timeout=5) == (b"c", b"p", False)
    assert store.get("child") == b"c"
