"""The key service of spec 21.3 inside a process: the root key, the ring folded from
``qim.keys``, the per-process DEK cache, and (at the writer) key creation on first need.

* Root key: ``QIM_ROOT_KEY_FILE`` (32 bytes, base64url on one line). Without it the local and
  test stacks use ``<repo>/.run/root-key``, generated once (mode 0600) and shared by every
  process of the checkout. Its bytes are never
  logged, printed or put in any record; :class:`BodyKeys` and the ring hide it in ``repr``.
* ``qim.keys`` (compacted, one partition) holds only *wrapped* keys (``qim.core.keys.ring``).
  :class:`KeyTopicFollower` reads it from offset 0 before its process serves, then follows
  it, folding each record into one :class:`~qim.core.keys.KeyRing`; a key-destroyed record also
  evicts the DEK cache (21.3.4 active invalidation).
* Creation (:meth:`KeyTopicFollower.ensure_conversation_key`): when the writer is about to seal
  the first body of a conversation that has no live ConversationDEK, it reads the topic to its
  end (another owner may have made one), and otherwise makes a TenantMasterKey (if the tenant
  has none) and a ConversationDEK, produces them with ``acks=all`` and waits for the
  acknowledgement before any body is sealed with them: a body never names a key the log does
  not hold. Versions are ``created_at_ms * 65536 + 16 random bits``: two creators racing (two
  writers of one tenant making its first TMK, or a zombie and the new owner of a partition)
  write two *different* slots, both live, instead of one overwriting the other's slot in the
  compacted topic (which would make whatever was sealed under the loser unreadable). Writes use
  the highest live version (rotation, 21.3.2 rule 2); reads use the version in each body's
  ``dek_id`` header.

``BodyKeys.seal`` / ``BodyKeys.open`` are the encrypt / decrypt points' one entry each
(``qim.core.keys.points``); an unopenable body (destroyed key, foreign bytes) reads as
``EXPIRED_PLACEHOLDER``, never an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from qim.core.keys import (
    EXPIRED_PLACEHOLDER,
    DekCache,
    DekId,
    KeyDestroyed,
    KeyRing,
    KeyScope,
    KeyUnavailable,
    conversation_key_id,
    decode_key_record,
    encode_key_record,
    is_sealed,
    key_record_key,
    new_wrapped,
    open_message_body,
    peek_dek_id,
    seal_message_body,
)
from qim.core.keys.ring import KeyRecord
from qim.schemas.frames.mailbox import SyncEntry
from qim.streams.fetching import start_follower
from qim.streams.transit import load_key_file

__all__ = [
    "DEFAULT_ROOT_KEY_PATH",
    "ENV_ROOT_KEY_FILE",
    "PREVIEW_SEQ",
    "BodyKeys",
    "KeyTopicFollower",
    "load_root_key",
    "new_version",
    "opened_entry",
    "register_key_metrics",
]

log = logging.getLogger(__name__)

ENV_ROOT_KEY_FILE: Final = "QIM_ROOT_KEY_FILE"
DEFAULT_ROOT_KEY_PATH: Final = Path(__file__).resolve().parents[2] / ".run" / "root-key"
PREVIEW_SEQ: Final = 0
"""The AAD seq of a sealed preview: no message has seq 0, so a preview never opens as a body
(and a body never opens as a preview); it is bound to its tenant and conversation."""


def load_root_key(environ: Mapping[str, str] = os.environ) -> bytes:
    """The 32-byte root key: ``QIM_ROOT_KEY_FILE``, or the checkout's generated file."""
    configured = environ.get(ENV_ROOT_KEY_FILE, "")
    return load_key_file(Path(configured) if configured else DEFAULT_ROOT_KEY_PATH)


def _now_ms() -> int:
    return int(time.time() * 1000)


def new_version(now_ms: int) -> int:
    """A key version unique per creator, ordered by creation time (module docstring)."""
    return now_ms * 65536 + secrets.randbelow(65536)


