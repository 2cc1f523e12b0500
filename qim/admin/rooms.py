"""Chatroom definitions for operators: ``qim room create / delete`` (spec 14.5).

A room exists iff ``qim.rooms`` (compacted) holds its :class:`RoomDefinition`; the RoomWriters
follow that topic. Creating a room again replaces its policy (allowed / banned users);
deleting it writes the tombstone, after which JOIN, REPLAY and sends answer PERMISSION_DENIED
exactly as for a room that never existed. Written with ``acks=all`` and awaited: the command
returns once the definition is durable.
"""

from __future__ import annotations

import asyncio
import os

import click
from aiokafka import AIOKafkaProducer

from qim.core.rooms.ids import is_room_id
from qim.schemas.records.rooms import RoomDefinition, encode_room_record, room_key
from qim.streams.topics import ROOMS

__all__ = ["define_room", "delete_room", "room"]

DEFAULT_BOOTSTRAP = "127.0.0.1:19092"


async def _produce(bootstrap: str, key: bytes, value: bytes | None, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key, partition=0)
    finally:
        await producer.stop()


async def define_room(
    bootstrap: str, definition: RoomDefinition, *, topic: str = ROOMS.name
) -> None:
    if not is_room_id(definition.room_id):
        raise ValueError(f"not a room id (r:<name>): {definition.room_id!r}")
    await _produce(bootstrap, definition.key, encode_room_record(definition), topic)


async def delete_room(
    bootstrap: str, tenant_id: str, room_id: str, *, topic: str = ROOMS.name
) -> None:
    await _produce(bootstrap, room_key(tenant_id, room_id), None, topic)


def _users(raw: str) -> tuple[str, ...]:
    return tuple(sorted({u.strip() for u in raw.split(",") if u.strip()}))


def _bootstrap() -> str:
    return os.environ.get("QIM_KAFKA_BOOTSTRAP", DEFAULT_BOOTSTRAP)


@click.group()
def room() -> None:
    """Chatrooms: define and delete rooms (``r:<name>``)."""


@room.command("create")
@click.argument("room_id")
@click.option("--tenant", required=True)
@click.option("--allow", default="", help="comma-separated users; empty = the whole tenant")
@click.option("--ban", default="", help="comma-separated users that may never enter")
def create(room_id: str, tenant: str, allow: str, ban: str) -> None:
    """Create (or redefine) a room."""
    definition = RoomDefinition(
        tenant_id=tenant, room_id=room_id, allowed_users=_users(allow), banned_users=_users(ban)
    )
    try:
        asyncio.run(define_room(_bootstrap(), definition))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"room {room_id} of {tenant} defined")


@room.command("delete")
@click.argument("room_id")
@click.option("--tenant", required=True)
def delete(room_id: str, tenant: str) -> None:
    """Delete a room: it is answered as if it never existed."""
    asyncio.run(delete_room(_bootstrap(), tenant, room_id))
    click.echo(f"room {room_id} of {tenant} deleted")
