"""The key app: DevicePreKeyBundle storage, PREKEY_PUBLISH and PREKEY_FETCH (spec 7.14, 22.2).

Run with `faust -A qim.apps.keys worker`. A Faust agent, ``prekeys``, consumes
``qim.prekey-requests`` (group ``qim-keys``, the app id); the table ``DevicePreKeyBundle``
(RocksDB, compacted changelog ``qim-keys-DevicePreKeyBundle-changelog``) is co-partitioned with
it: the row of user u lives in the partition u's requests arrive on, so the partition's one owner
applies every publish and fetch of u in log order and each one-time prekey is handed out once,
however many gateways fetch at the same time. A restart, a wiped datadir or a takeover by
another worker restores the table from its changelog before the agent reads a request (Faust's
table recovery; ``/healthz`` is 503 until it is done).

The agent is thin (``qim.agents.prekeys``): one ``handle`` call per request; the new row is set
in the table, the changelog write is flushed (acks=all) before any reply leaves, so a key is
only ever handed out once its removal is durable.

Pages: ``/metrics`` (the key worker's counters), ``/healthz``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import msgspec

from qim.agents.prekeys import PreKeyDirectory, PreKeyOptions
from qim.apps.base import ROCKSDB_OPTIONS, add_readiness, install_metrics_page, make_app
from qim.params import Settings
from qim.schemas.records.prekeys import decode_prekey_request, encode_prekey_record
from qim.streams.topics import PREKEY_BUNDLES_CHANGELOG, PREKEY_REQUESTS, TO_GATEWAY

log = logging.getLogger(__name__)

app = make_app("qim-keys")

PARTITIONS = int(os.environ.get("QIM_PREKEY_PARTITION_COUNT", "8"))

requests = app.topic(
    PREKEY_REQUESTS.name,
    partitions=PARTITIONS,
    key_type=bytes,
    value_type=bytes,
    key_serializer="raw",
    value_serializer="raw",
)
to_gateway = app.topic(
    TO_GATEWAY.name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
)
bundles = app.Table(  # changelog: PREKEY_BUNDLES_CHANGELOG (its name is Faust's)
    "DevicePreKeyBundle",
    partitions=PARTITIONS,
    key_type=bytes,
    value_type=bytes,
    options=dict(ROCKSDB_OPTIONS),
    help="DevicePreKeyBundle rows keyed (tenant, user): every device's public keys (7.14)",
)

# Rows are our own msgpack bytes (qim.core.e2ee.prekeys): raw in the store and the changelog.
# Collection derives "json" from a plain value type and takes no serializer argument; both the
# store and the changelog topic are made lazily from these attributes, after this point.
_collection: Any = bundles  # TableT does not declare the attributes Collection has
_collection.key_serializer = "raw"
_collection.value_serializer = "raw"

directory = PreKeyDirectory(PreKeyOptions.load(Settings.load(), os.environ))


@app.agent(requests)
async def prekeys(stream: Any) -> None:
    """PREKEY_PUBLISH / PREKEY_FETCH in log order per partition; replies after the changelog."""
    async for event in stream.events():
        try:
            request = decode_prekey_request(event.value)
        except (msgspec.DecodeError, ValueError):
            log.warning("malformed prekey request at offset %s skipped", event.message.offset)
            continue
        key = request.owner_key
        handled = directory.handle(request, bundles.get(key))
        if handled.store is not None:
            bundles[key] = handled.store
            await app.producer.flush()  # the changelog write is acknowledged before any reply
        for reply in handled.replies:
            await to_gateway.send(
                key=reply.key, value=encode_prekey_record(reply), partition=reply.partition
            )


def keys_readiness() -> dict[str, Any]:
    """Serving once the group gave this worker request partitions, each with its table
    partition (the changelog's; recovery itself is Faust's part of readiness)."""
    try:
        assigned = list(app.consumer.assignment())
    except Exception:  # the consumer does not exist before the worker starts
        assigned = []
    owned = sorted(tp.partition for tp in assigned if tp.topic == PREKEY_REQUESTS.name)
    tables = {tp.partition for tp in assigned if tp.topic == PREKEY_BUNDLES_CHANGELOG.name}
    missing = [p for p in owned if p not in tables]
    return {"ready": bool(owned) and not missing, "owned": owned, "without_table": missing}


add_readiness(app, "prekeys", keys_readiness)
install_metrics_page(app, "/metrics", lambda: directory.registry)