class BodyKeys:
    """One process's ring and DEK cache: :meth:`seal` at the writer, :meth:`open` at the read
    points. ``open`` never raises for a body it cannot open (``EXPIRED_PLACEHOLDER``)."""

    def __init__(self, root: bytes, *, dek_cache_ttl_ms: int, capacity: int = 4096) -> None:
        self.ring = KeyRing(root)
        self.cache = DekCache(ttl_ms=dek_cache_ttl_ms, capacity=capacity)
        self.records = 0
        self.sealed = 0
        self.opened = 0
        self.expired = 0

    def __repr__(self) -> str:  # never print keys
        return f"BodyKeys({self.ring!r}, {self.cache!r})"

    def apply(self, record: KeyRecord | None, key: tuple[str, DekId] | None = None) -> None:
        """Fold one ``qim.keys`` record; a destroyed key leaves the cache at once."""
        self.ring.apply(record, key)
        self.records += 1
        if isinstance(record, KeyDestroyed):
            self.cache.evict(
                record.tenant_id,
                DekId(KeyScope(record.key_scope), record.key_id, record.key_version),
            )

    def conversation_key(self, tenant_id: str, conversation_id: str) -> DekId | None:
        """The ConversationDEK a new write uses (the highest live version), if any."""
        key_id = conversation_key_id(conversation_id)
        return self.ring.latest(tenant_id, KeyScope.CONVERSATION, key_id)

    def seal(self, tenant_id: str, conversation_id: str, seq: int, plaintext: bytes) -> bytes:
        """``plaintext`` sealed under the conversation's key with AAD (tenant, conversation,
        seq); ``KeyUnavailable`` when the writer did not ensure the key first (a bug)."""
        dek_id = self.conversation_key(tenant_id, conversation_id)
        if dek_id is None:
            raise KeyUnavailable((tenant_id, conversation_id))
        self.sealed += 1
        return seal_message_body(
            self.ring,
            dek_id,
            tenant_id=tenant_id,
            conversation_id=conversation_id,
            conversation_seq=seq,
            plaintext=plaintext,
        )

    def open(
        self,
        data: bytes,
        tenant_id: str,
        conversation_id: str,
        seqs: Sequence[int],
        now_ms: int | None = None,
    ) -> bytes:
        """The plaintext of ``data`` (unchanged when it is not sealed: E2EE, control maps).

        ``seqs`` are the positions the body may be bound to, tried in order: a message's own
        seq, and for an edit's body shown on its CONTROL event the target's seq (an edit is
        sealed at the seq of the message whose body it becomes)."""
        if not is_sealed(data):
            return data
        now = _now_ms() if now_ms is None else now_ms
        for seq in seqs:
            plain = open_message_body(
                self.ring,
                self.cache,
                data,
                tenant_id=tenant_id,
                conversation_id=conversation_id,
                conversation_seq=seq,
                now_ms=now,
            )
            if plain is not EXPIRED_PLACEHOLDER:
                self.opened += 1
                return plain
        self.expired += 1
        return EXPIRED_PLACEHOLDER

    def open_preview(self, data: bytes, tenant_id: str, conversation_id: str) -> bytes:
        """A session preview as the client sees it (a sealed one opened, others as they are)."""
        return self.open(data, tenant_id, conversation_id, (PREVIEW_SEQ,))

    def seal_preview(self, tenant_id: str, conversation_id: str, plaintext: bytes) -> bytes:
        return self.seal(tenant_id, conversation_id, PREVIEW_SEQ, plaintext)


class _KeyMetrics(Collector):
    def __init__(self, keys: BodyKeys, process: str) -> None:
        self._keys, self._process = keys, process

    def collect(self) -> Iterator[Any]:
        keys, cache, labels = self._keys, self._keys.cache, [self._process]
        for name, doc, value in (
            ("qim_dek_cache_hits", "DEK cache lookups served from memory (21.3.4).", cache.hits),
            ("qim_dek_cache_misses", "DEK cache lookups that unwrapped a key.", cache.misses),
            (
                "qim_dek_cache_evictions",
                "DEKs dropped by capacity or by a key-destroyed event.",
                cache.evictions,
            ),
            ("qim_bodies_sealed", "Bodies and previews sealed at this encrypt point.", keys.sealed),
            ("qim_bodies_opened", "Sealed bodies opened at this decrypt point.", keys.opened),
            (
                "qim_bodies_expired",
                "Sealed bodies read as the expired placeholder (key destroyed or unknown).",
                keys.expired,
            ),
            ("qim_key_records", "qim.keys records folded into this process's ring.", keys.records),
        ):
            family = CounterMetricFamily(name, doc, labels=["process"])
            family.add_metric(labels, value)
            yield family
        size = GaugeMetricFamily(
            "qim_dek_cache_bytes",
            "Bytes of plaintext DEKs in this process's cache.",
            labels=["process"],
        )
        size.add_metric(labels, cache.size_bytes)
        yield size
        live = GaugeMetricFamily(
            "qim_dek_cache_keys", "DEKs in this process's cache.", labels=["process"]
        )
        live.add_metric(labels, len(cache))
        yield live


def register_key_metrics(registry: CollectorRegistry, keys: BodyKeys, process: str) -> None:
    registry.register(_KeyMetrics(keys, process))


