"""Immutable objects by key, on a local directory or on S3-compatible object storage.

Dataset versions and release artifacts are written once and never modified, so the one
write is a *conditional create* (``put_new``): it fails with :class:`AlreadyExists` if
the key is taken and never overwrites. That replaces the link/rename tricks that need
one POSIX disk shared by every host: S3 (and MinIO, Ceph RGW, GCS's S3 API) answers a
``PUT`` with ``If-None-Match: *`` with 412 when the key exists, atomically.

Backends, chosen by ``PRIVRELEASE_STORAGE_URL`` (:func:`from_url`):

- ``file:///path``: :class:`LocalStore`, a directory (the embedded default, the data
  directory itself, so ``datasets/...`` and ``releases/...`` keys are today's folders);
- ``s3://bucket/prefix``: :class:`S3Store`, with ``PRIVRELEASE_S3_ENDPOINT_URL`` for a
  server other than AWS and the usual ``AWS_*`` credential variables.

Reads go through ``pyarrow.fs`` (``open`` is a seekable file that fetches byte ranges, so
``pyarrow.parquet.ParquetFile`` streams row groups), and ``filesystem`` is a
``pyarrow.fs.FileSystem`` rooted at the store whose paths are the keys, for
``pyarrow.dataset``; it is for reading only (writes through it would skip the
condition). Keys are ``/``-separated segments of ``[A-Za-z0-9._-]`` that do not start
with a dot, so no key escapes the root, names a temporary file or needs escaping.
Error messages name keys, buckets and endpoints, never credentials or object contents.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NamedTuple
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from service.storage import room

if TYPE_CHECKING:
    from service.config import Config

#: one segment of a key: no leading dot (no ``.``/``..``, no hidden temporary files)
_SEGMENT = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}")
#: S3 keys are at most 1024 bytes; the store's prefix takes part of that
MAX_KEY_BYTES = 900
#: a bucket name S3 accepts (3-63 lower-case letters, digits, dots and dashes)
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
#: bytes a stream is uploaded in (S3 parts); at most 10,000 parts, so a streamed object
#: is at most 160 GiB. Memory holds one part at a time. S3's smallest part is 5 MiB
PART_BYTES = 16 * 1024 * 1024
MIN_PART_BYTES = 5 * 1024 * 1024
MAX_PARTS = 10_000
#: chunk a local put copies a stream in
_COPY_BYTES = 1024 * 1024
#: folder of a LocalStore's objects being written (same filesystem, so a link is atomic)
TMP_DIR = ".tmp"
#: keys of ``preflight``'s probe objects (removed at once; a sweep of this prefix may drop
#: one a killed process left)
PROBES = "preflight-probes"


class ObjectStoreError(Exception):
    """Storage failed; the message names the store and key, never credentials."""


class AlreadyExists(ObjectStoreError):
    """``put_new`` on a key that holds an object: the object is left as it was."""


class NotFound(ObjectStoreError):
    """No object under the key."""


class Unavailable(ObjectStoreError):
    """The storage server could not be reached or did not answer in time."""


class _Conflict(ObjectStoreError):
    """S3's 409 to a conditional write while another one on the key is in flight: the
    write is to be tried again (it then succeeds or answers 412)."""


#: tries of a conditional write that S3 answers 409, and the first pause between them
_CONFLICT_TRIES, _CONFLICT_PAUSE = 5, 0.05


def _retrying_conflicts(write: Callable[[], Any]) -> Any:
    for attempt in range(_CONFLICT_TRIES):
        try:
            return write()
        except _Conflict:
            if attempt == _CONFLICT_TRIES - 1:
                raise
            time.sleep(_CONFLICT_PAUSE * 2**attempt)
    raise AssertionError("unreachable")


class Listed(NamedTuple):
    """A key a listing found, when its object was last written (epoch seconds) and its
    size in bytes."""

    key: str
    modified: float
    size: int = 0


class ObjectInfo(NamedTuple):
    """An object's size in bytes and its version tag (opaque: equal tags, same object)."""

    size: int
    etag: str


