"""A minimal Faust app for the foundation test: a stream into a RocksDB table with a changelog.

Configured through the environment so one module serves several isolated test runs.
"""

from __future__ import annotations

import os

from faust.web import Request, Response, View

from qim.apps.base import ROCKSDB_OPTIONS, make_app

app = make_app(os.environ["QIM_TEST_APP_ID"])
PARTITIONS = 4
topic = app.topic(
    os.environ["QIM_TEST_TOPIC"],
    partitions=PARTITIONS,
    key_type=bytes,
    value_type=bytes,
    key_serializer="raw",
    value_serializer="raw",
)
counts = app.Table("counts", default=int, partitions=PARTITIONS, options=dict(ROCKSDB_OPTIONS))


@app.agent(topic)
async def count(stream):  # type: ignore[no-untyped-def]
    """Count events per key; the table's changelog is what a restarted worker recovers from."""
    async for event in stream.events():
        if event.value == b"crash":
            raise RuntimeError("crash requested by the test")
        key = event.key.decode()
        counts[key] += 1


@app.page("/counts")
async def show_counts(web: View, request: Request) -> Response:
    return web.json(dict(counts.items()))
