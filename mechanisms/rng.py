"""The random generator every release draws from: AES-128 in counter mode, keyed per job.

numpy's default bit generator (PCG64) is fast but not cryptographically
secure: its state can be recovered from enough outputs (Bouillaguet,
Martinez & Sauvage 2020), and whoever knows the state knows every noise
draw of the release and can subtract it. AES in counter mode is a standard
CSPRNG; randomgen's ``AESCounter`` uses the CPU's AES instructions and costs
about 15-20% more per draw than PCG64 here, so the mechanisms keep taking any
``np.random.Generator`` and the service gives them this one.

A record-level release run in partitions (``mechanisms.record_maps``) gives each
partition its own generator, derived from one fresh job secret
(``partition_generator``), so a partition's noise follows from (secret, partition)
alone, wherever it runs.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
from randomgen import AESCounter

#: key bytes read from the OS for each generator (AES-128)
KEY_BYTES = 16


def secure_generator(seed: int | None = None) -> np.random.Generator:
    """A generator on AES-CTR with a fresh key from ``os.urandom``.

    ``seed`` (tests only: the service refuses client seeds in production)
    derives the key through a ``SeedSequence`` instead, reproducibly.
    """
    if seed is None:
        return np.random.Generator(AESCounter(key=int.from_bytes(os.urandom(KEY_BYTES), "big")))
    return np.random.Generator(AESCounter(np.random.SeedSequence(seed)))


#: bytes of a job's secret, from which each partition's generator is derived
SECRET_BYTES = 32
#: separates the partitions' key derivation from any other use of a secret
PARTITION_DOMAIN = b"privrelease/partition-rng/v1\x00"


def job_secret(seed: int | None = None) -> bytes:
    """A fresh secret for one job's partition streams (``os.urandom``; ``seed``: tests only,
    reproducibly through a ``SeedSequence``)."""
    if seed is None:
        return os.urandom(SECRET_BYTES)
    words = np.random.SeedSequence(seed).generate_state(SECRET_BYTES // 4, np.uint32)
    return words.astype("<u4").tobytes()


#: separates a derived generator's children (``spawn``) from the partitions' keys
SPAWN_DOMAIN = b"privrelease/spawn/v1\x00"


class DerivedAES(AESCounter):
    """AES-128-CTR under a derived 16-byte key, counter from 0, whose children
    (``Generator.spawn``, e.g. subset's stream per variable) are derived from it too: child
    i (counted over this generator's spawns, as a ``SeedSequence`` counts) is keyed by
    SHAKE-256(spawn domain ‖ key ‖ i as 8 little-endian bytes)[:16]. A plain ``AESCounter``
    made from a key spawns from a fresh OS ``SeedSequence``: sound, but then a partition's
    records would not follow from the job secret (Spark and embedded would differ)."""

    def __init__(self, key: bytes) -> None:
        super().__init__(key=int.from_bytes(key, "little"))
        self._derived = bytes(key)
        self._spawned = 0

    def spawn(self, n_children: int) -> list[DerivedAES]:
        children = [DerivedAES(hashlib.shake_256(
            SPAWN_DOMAIN + self._derived + i.to_bytes(8, "little")).digest(KEY_BYTES))
            for i in range(self._spawned, self._spawned + n_children)]
        self._spawned += n_children
        return children


def partition_generator(secret: bytes, partition: int) -> np.random.Generator:
    """Partition ``partition``'s generator: AES-128-CTR under K_p = SHAKE-256(domain ‖
    secret ‖ p as 8 little-endian bytes)[:16], counter from 0 (``DerivedAES``).

    Why the streams are independent: SHAKE-256 keyed by a 256-bit uniform secret is a
    PRF (a random oracle in the usual model), so the K_p of distinct p (and the keys of
    their spawned children, under another domain) are indistinguishable from independent
    uniform AES keys; AES-CTR under independent uniform keys gives streams
    indistinguishable from independent uniform bits (each a PRP on distinct counters),
    so what each partition draws is as from its own fresh ``secure_generator``. A
    partition's stream depends only on (secret, p): the same on any engine and whichever
    worker runs it.
    """
    if not isinstance(secret, bytes) or len(secret) != SECRET_BYTES:
        raise ValueError(f"a job secret is {SECRET_BYTES} bytes")
    if partition < 0 or partition >= 1 << 64:
        raise ValueError("a partition index is in [0, 2**64)")
    derived = hashlib.shake_256(PARTITION_DOMAIN + secret
                                + partition.to_bytes(8, "little")).digest(KEY_BYTES)
    return np.random.Generator(DerivedAES(derived))