def check_key(key: object) -> str:
    """``key`` if it is a valid object key, else ValueError saying what is wrong."""
    if not isinstance(key, str) or not key:
        raise ValueError("object key must be a non-empty string")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise ValueError(f"object key must be at most {MAX_KEY_BYTES} bytes")
    if not all(_SEGMENT.fullmatch(part) for part in key.split("/")):
        raise ValueError("object key must be '/'-separated segments of [A-Za-z0-9._-], "
                         "none empty or starting with '.'")
    return key


def check_prefix(prefix: object) -> str:
    """A listing prefix: empty, or a key, or a key's beginning (may end with '/')."""
    if prefix == "":
        return ""
    if not isinstance(prefix, str):
        raise ValueError("object key prefix must be a string")
    body = prefix[:-1] if prefix.endswith("/") else prefix
    check_key(body)
    return prefix


class ObjectStore(ABC):
    """Write-once objects by key. Every method is safe to call from several threads."""

    #: where the store is, for messages (no credentials)
    url: str

    @property
    @abstractmethod
    def filesystem(self) -> pafs.FileSystem:
        """A pyarrow filesystem rooted at the store: its paths are the keys (reads, and
        the parts of a release table that an engine's workers write before a conditional
        put of their list commits them: ``release_tables``)."""

    @abstractmethod
    def put_new(self, key: str, data: bytes | IO[bytes]) -> str:
        """Store ``data`` (bytes, or a binary stream read to its end) under a new key; its
        etag. AlreadyExists if the key holds an object: never overwrites, and no reader
        ever sees part of an object."""

    @abstractmethod
    def head(self, key: str) -> ObjectInfo:
        """The object's size and etag (NotFound if absent)."""

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys starting with ``prefix``, in ascending order, read a page at a time."""

    @abstractmethod
    def listed(self, prefix: str = "") -> Iterator[Listed]:
        """As ``list``, each key with its last modification time (for sweeps: a
        temporary object is removed only once it is old)."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; a missing key is not an error (S3's semantics)."""

    def get(self, key: str) -> bytes:
        """The whole object (small ones: ``open`` streams the large)."""
        with self.open(key) as fh:
            return bytes(fh.read())

    def open(self, key: str) -> pa.NativeFile:
        """A seekable file over the object that reads only the byte ranges asked for.
        Opening maps failures to this module's errors; a read that fails later (the
        network, on S3) raises pyarrow's OSError."""
        check_key(key)
        try:
            return self.filesystem.open_input_file(key)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NotFound(f"no object {key} in {self.url}") from None
        except OSError as exc:
            raise self._failure(f"reading {key}", exc) from exc

    def stat(self, key: str) -> tuple[ObjectInfo, str | None]:
        """``head``, and the object's version id where the store keeps versions (an S3
        bucket with versioning on; None otherwise): a pin of what was read."""
        return self.head(key), None

    def exists(self, key: str) -> bool:
        try:
            self.head(key)
        except NotFound:
            return False
        return True

    def check_room(self, need: int) -> None:
        """Raise what a put would meet now, cheaply (a POST asks before it holds any
        budget for a release whose output goes here): here, the store's answer to one
        HEAD (``Unavailable`` when it does not answer). ``need``: the bytes a run would
        take first (a store without a notion of room ignores it)."""
        self.exists(f"{PROBES}/none")

    def preflight(self, need: int) -> None:
        """Before a run reads its data: put a probe object and delete it, so a store
        that cannot take the output fails the run while it is refunded."""
        key = f"{PROBES}/{uuid.uuid4().hex}"
        self.put_new(key, b"probe")
        self.delete(key)

    def _failure(self, doing: str, exc: BaseException) -> ObjectStoreError:
        return ObjectStoreError(f"{doing} in {self.url} failed: {exc}")