class KeyTopicFollower:
    """Reads ``qim.keys`` from offset 0 into :attr:`keys`, then follows it; creates keys."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        keys: BodyKeys,
        *,
        client_id: str = "qim-keys",
        create: bool = False,
    ) -> None:
        self.bootstrap, self.topic, self.keys, self.client_id = bootstrap, topic, keys, client_id
        self.create = create
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._tp = TopicPartition(topic, 0)

    async def start(self, catch_up_timeout_s: float = 30.0) -> None:
        consumer = await start_follower(
            self.bootstrap, self.client_id, [self._tp], fetch_max_wait_ms=200
        )
        self._consumer = consumer
        if self.create:
            self._producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap,
                client_id=f"{self.client_id}-create",
                acks="all",
                enable_idempotence=True,
            )
            await self._producer.start()
        try:
            await asyncio.wait_for(self.catch_up(), catch_up_timeout_s)
        except Exception:  # a missing topic, a slow broker: follow anyway, say so
            log.warning("keys: %s not read to its end at start", self.topic, exc_info=True)
        self._task = asyncio.create_task(self._follow(), name="keys-follow")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._producer is not None:
            await self._producer.stop()
        if self._consumer is not None:
            await self._consumer.stop()

    async def catch_up(self) -> None:
        """Fold every record the topic holds now (its end at the time of the call)."""
        consumer = self._consumer
        assert consumer is not None
        end = (await consumer.end_offsets([self._tp]))[self._tp]
        while await consumer.position(self._tp) < end:
            if self._task is not None:
                await asyncio.sleep(0.02)  # the follow task is reading: wait for it
                continue
            self._fold(await consumer.getmany(timeout_ms=200))

    async def _follow(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        while True:
            try:
                self._fold(await consumer.getmany(timeout_ms=1000))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("keys: fetch failed; retrying")
                await asyncio.sleep(1.0)

    def _fold(self, batches: Mapping[TopicPartition, Sequence[Any]]) -> None:
        for records in batches.values():
            for record in records:
                if record.value is None:
                    continue  # a compaction tombstone: a destroyed record stays as the fold put it
                try:
                    self.keys.apply(decode_key_record(record.value))
                except Exception:
                    log.warning("keys: undecodable record at %s skipped", record.offset)

    async def knows(self, blobs: Iterable[tuple[str, bytes]]) -> None:
        """Read the topic to its end when a sealed ``(tenant, blob)`` names a key the ring has
        not folded yet. Called before a MailboxNode materializes a dispatch run: the writer's
        key was acknowledged before the outbox record committed, so it is in the topic by now,
        and a read never shows a fresh message as expired because this process lagged."""
        ring = self.keys.ring
        for tenant_id, blob in blobs:
            if not blob or not is_sealed(blob):
                continue
            try:
                rid = (tenant_id, peek_dek_id(blob))
            except ValueError:
                continue
            if rid not in ring.wrapped and rid not in ring.destroyed:
                await self.catch_up()
                return

    async def ensure_conversation_keys(self, wanted: set[tuple[str, str]]) -> None:
        """Every ``(tenant, conversation)`` in ``wanted`` has a live ConversationDEK, durable
        in ``qim.keys``, when this returns (module docstring)."""
        missing = {tc for tc in wanted if self.keys.conversation_key(*tc) is None}
        if not missing:
            return
        async with self._lock:
            missing = {tc for tc in missing if self.keys.conversation_key(*tc) is None}
            if not missing:
                return
            await self.catch_up()
            for tenant_id, conversation_id in sorted(missing):
                if self.keys.conversation_key(tenant_id, conversation_id) is None:
                    await self._create(tenant_id, conversation_id)

    async def _create(self, tenant_id: str, conversation_id: str) -> None:
        producer, ring = self._producer, self.keys.ring
        if producer is None:
            raise RuntimeError("this process does not create keys")
        now = _now_ms()
        created: list[KeyRecord] = []
        tmk = ring.latest(tenant_id, KeyScope.TENANT, tenant_id)
        if tmk is None:
            tmk = KeyRing.tmk_id(tenant_id, new_version(now))
            created.append(new_wrapped(ring.root, tenant_id, tmk, parent_version=0, created_at=now))
        scratch = KeyRing(ring.root, wrapped=dict(ring.wrapped))  # the new TMK not yet durable
        for record in created:
            scratch.apply(record)
        cdek = DekId(KeyScope.CONVERSATION, conversation_key_id(conversation_id), new_version(now))
        created.append(
            new_wrapped(
                scratch.dek(tenant_id, tmk),
                tenant_id,
                cdek,
                parent_version=tmk.key_version,
                created_at=now,
            )
        )
        futures = []
        for record in created:
            dek_id = DekId(KeyScope(record.key_scope), record.key_id, record.key_version)
            futures.append(
                await producer.send(
                    self.topic,
                    key=key_record_key(tenant_id, dek_id),
                    value=encode_key_record(record),
                    partition=0,
                )
            )
        await asyncio.gather(*futures)  # acks=all: durable before any body names the key
        for record in created:
            self.keys.apply(record)
        log.info("keys: created a conversation key for %s/%s", tenant_id, conversation_id)


def opened_entry(keys: BodyKeys | None, tenant_id: str, entry: SyncEntry) -> SyncEntry:
    """The MAILBOX_BATCH / PUSH_EVENTS decrypt point (21.3.4), after the read-time join: a
    sealed body opened (an edit's body at the target's seq), other entries unchanged."""
    data = entry.payload_or_ciphertext
    if keys is None or not data or not is_sealed(data):
        return entry
    seqs = [entry.conversation_seq]
    if entry.target_conversation_seq:
        seqs.append(entry.target_conversation_seq)
    plain = keys.open(data, tenant_id, entry.conversation_id, seqs)
    return msgspec.structs.replace(entry, payload_or_ciphertext=plain)
