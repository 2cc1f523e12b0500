"""GroupAdmin: the trusted admin plane's group operations as request/reply over Kafka.

Membership has exactly one writer, the ConversationWriter owning the group's conversation
partition (direction.md §4.3, spec 7.9), so the admin plane never touches membership state: it
produces an :class:`AdminGroupRequest` to ``qim.conversation-requests`` at
``conversation_partition(tenant, group_id, count)`` - the same partition the group's messages
use, so the change is ordered with them - and waits for the :class:`AdminReply` the writer
commits to ``qim.admin-replies`` (spec A.3 #21-#22 notes: GroupAdd / GroupRemove are admin-plane
operations, there is no owner-kick frame).

Actions: ``create`` (``actor`` is the creator, who becomes OWNER as with CREATE_GROUP;
``member_ids`` are the invitees), ``add``, ``remove`` (``ban`` bans too), ``set_role`` (grant or
revoke ADMIN), ``transfer`` (ownership), ``dissolve`` and ``show`` (read-only: the reply's
``membership_version`` and ``member_count``; the writer side of ``show`` is wired by the
conversation app). With ``as_member`` the change is made on behalf of the member ``actor`` and
the spec 20.2.2 role table applies to it (``qim.core.membership.roles``); without it the admin
plane acts as the trusted operator.

Room promotion (spec 14.4, :meth:`GroupAdmin.promote_room`): a ``RoomPromoteRequest`` to the
room's RoomWriter stops the room's ``room_seq`` allocation and answers its online members;
they become the initial members of a new group (``create``: ``joined_at_conversation_seq`` = 0,
``conversation_seq`` from 1, nothing back-filled); then the room's definition is deleted, so the
room ends durably (later JOINs are PERMISSION_DENIED as for any room that does not exist).

Timeouts: no reply within ``timeout_s`` raises :class:`AdminTimeout`. The request may still be
applied later (no writer running yet, a rebalance); retrying is safe: a second create is refused
(the group exists), add and remove skip users already in or out (``qim.core.membership``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable

from qim.admin.replies import AdminReplyWaiter
from qim.core.conversation.ids import group_conversation_id
from qim.core.rooms.ids import is_room_id, room_partition
from qim.gateway.routing.forwarder import (
    RequestProducer,
    check_partition_count,
    kafka_request_producer,
)
from qim.schemas.frames import Error, for_code
from qim.schemas.hashing import validate_identifier
from qim.schemas.records.membership import Role
from qim.schemas.records.requests import (
    AdminGroupRequest,
    AdminReply,
    AdminReplyTo,
    conversation_partition,
    encode_record,
)
from qim.schemas.records.rooms import RoomPromoteRequest, encode_room_record
from qim.streams.topics import ADMIN_REPLIES, CONVERSATION_REQUESTS, ROOM_REQUESTS, ROOMS

__all__ = ["ACTIONS", "AdminRejected", "AdminTimeout", "GroupAdmin"]

ACTIONS = ("create", "add", "remove", "show", "set_role", "transfer", "dissolve")
SETTABLE_ROLES = (Role.ADMIN, Role.MEMBER, Role.GUEST)
"""Roles ``set_role`` may give; OWNER moves only by ``transfer``."""
_NEEDS_MEMBERS = ("add", "remove", "set_role", "transfer")


class AdminTimeout(Exception):
    """No AdminReply in time; the request may still be applied (retrying is safe)."""


class AdminRejected(Exception):
    """The ConversationWriter refused the operation: ``error`` is its ERROR body (A.6)."""

    def __init__(self, error: Error) -> None:
        self.error = error
        self.code_name = for_code(error.code).name
        super().__init__(f"{self.code_name}: {error.detail}" if error.detail else self.code_name)


class GroupAdmin:
    """One admin node: a producer and a reply waiter; ``start`` / ``stop``."""

    def __init__(
        self,
        bootstrap: str,
        *,
        node_id: str | None = None,
        partition_count: int = 16,
        timeout_s: float = 10.0,
        requests_topic: str = CONVERSATION_REQUESTS.name,
        replies_topic: str = ADMIN_REPLIES.name,
        producer: RequestProducer | None = None,
        waiter: AdminReplyWaiter | None = None,
        room_requests_topic: str = ROOM_REQUESTS.name,
        rooms_topic: str = ROOMS.name,
    ) -> None:
        self.node_id = node_id or f"admin-{uuid.uuid4().hex[:12]}"
        validate_identifier(self.node_id, "node_id")
        self.partition_count = partition_count
        self.timeout_s = timeout_s
        self.requests_topic = requests_topic
        self._producer = producer or kafka_request_producer(
            bootstrap, linger_ms=1, client_id=self.node_id
        )
        self._waiter = waiter or AdminReplyWaiter(bootstrap, replies_topic, self.node_id)
        self.room_requests_topic = room_requests_topic
        self.rooms_topic = rooms_topic

    async def start(self) -> None:
        """Resolve the reply position first, then the producer (fails on a partition mismatch)."""
        try:
            await self._waiter.start()
        except BaseException:
            await self._producer.stop()  # created, never started: close it all the same
            raise
        try:
            await self._producer.start()
            await check_partition_count(self._producer, self.requests_topic, self.partition_count)
        except BaseException:
            await self._producer.stop()
            await self._waiter.stop()
            raise

    async def stop(self) -> None:
        await self._producer.stop()
        await self._waiter.stop()

    # -- operations -----------------------------------------------------------------------------

    async def create(
        self,
        tenant_id: str,
        group_id: str,
        owner_id: str,
        member_ids: Iterable[str] = (),
        *,
        e2ee: bool = False,
    ) -> AdminReply:
        """``e2ee``: an end-to-end encrypted group (spec 22.1; fixed at creation)."""
        return await self.execute(tenant_id, group_id, "create", owner_id, member_ids, e2ee=e2ee)

    async def add(
        self,
        tenant_id: str,
        group_id: str,
        member_ids: Iterable[str],
        actor: str,
        *,
        as_member: bool = False,
    ) -> AdminReply:
        return await self.execute(
            tenant_id, group_id, "add", actor, member_ids, as_member=as_member
        )

    async def remove(
        self,
        tenant_id: str,
        group_id: str,
        member_ids: Iterable[str],
        actor: str,
        *,
        ban: bool = False,
        as_member: bool = False,
    ) -> AdminReply:
        return await self.execute(
            tenant_id, group_id, "remove", actor, member_ids, ban=ban, as_member=as_member
        )

    async def set_role(
        self,
        tenant_id: str,
        group_id: str,
        member_ids: Iterable[str],
        role: str,
        actor: str,
        *,
        as_member: bool = False,
    ) -> AdminReply:
        return await self.execute(
            tenant_id, group_id, "set_role", actor, member_ids, role=role, as_member=as_member
        )

    async def transfer(
        self, tenant_id: str, group_id: str, new_owner: str, actor: str, *, as_member: bool = False
    ) -> AdminReply:
        return await self.execute(
            tenant_id, group_id, "transfer", actor, (new_owner,), as_member=as_member
        )

    async def dissolve(
        self, tenant_id: str, group_id: str, actor: str, *, as_member: bool = False
    ) -> AdminReply:
        return await self.execute(tenant_id, group_id, "dissolve", actor, as_member=as_member)

    async def show(self, tenant_id: str, group_id: str, actor: str) -> AdminReply:
        return await self.execute(tenant_id, group_id, "show", actor)

    async def promote_room(
        self, tenant_id: str, room_id: str, group_id: str, owner_id: str
    ) -> tuple[AdminReply, tuple[str, ...]]:
        """14.4: the room's online members -> a new group (``owner_id`` its OWNER); returns the
        group create's reply and the members the room had online."""
        if not is_room_id(room_id):
            raise ValueError(f"not a room id (r:<name>): {room_id!r}")
        group_conversation_id(group_id)
        validate_identifier(owner_id, "owner_id")
        reply_to = AdminReplyTo(node_id=self.node_id, correlation_id=uuid.uuid4().hex)
        request = RoomPromoteRequest(
            tenant_id=tenant_id, room_id=room_id, group_id=group_id, reply_to=reply_to
        )
        count = len(await self._producer.partitions_for(self.room_requests_topic))
        online = await self._round_trip(
            self.room_requests_topic,
            encode_room_record(request),
            request.key,
            room_partition(tenant_id, room_id, count),
            reply_to.correlation_id,
            f"promote {room_id!r}",
        )
        members = tuple(m for m in online.member_ids if m != owner_id)
        created = await self.create(tenant_id, group_id, owner_id, members)
        delivery = await self._producer.send(self.rooms_topic, None, key=request.key, partition=0)
        await delivery  # the room's definition is gone: it ends for good
        return created, online.member_ids

    async def _round_trip(
        self, topic: str, value: bytes, key: bytes, partition: int, correlation_id: str, what: str
    ) -> AdminReply:
        future = self._waiter.expect(correlation_id)
        try:
            delivery = await self._producer.send(topic, value=value, key=key, partition=partition)
            await delivery
            async with asyncio.timeout(self.timeout_s):
                reply = await future
        except TimeoutError:
            raise AdminTimeout(
                f"no AdminReply to {what} within {self.timeout_s:g} s: is its worker running?"
            ) from None
        finally:
            self._waiter.discard(correlation_id)
        if reply.error is not None:
            raise AdminRejected(reply.error)
        return reply

    async def execute(
        self,
        tenant_id: str,
        group_id: str,
        action: str,
        actor: str,
        member_ids: Iterable[str] = (),
        *,
        ban: bool = False,
        role: str = "",
        as_member: bool = False,
        e2ee: bool = False,
    ) -> AdminReply:
        """Produce one AdminGroupRequest and return its AdminReply.

        Raises ValueError for a malformed argument (nothing produced), AdminRejected when the
        writer refuses, AdminTimeout, or the producer's error when Kafka did not take it.
        """
        request = self.request(
            tenant_id,
            group_id,
            action,
            actor,
            member_ids,
            ban=ban,
            role=role,
            as_member=as_member,
            e2ee=e2ee,
        )
        reply_to = request.reply_to
        assert reply_to is not None
        partition = conversation_partition(tenant_id, group_id, self.partition_count)
        future = self._waiter.expect(reply_to.correlation_id)
        try:
            delivery = await self._producer.send(
                self.requests_topic,
                value=encode_record(request),
                key=request.key,
                partition=partition,
            )
            await delivery
            async with asyncio.timeout(self.timeout_s):
                reply = await future
        except TimeoutError:
            raise AdminTimeout(
                f"no AdminReply to {action} {group_id!r} within {self.timeout_s:g} s "
                f"(correlation_id {reply_to.correlation_id}): is a conversation worker running? "
                "The request may still be applied; retrying is safe"
            ) from None
        finally:
            self._waiter.discard(reply_to.correlation_id)
        if reply.error is not None:
            raise AdminRejected(reply.error)
        return reply

    def request(
        self,
        tenant_id: str,
        group_id: str,
        action: str,
        actor: str,
        member_ids: Iterable[str] = (),
        *,
        ban: bool = False,
        role: str = "",
        as_member: bool = False,
        e2ee: bool = False,
    ) -> AdminGroupRequest:
        """The validated envelope with a fresh ``reply_to`` (pure; tests read it)."""
        if action not in ACTIONS:
            raise ValueError(f"action must be one of {', '.join(ACTIONS)}, not {action!r}")
        validate_identifier(tenant_id, "tenant_id")
        group_conversation_id(group_id)  # "g:" + name
        validate_identifier(actor, "actor")
        members = tuple(dict.fromkeys(member_ids))
        for member in members:
            validate_identifier(member, "member_id")
        if action in _NEEDS_MEMBERS and not members:
            raise ValueError(f"{action} needs at least one member id")
        if action == "transfer" and len(members) != 1:
            raise ValueError("transfer needs exactly one new owner")
        if action == "set_role" and role not in SETTABLE_ROLES:
            raise ValueError(f"role must be one of {', '.join(SETTABLE_ROLES)}, not {role!r}")
        if e2ee and action != "create":
            raise ValueError("e2ee is fixed when a group is created (spec 22.1)")
        correlation_id = uuid.uuid4().hex
        return AdminGroupRequest(
            tenant_id=tenant_id,
            group_id=group_id,
            action=action,
            actor=actor,
            member_ids=members,
            ban=ban and action == "remove",
            reply_to=AdminReplyTo(node_id=self.node_id, correlation_id=correlation_id),
            as_member=as_member,
            role=role if action == "set_role" else "",
            e2ee=e2ee,
        )