# -- a local directory ---------------------------------------------------------------


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a linked, renamed or created file or folder) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalStore(ObjectStore):
    """Objects as files under ``root`` (``root/<key>``).

    A put writes a temporary file under ``root/.tmp``, fsyncs it, hard-links it to the
    key's path (``link`` fails if the path exists: the condition, atomically) and fsyncs
    the folder, so a crash leaves either no object or the whole one under the key; the
    leftover temporary file is removed by the put or by :meth:`sweep_tmp`. A key cannot
    be both an object and the folder of other keys (``a`` and ``a/b``), which S3 allows.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.url = self.root.as_uri()
        self._fs = pafs.SubTreeFileSystem(str(self.root), pafs.LocalFileSystem())

    @property
    def filesystem(self) -> pafs.FileSystem:
        return self._fs

    def check_room(self, need: int) -> None:
        """One ``statvfs`` of the root (``room.check``: full, read-only, not writable)."""
        self.root.mkdir(parents=True, exist_ok=True)
        room.check(self.root, need)

    def preflight(self, need: int) -> None:
        """``need`` bytes taken for real under ``.tmp`` and given back (``room.probe``)."""
        tmp = self.root / TMP_DIR
        tmp.mkdir(parents=True, exist_ok=True)
        room.probe(tmp / f"preflight-{uuid.uuid4().hex}", need)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _make_parents(self, path: Path) -> None:
        """Create the folders above ``path``, each made durable in its parent."""
        missing: list[Path] = []
        parent = path.parent
        while not parent.is_dir():
            missing.append(parent)
            parent = parent.parent
        for folder in reversed(missing):
            with contextlib.suppress(FileExistsError):
                folder.mkdir()
            fsync_dir(folder.parent)

    def put_new(self, key: str, data: bytes | IO[bytes]) -> str:
        final = self._path(key)
        tmp_dir = self.root / TMP_DIR
        tmp_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix="put-", dir=tmp_dir)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as fh:
                if isinstance(data, bytes | bytearray | memoryview):
                    fh.write(data)
                else:
                    shutil.copyfileobj(data, fh, _COPY_BYTES)
                fh.flush()
                os.fsync(fh.fileno())
            # a concurrent delete may remove an emptied folder between the two steps
            for _ in range(8):
                try:
                    self._make_parents(final)
                    os.link(tmp, final)
                    break
                except FileNotFoundError:
                    continue
                except FileExistsError:
                    if final.is_dir():
                        raise ObjectStoreError(
                            f"key {key} is a folder of other keys in {self.url}") from None
                    raise AlreadyExists(f"object {key} already exists in {self.url}") from None
                except NotADirectoryError:
                    raise ObjectStoreError(
                        f"key {key} lies under another object's key in {self.url}") from None
            else:
                raise ObjectStoreError(f"storing {key} in {self.url} kept racing a delete")
            fsync_dir(final.parent)
            return self._etag(final.stat())
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    @staticmethod
    def _etag(st: os.stat_result) -> str:
        """Size, modification time (ns) and inode, read without reading the bytes: a
        replaced object (deleted, put again) gets a new tag unless it has the same
        size, reuses the inode and is written within the filesystem's clock tick."""
        return f"{st.st_size:x}-{st.st_mtime_ns:x}-{st.st_ino:x}"

    def head(self, key: str) -> ObjectInfo:
        path = self._path(key)
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"no object {key} in {self.url}") from None
        if not path.is_file():
            raise NotFound(f"no object {key} in {self.url}")
        return ObjectInfo(st.st_size, self._etag(st))

    def list(self, prefix: str = "") -> Iterator[str]:
        check_prefix(prefix)
        folder, _, start = prefix.rpartition("/")
        yield from self._walk(self.root / folder if folder else self.root,
                              folder + "/" if folder else "", start)

    def listed(self, prefix: str = "") -> Iterator[Listed]:
        for key in self.list(prefix):
            try:
                st = (self.root / key).stat()
            except FileNotFoundError:  # deleted since it was listed
                continue
            yield Listed(key, st.st_mtime, st.st_size)

    def _walk(self, path: Path, above: str, start: str) -> Iterator[str]:
        """Keys under ``path`` (whose keys begin ``above``) whose next segment starts
        with ``start``, in S3's order: a folder sorts as its name plus '/'. Memory holds
        one folder's entries per level."""
        try:
            with os.scandir(path) as it:
                entries = [(e.name + "/" if e.is_dir(follow_symlinks=False) else e.name, e)
                           for e in it if e.name.startswith(start) and e.name[0] != "."]
        except (FileNotFoundError, NotADirectoryError):
            return
        for name, entry in sorted(entries, key=lambda pair: pair[0]):
            if name.endswith("/"):
                yield from self._walk(Path(entry.path), above + name, "")
            elif entry.is_file(follow_symlinks=False):
                yield above + name

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return
        fsync_dir(path.parent)
        # emptied folders go too (a concurrent put re-creates its folder: see put_new)
        folder = path.parent
        while folder != self.root:
            try:
                folder.rmdir()
            except OSError:
                break
            folder = folder.parent

    def sweep_tmp(self, older_than: float = 3600.0) -> int:
        """Remove temporary files a crashed put left (older than ``older_than`` s)."""
        cutoff, removed = time.time() - older_than, 0
        with contextlib.suppress(FileNotFoundError), os.scandir(self.root / TMP_DIR) as it:
            for entry in it:
                with contextlib.suppress(FileNotFoundError):
                    if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                        os.unlink(entry.path)
                        removed += 1
        return removed


