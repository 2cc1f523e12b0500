# ruff: noqa: ASYNC109  # timeout= is the reply deadline of one request (see client.py)
"""Typed calls for the request frames of App. A.3, each awaiting its A.4 reply.

Thin on purpose: build the body the spec lists, send it through ``_call`` (request_id
correlation, ERROR -> QimError, timeouts - all in :class:`~qim.client.QimClient`) and return
the typed reply. The server side of most of these lands in later work; the bodies here follow
A.3 field for field so it plugs in unchanged.
"""

from __future__ import annotations

import uuid
from typing import TypeVar

from qim.client.errors import UnexpectedFrame
from qim.client.gaps import HistoryCoverage
from qim.client.identity import Identity
from qim.client.reactions import ReactionState
from qim.client.sessions import SessionList
from qim.schemas.frames import (
    Body,
    CreateGroup,
    HistoryBatch,
    LeaveGroup,
    MailboxBatch,
    MemberListBatch,
    OnlineReady,
    PrekeyFetch,
    PrekeyFetchDown,
    PrekeyPublish,
    PullHistory,
    PullMailbox,
    PullMembers,
    PullSessionList,
    SendAck,
    SendMessage,
    SessionListBatch,
    SyncComplete,
)
from qim.schemas.frames.control import Edit, MarkRead, ReadSync, Recall
from qim.schemas.frames.history import HistoryMessage, SessionEntry
from qim.schemas.frames.reactions import PullReactions, React, ReactionList, ReactionUpdate
from qim.schemas.message_types import MessageType

__all__ = ["FrameCalls"]

R = TypeVar("R", bound=Body)


