"""Fetch a topic's :class:`LogIdentity` from the broker (Metadata v12, KIP-516 topic ids).

Why our own request: aiokafka's metadata stops at v5, which carries no topic id; v10+ does. The
structs below follow the Kafka protocol's Metadata v12 schema (flexible version: compact
strings, tagged fields); the connection negotiates the version, so a broker without v12 fails
with ``IncompatibleBrokerVersion`` -- i.e. closed, as 17.2 asks of brokers without topic ids.
"""

from __future__ import annotations

from io import BytesIO

from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.abstract import AbstractType
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    Boolean,
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Schema,
    TaggedFields,
)

from qim.schemas.log_identity import LogIdentity

__all__ = ["fetch_log_identities", "fetch_log_identity"]


class _Uuid(AbstractType[bytes]):  # type: ignore[misc]  # aiokafka is untyped
    @classmethod
    def encode(cls, value: bytes) -> bytes:
        return value

    @classmethod
    def decode(cls, data: BytesIO) -> bytes:
        value = data.read(16)
        if len(value) != 16:
            raise ValueError("Buffer underrun decoding uuid")
        return value


class _MetadataResponseV12(Response):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = 3
    API_VERSION = 12
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "brokers",
            CompactArray(
                ("node_id", Int32),
                ("host", CompactString("utf-8")),
                ("port", Int32),
                ("rack", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("cluster_id", CompactString("utf-8")),
        ("controller_id", Int32),
        (
            "topics",
            CompactArray(
                ("error_code", Int16),
                ("name", CompactString("utf-8")),
                ("topic_id", _Uuid),
                ("is_internal", Boolean),
                (
                    "partitions",
                    CompactArray(
                        ("error_code", Int16),
                        ("partition_index", Int32),
                        ("leader_id", Int32),
                        ("leader_epoch", Int32),
                        ("replica_nodes", CompactArray(Int32)),
                        ("isr_nodes", CompactArray(Int32)),
                        ("offline_replicas", CompactArray(Int32)),
                        ("tags", TaggedFields),
                    ),
                ),
                ("topic_authorized_operations", Int32),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _MetadataRequestV12(RequestStruct):  # type: ignore[misc]  # aiokafka is untyped
    FLEXIBLE_VERSION = True
    API_KEY = 3
    API_VERSION = 12
    RESPONSE_TYPE = _MetadataResponseV12
    SCHEMA = Schema(
        (
            "topics",
            CompactArray(
                ("topic_id", _Uuid), ("name", CompactString("utf-8")), ("tags", TaggedFields)
            ),
        ),
        ("allow_auto_topic_creation", Boolean),
        ("include_topic_authorized_operations", Boolean),
        ("tags", TaggedFields),
    )


class _TopicIdsRequest(Request[_MetadataRequestV12]):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = 3

    def __init__(self, topics: list[str]) -> None:
        self._topics = topics

    def build(self, request_struct_class: type[_MetadataRequestV12]) -> _MetadataRequestV12:
        rows: list[tuple[bytes, str, dict[int, bytes]]] = [(bytes(16), n, {}) for n in self._topics]
        return request_struct_class(rows, False, False, {})


async def fetch_log_identities(bootstrap: str, topics: list[str]) -> dict[str, LogIdentity]:
    """The identity of each of ``topics`` (a missing topic raises ``LookupError``)."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap, client_id="qim-log-identity")
    await client.bootstrap()
    try:
        node = client.get_random_node()
        response = await client.send(node, _TopicIdsRequest(sorted(set(topics))))
    finally:
        await client.close()
    cluster_id = response.cluster_id or ""
    found: dict[str, LogIdentity] = {}
    for error_code, name, topic_id, _internal, partitions, _ops, _tags in response.topics:
        if error_code == 0 and name is not None:
            found[name] = LogIdentity(cluster_id, topic_id.hex(), len(partitions))
    missing = [t for t in topics if t not in found]
    if missing:
        raise LookupError(f"topics not found on {bootstrap}: {', '.join(missing)}")
    return found


async def fetch_log_identity(bootstrap: str, topic: str) -> LogIdentity:
    """The identity of one topic."""
    return (await fetch_log_identities(bootstrap, [topic]))[topic]