# -- S3-compatible object storage ----------------------------------------------------


@dataclass(frozen=True)
class Credentials:
    """Explicit S3 credentials; without them both clients use the AWS default chain
    (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, profiles,
    instance roles). Never printed."""

    access_key: str = field(repr=False)
    secret_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


def _read_full(stream: IO[bytes], size: int) -> bytes:
    """Up to ``size`` bytes of ``stream``: fewer only at its end."""
    chunks, got = [], 0
    while got < size:
        chunk = stream.read(size - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


class S3Store(ObjectStore):
    """Objects under ``prefix`` in an S3 bucket (AWS, or any server at ``endpoint``).

    Reads use ``pyarrow.fs.S3FileSystem``; writes, heads, lists and deletes use boto3,
    whose ``put_object`` and ``complete_multipart_upload`` take ``IfNoneMatch='*'``. A
    stream larger than one part is uploaded in parts of ``part_bytes`` and the
    condition is checked when the upload completes; parts of an upload a crash left
    are not visible as an object, and a bucket lifecycle rule
    (``AbortIncompleteMultipartUpload``) reclaims them. Both clients are made per
    process (neither survives a fork) with the given timeouts and retries.
    """

    def __init__(self, bucket: str, prefix: str = "", endpoint: str | None = None,
                 credentials: Credentials | None = None, region: str | None = None, *,
                 connect_timeout: float = 5.0, request_timeout: float = 30.0,
                 max_attempts: int = 3, part_bytes: int = PART_BYTES) -> None:
        if part_bytes < MIN_PART_BYTES:
            raise ValueError(f"S3 parts must be at least {MIN_PART_BYTES} bytes")
        if _BUCKET.fullmatch(bucket) is None:
            raise ValueError("S3 bucket name must be 3-63 characters of [a-z0-9.-], "
                             "starting and ending with a letter or digit")
        self.bucket = bucket
        self.prefix = check_key(prefix.strip("/")) if prefix.strip("/") else ""
        self.endpoint = check_endpoint(endpoint) if endpoint else None
        self.url = f"s3://{bucket}/{self.prefix}" + (f" at {self.endpoint}"
                                                     if self.endpoint else "")
        self._credentials, self._region = credentials, region
        self._timeouts = (connect_timeout, request_timeout, max_attempts)
        self.part_bytes = part_bytes
        self._lock = threading.Lock()
        self._clients: tuple[int, Any, pafs.FileSystem] | None = None

    def _full(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _both(self) -> tuple[Any, pafs.FileSystem]:
        """This process's boto3 client and pyarrow filesystem (made on first use)."""
        with self._lock:
            if self._clients is None or self._clients[0] != os.getpid():
                self._clients = (os.getpid(), self._make_boto(), self._make_arrow())
            return self._clients[1], self._clients[2]

    def _make_boto(self) -> Any:
        import boto3
        from botocore.config import Config as BotoConfig

        connect, request, attempts = self._timeouts
        options: dict[str, Any] = {
            "connect_timeout": connect, "read_timeout": request,
            "retries": {"max_attempts": attempts, "mode": "standard"},
        }
        if self.endpoint:
            # servers other than AWS: path-style addressing, and checksums only where the
            # protocol requires them (several reject botocore's newer default headers)
            options.update(s3={"addressing_style": "path"},
                           request_checksum_calculation="when_required",
                           response_checksum_validation="when_required")
        creds = self._credentials
        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, region_name=self._region,
            aws_access_key_id=creds.access_key if creds else None,
            aws_secret_access_key=creds.secret_key if creds else None,
            aws_session_token=creds.session_token if creds else None,
            config=BotoConfig(**options))

    def _make_arrow(self) -> pafs.FileSystem:
        connect, request, attempts = self._timeouts
        options: dict[str, Any] = {
            "connect_timeout": connect, "request_timeout": request,
            "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=attempts),
        }
        if self.endpoint:
            parts = urlsplit(self.endpoint)
            options.update(endpoint_override=parts.netloc, scheme=parts.scheme)
        if self._region:
            options["region"] = self._region
        if self._credentials:
            options.update(access_key=self._credentials.access_key,
                           secret_key=self._credentials.secret_key,
                           session_token=self._credentials.session_token)
        s3 = pafs.S3FileSystem(**options)
        root = f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket
        return pafs.SubTreeFileSystem(root, s3)

    @property
    def filesystem(self) -> pafs.FileSystem:
        return self._both()[1]

    def _call(self, doing: str, key: str, call: Any, **kwargs: Any) -> Any:
        """One boto3 call, its failures as this module's errors."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectionError,
            HTTPClientError,
            NoCredentialsError,
        )

        try:
            return call(Bucket=self.bucket, **kwargs)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "PreconditionFailed" or status == 412:
                raise AlreadyExists(f"object {key} already exists in {self.url}") from None
            if code == "ConditionalRequestConflict":
                raise _Conflict(f"{doing} {key} in {self.url} raced another write") from None
            if code in {"NoSuchKey", "404", "NotFound"}:
                raise NotFound(f"no object {key} in {self.url}") from None
            if code == "NoSuchBucket":
                raise ObjectStoreError(f"{doing}: no bucket {self.bucket} in {self.url}"
                                       ) from None
            raise ObjectStoreError(f"{doing} {key} in {self.url} failed: {code or status}"
                                   ) from None
        except NoCredentialsError:
            raise ObjectStoreError(
                f"{doing}: no credentials for {self.url} (set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, a profile or a role)") from None
        except (ConnectionError, HTTPClientError) as exc:
            raise Unavailable(f"{doing} {key}: {self.url} did not answer "
                              f"({type(exc).__name__})") from None
        except BotoCoreError as exc:
            raise ObjectStoreError(f"{doing} {key} in {self.url} failed "
                                   f"({type(exc).__name__})") from None

    def _failure(self, doing: str, exc: BaseException) -> ObjectStoreError:
        text = str(exc)
        if "NETWORK_CONNECTION" in text or "curlCode" in text or "timed out" in text.lower():
            return Unavailable(f"{doing}: {self.url} did not answer ({text})")
        return super()._failure(doing, exc)

    def put_new(self, key: str, data: bytes | IO[bytes]) -> str:
        full = self._full(check_key(key))
        client = self._both()[0]
        if isinstance(data, bytes | bytearray | memoryview):
            return self._put_once(key, full, bytes(data))
        first = _read_full(data, self.part_bytes)
        if len(first) < self.part_bytes:
            return self._put_once(key, full, first)
        upload = self._call("starting an upload of", key, client.create_multipart_upload,
                            Key=full)["UploadId"]
        try:
            parts: list[dict[str, Any]] = []
            chunk = first
            while chunk:
                if len(parts) == MAX_PARTS:
                    raise ObjectStoreError(f"object {key} is larger than "
                                           f"{MAX_PARTS * self.part_bytes} bytes")
                number = len(parts) + 1
                answer = self._call("uploading a part of", key, client.upload_part, Key=full,
                                    UploadId=upload, PartNumber=number, Body=chunk)
                parts.append({"PartNumber": number, "ETag": answer["ETag"]})
                chunk = _read_full(data, self.part_bytes)
            done = _retrying_conflicts(lambda: self._call(
                "storing", key, client.complete_multipart_upload, Key=full, UploadId=upload,
                IfNoneMatch="*", MultipartUpload={"Parts": parts}))
        except BaseException:
            with contextlib.suppress(ObjectStoreError):
                self._call("abandoning an upload of", key, client.abort_multipart_upload,
                           Key=full, UploadId=upload)
            raise
        return str(done["ETag"]).strip('"')

    def _put_once(self, key: str, full: str, body: bytes) -> str:
        client = self._both()[0]
        answer = _retrying_conflicts(lambda: self._call(
            "storing", key, client.put_object, Key=full, Body=body, IfNoneMatch="*"))
        return str(answer["ETag"]).strip('"')

    def head(self, key: str) -> ObjectInfo:
        return self.stat(key)[0]

    def stat(self, key: str) -> tuple[ObjectInfo, str | None]:
        full = self._full(check_key(key))
        answer = self._call("reading", key, self._both()[0].head_object, Key=full)
        version = answer.get("VersionId")
        return (ObjectInfo(int(answer["ContentLength"]), str(answer["ETag"]).strip('"')),
                str(version) if version else None)

    def list(self, prefix: str = "") -> Iterator[str]:
        return (item.key for item in self.listed(prefix))

    def listed(self, prefix: str = "") -> Iterator[Listed]:
        check_prefix(prefix)
        client = self._both()[0]
        base = self.prefix + "/" if self.prefix else ""
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Prefix": base + prefix, "MaxKeys": 1000}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._call("listing", prefix or "all keys", client.list_objects_v2,
                              **kwargs)
            for item in page.get("Contents", []):
                yield Listed(str(item["Key"])[len(base):], item["LastModified"].timestamp(),
                             int(item.get("Size", 0)))
            if not page.get("IsTruncated"):
                return
            token = page["NextContinuationToken"]

    def delete(self, key: str) -> None:
        full = self._full(check_key(key))
        self._call("deleting", key, self._both()[0].delete_object, Key=full)


# -- choosing a backend --------------------------------------------------------------


def check_endpoint(endpoint: str) -> str:
    """``http(s)://host[:port]``, without credentials, path or query."""
    parts = urlsplit(endpoint)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError("S3 endpoint URL must be http://host[:port] or https://host[:port]")
    if parts.username is not None or parts.password is not None:
        raise ValueError("S3 endpoint URL must not carry credentials (use the AWS_* "
                         "variables)")
    if parts.path not in {"", "/"} or parts.query or parts.fragment:
        raise ValueError("S3 endpoint URL must not have a path, query or fragment")
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        raise ValueError("S3 endpoint URL has an invalid port") from None
    return f"{parts.scheme}://{parts.netloc}"


def from_url(url: str, endpoint_url: str | None = None,
             credentials: Credentials | None = None, region: str | None = None
             ) -> ObjectStore:
    """The store ``url`` names: ``file:///abs/path`` or ``s3://bucket[/prefix]``
    (``endpoint_url``: an S3 server other than AWS). ValueError names what is wrong."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in {"", "localhost"}:
            raise ValueError("storage URL file:// must name a local absolute path "
                             "(file:///path)")
        path = unquote(parts.path)
        if not path.startswith("/") or parts.query or parts.fragment:
            raise ValueError("storage URL file:// must be file:///absolute/path")
        return LocalStore(Path(path))
    if parts.scheme == "s3":
        if "@" in parts.netloc:
            raise ValueError("storage URL s3:// must not carry credentials (use the AWS_* "
                             "variables)")
        if parts.query or parts.fragment:
            raise ValueError("storage URL s3:// must be s3://bucket[/prefix]")
        if not parts.netloc:
            raise ValueError("storage URL s3:// must name a bucket (s3://bucket[/prefix])")
        return S3Store(parts.netloc, parts.path.strip("/"), endpoint_url, credentials,
                       region or os.environ.get("AWS_REGION")
                       or os.environ.get("AWS_DEFAULT_REGION"))
    raise ValueError("storage URL must start with file:// or s3://")


def from_config(config: Config) -> ObjectStore:
    """The store of a ``service.config.Config``; SystemExit naming the setting that is
    wrong (a process cannot start without its storage)."""
    if config.s3_endpoint_url:
        try:
            check_endpoint(config.s3_endpoint_url)
        except ValueError as exc:
            raise SystemExit(f"PRIVRELEASE_S3_ENDPOINT_URL: {exc}") from None
    try:
        return from_url(config.object_store_url, config.s3_endpoint_url)
    except ValueError as exc:
        raise SystemExit(f"PRIVRELEASE_STORAGE_URL: {exc}") from None