class FrameCalls:
    """Mixin of :class:`~qim.client.QimClient`: one method per request frame."""

    identity: Identity | None = None
    """Tenant and user of this client (from the access token at connect, or set by the app)."""

    sessions: SessionList
    coverage: HistoryCoverage
    """The local session list (12.6.2, 12.8.3), fed by pages and by the session frames."""

    reactions: ReactionState
    """Reaction aggregates by message (13.6.2), fed by REACTION_UPDATE, REACT replies and
    history pages; newer ``summary_version`` only."""

    async def _call(self, body: Body, reply: type[R], timeout: float | None) -> R:
        raise NotImplementedError

    async def send(self, body: Body, *, stream_id: int | None = None) -> None:
        raise NotImplementedError

    async def send_message(
        self,
        conversation_id: str,
        payload: bytes = b"",
        *,
        client_message_id: str | None = None,
        message_type: int = 0,
        custom_type: str = "",
        mention_targets: tuple[str, ...] = (),
        reply_to_conversation_seq: int | None = None,
        peer_user_id: str = "",
        timeout: float | None = None,
    ) -> SendAck:
        """SEND_MESSAGE (A.3 #4) -> SEND_ACK; ``client_message_id`` defaults to a fresh uuid4.

        Resend with the same ``client_message_id`` to retry idempotently (§8, 7200 s window).
        ``peer_user_id`` names the other user of a one-to-one (``d:``) conversation, whose id
        is a one-way hash; leave it empty for groups. :meth:`send_direct` fills both in.
        """
        cmid = client_message_id or uuid.uuid4().hex
        body = SendMessage(
            client_message_id=cmid,
            conversation_id=conversation_id,
            message_type=message_type,
            custom_type=custom_type,
            payload=payload,
            mention_targets=mention_targets,
            reply_to_conversation_seq=reply_to_conversation_seq,
            peer_user_id=peer_user_id,
        )
        ack = await self._call(body, SendAck, timeout)
        if ack.client_message_id != cmid:  # A.4 #6: must echo it
            raise UnexpectedFrame(f"SEND_ACK echoes {ack.client_message_id!r}, sent {cmid!r}")
        return ack

    async def send_custom(
        self,
        conversation_id: str,
        custom_type: str,
        payload: bytes = b"",
        *,
        target_conversation_seq: int | None = None,
        peer_user_id: str = "",
        client_message_id: str | None = None,
        timeout: float | None = None,
    ) -> SendAck:
        """SEND_MESSAGE of a tenant-declared custom type (``message_type`` CUSTOM, spec 13.3).

        The server applies the type's declared contract (unread, ordering, timeline) and never
        reads ``payload``. An ``anchor_target`` type names the row it updates with
        ``target_conversation_seq`` (sent as ``reply_to_conversation_seq``). An undeclared
        type raises ``QimError(PERMISSION_DENIED)``, an oversize payload
        ``QimError(PAYLOAD_TOO_LARGE)``. An ``ephemeral`` type is relayed to the members'
        online devices only (the sender's other devices included) as a PUSH_EVENTS entry with
        ``mailbox_seq`` 0 and is never stored: its SEND_ACK has ``conversation_seq`` 0.
        """
        return await self.send_message(
            conversation_id,
            payload,
            client_message_id=client_message_id,
            message_type=MessageType.CUSTOM,
            custom_type=custom_type,
            reply_to_conversation_seq=target_conversation_seq,
            peer_user_id=peer_user_id,
            timeout=timeout,
        )

    def direct_conversation_id(
        self, peer_user_id: str, *, tenant_id: str | None = None, user_id: str | None = None
    ) -> str:
        """The one-to-one conversation id with ``peer_user_id`` (for PULL_HISTORY and the like).

        Tenant and user default to :attr:`identity`; raises ValueError when neither is known
        (a token that is not a qim access token and no ``identity`` set).
        """
        me = self.identity
        tenant = tenant_id or (me.tenant_id if me is not None else None)
        user = user_id or (me.user_id if me is not None else None)
        if not tenant or not user:
            raise ValueError(
                "the client's tenant_id/user_id are unknown (the access token does not say): "
                "pass tenant_id= and user_id=, set client.identity, or call send_message() with "
                "the conversation id and peer_user_id"
            )
        return Identity(tenant, user).direct_conversation_id(peer_user_id)

    async def send_direct(
        self,
        peer_user_id: str,
        payload: bytes = b"",
        *,
        tenant_id: str | None = None,
        user_id: str | None = None,
        client_message_id: str | None = None,
        message_type: int = 0,
        custom_type: str = "",
        reply_to_conversation_seq: int | None = None,
        timeout: float | None = None,
    ) -> SendAck:
        """SEND_MESSAGE into the one-to-one conversation with ``peer_user_id`` -> SEND_ACK.

        No "create" step: the conversation id is derived (:meth:`direct_conversation_id`), the
        same on both sides and on the server, which checks the pair from the session's user.
        """
        conversation_id = self.direct_conversation_id(
            peer_user_id, tenant_id=tenant_id, user_id=user_id
        )
        return await self.send_message(
            conversation_id,
            payload,
            client_message_id=client_message_id,
            message_type=message_type,
            custom_type=custom_type,
            reply_to_conversation_seq=reply_to_conversation_seq,
            peer_user_id=peer_user_id,
            timeout=timeout,
        )

    async def pull_mailbox(
        self,
        after_seq: int,
        *,
        up_to_seq: int = 0,
        max_items: int = 0,
        max_bytes: int = 0,
        acked_seq: int = 0,
        timeout: float | None = None,
    ) -> MailboxBatch:
        """PULL_MAILBOX (A.3 #2) -> MAILBOX_BATCH; ``up_to_seq=0`` = the lane's watermark. The
        reaction aggregates joined onto its message entries go to :attr:`reactions`."""
        body = PullMailbox(
            after_seq=after_seq,
            up_to_seq=up_to_seq,
            max_items=max_items,
            max_bytes=max_bytes,
            acked_seq=acked_seq,
        )
        batch = await self._call(body, MailboxBatch, timeout)
        self.reactions.apply_entries(batch.entries)
        return batch

    async def sync_complete(self, sync_to_seq: int, *, timeout: float | None = None) -> OnlineReady:
        """SYNC_COMPLETE (A.3 #3) -> ONLINE_READY, or QimError SYNC_INCOMPLETE (§9.3.4)."""
        return await self._call(SyncComplete(sync_to_seq=sync_to_seq), OnlineReady, timeout)

    async def recall(
        self, conversation_id: str, target_conversation_seq: int, *, timeout: float | None = None
    ) -> SendAck:
        """RECALL (A.3 #8) -> SEND_ACK of the recall's CONTROL event (its own seq, 13.4.1).

        Repeating it is harmless: the writer answers the first recall's ack (13.4.4). Raises
        ``QimError`` on ERROR (PERMISSION_DENIED: not yours, window closed, no such message).
        """
        body = Recall(
            conversation_id=conversation_id, target_conversation_seq=target_conversation_seq
        )
        return await self._call(body, SendAck, timeout)

    async def edit(
        self,
        conversation_id: str,
        target_conversation_seq: int,
        new_payload: bytes,
        *,
        timeout: float | None = None,
    ) -> SendAck:
        """EDIT (A.3 #9) -> SEND_ACK of the edit's CONTROL event; ERROR raises ``QimError``.

        Own messages within ``edit_self_window`` only; each edit is a new event (no dedup).
        """
        body = Edit(
            conversation_id=conversation_id,
            target_conversation_seq=target_conversation_seq,
            new_payload=new_payload,
        )
        return await self._call(body, SendAck, timeout)

    async def pull_history(
        self,
        conversation_id: str,
        *,
        direction: str = "older",
        anchor_conversation_seq: int = 0,
        limit: int = 0,
        max_bytes: int = 0,
        timeout: float | None = None,
    ) -> HistoryBatch:
        """PULL_HISTORY (A.3 #5) -> HISTORY_BATCH; ``direction`` is "older" or "newer"."""
        if direction not in ("older", "newer"):
            raise ValueError(f"direction must be 'older' or 'newer', not {direction!r}")
        body = PullHistory(
            conversation_id=conversation_id,
            direction=direction,
            anchor_conversation_seq=anchor_conversation_seq,
            limit=limit,
            max_bytes=max_bytes,
        )
        batch = await self._call(body, HistoryBatch, timeout)
        self.reactions.apply_history(conversation_id, batch)
        return batch

    async def enter_conversation(
        self,
        conversation_id: str,
        *,
        limit: int = 0,
        max_pages: int = 20,
        timeout: float | None = None,
    ) -> list[HistoryMessage]:
        """The 10.2.3 gap rule on entering a conversation: for a ``mention_only`` row of
        :attr:`sessions` (from PULL_SESSION_LIST), fill ``(through, latest_conversation_seq]``
        with PULL_HISTORY ``newer`` pages and return the messages pulled; an ``always`` row
        (or none) pulls nothing (:class:`~qim.client.gaps.HistoryCoverage`)."""
        pulled: list[HistoryMessage] = []
        for _ in range(max_pages):
            gap = self.coverage.gap(self.sessions.rows.get(conversation_id))
            if gap is None:
                break
            after = gap[0]
            batch = await self.pull_history(
                conversation_id,
                direction="newer",
                anchor_conversation_seq=after,
                limit=limit,
                timeout=timeout,
            )
            pulled.extend(batch.messages)
            if self.coverage.filled(conversation_id, after, batch) <= after:
                break  # nothing new: the server has nothing above ``after`` yet
        return pulled

    async def react(
        self,
        conversation_id: str,
        conversation_seq: int,
        reaction_key: str,
        *,
        remove: bool = False,
        timeout: float | None = None,
    ) -> ReactionUpdate:
        """REACT (A.3 #18) -> the message's absolute REACTION_UPDATE, applied to
        :attr:`reactions`. Idempotent: a repeated add or a remove of nothing succeeds and
        changes nothing (13.6.2); a non-member or a recalled message gets PERMISSION_DENIED."""
        body = React(
            conversation_id=conversation_id,
            conversation_seq=conversation_seq,
            reaction_key=reaction_key,
            action="remove" if remove else "add",
        )
        update = await self._call(body, ReactionUpdate, timeout)
        self.reactions.apply(update)
        return update

    async def pull_reactions(
        self,
        conversation_id: str,
        conversation_seq: int,
        reaction_key: str = "",
        *,
        offset: int = 0,
        limit: int = 0,
        timeout: float | None = None,
    ) -> ReactionList:
        """PULL_REACTIONS (A.3 #19) -> REACTION_LIST: who reacted with ``reaction_key`` (empty:
        any key), ``limit`` <= ``reaction_detail_page_limit`` (0 = that limit). ``users`` is
        empty with only ``total`` in a group above ``reaction_detail_max_members``."""
        body = PullReactions(
            conversation_id=conversation_id,
            conversation_seq=conversation_seq,
            reaction_key=reaction_key,
            offset=offset,
            limit=limit,
        )
        return await self._call(body, ReactionList, timeout)

    async def pull_session_list(
        self,
        *,
        snapshot_revision: int = 0,
        page_cursor: bytes = b"",
        limit: int = 0,
        timeout: float | None = None,
    ) -> SessionListBatch:
        """PULL_SESSION_LIST (A.3 #6) -> SESSION_LIST_BATCH."""
        body = PullSessionList(
            snapshot_revision=snapshot_revision, page_cursor=page_cursor, limit=limit
        )
        return await self._call(body, SessionListBatch, timeout)

    async def load_session_list(
        self, *, limit: int = 0, timeout: float | None = None
    ) -> list[SessionEntry]:
        """Every page of PULL_SESSION_LIST into :attr:`sessions`; a revision change mid-way
        starts again from page 1 (12.8.2). Returns the list in display order."""
        for _ in range(10):
            batch = await self.pull_session_list(limit=limit, timeout=timeout)
            self.sessions.apply_page(batch, first=True)
            while batch.has_more:
                batch = await self.pull_session_list(
                    snapshot_revision=batch.snapshot_revision,
                    page_cursor=batch.next_page_cursor,
                    limit=limit,
                    timeout=timeout,
                )
                if not self.sessions.apply_page(batch, first=False):
                    break
            else:
                return self.sessions.ordered()
        raise UnexpectedFrame("the session list kept changing revision while paging")

    async def mark_read(self, conversation_id: str, read_conversation_seq: int) -> None:
        """MARK_READ (A.3): forward only, no reply; the other devices get READ_SYNC. Applied
        to the local list at once (12.5.1 recomputed from the row: read >= latest -> 0)."""
        body = MarkRead(
            conversation_id=conversation_id, read_conversation_seq=read_conversation_seq
        )
        await self.send(body)
        self.sessions.apply_read_sync(
            ReadSync(conversation_id=conversation_id, read_conversation_seq=read_conversation_seq)
        )

    async def create_group(
        self,
        group_id: str,
        member_ids: tuple[str, ...] = (),
        *,
        e2ee: bool = False,
        timeout: float | None = None,
    ) -> MemberListBatch:
        """CREATE_GROUP (A.3 #21) -> MEMBER_LIST_BATCH; ``member_ids`` are invitees only.
        ``e2ee`` creates an end-to-end encrypted group (spec 22.1, fixed for its life)."""
        body = CreateGroup(group_id=group_id, member_ids=tuple(member_ids), e2ee=e2ee)
        return await self._call(body, MemberListBatch, timeout)

    async def leave_group(self, group_id: str, *, timeout: float | None = None) -> MemberListBatch:
        """LEAVE_GROUP (A.3 #22) -> MEMBER_LIST_BATCH (empty members, total_hint after)."""
        return await self._call(LeaveGroup(group_id=group_id), MemberListBatch, timeout)

    async def pull_members(
        self,
        conversation_id: str,
        *,
        filter: str = "all",
        query: str = "",
        offset: int = 0,
        limit: int = 0,
        timeout: float | None = None,
    ) -> MemberListBatch:
        """PULL_MEMBERS (A.3 #20) -> MEMBER_LIST_BATCH; ``filter`` all|admin|banned|search."""
        body = PullMembers(
            conversation_id=conversation_id, filter=filter, query=query, offset=offset, limit=limit
        )
        return await self._call(body, MemberListBatch, timeout)

    async def publish_prekeys(
        self, bundle: PrekeyPublish, *, timeout: float | None = None
    ) -> PrekeyFetchDown:
        """PREKEY_PUBLISH (A.3 #23, whole-bundle overwrite) -> the device's stored bundle as a
        PREKEY_FETCH downlink (``one_time_remaining``; our reply, A.3 names none)."""
        return await self._call(bundle, PrekeyFetchDown, timeout)

    async def fetch_prekeys(
        self, user_id: str, device_ids: tuple[str, ...] = (), *, timeout: float | None = None
    ) -> PrekeyFetchDown:
        """PREKEY_FETCH (A.3 #24) -> one bundle per target device (no ``device_ids``: all);
        ``QimError(PREKEY_EXHAUSTED)`` when a device is out of one-time keys and the tenant
        forbids the SignedPreKey fallback."""
        body = PrekeyFetch(target_user_id=user_id, target_device_ids=device_ids)
        return await self._call(body, PrekeyFetchDown, timeout)
