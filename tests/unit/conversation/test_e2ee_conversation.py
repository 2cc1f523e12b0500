"""An E2EE conversation downstream of its flag (spec 22.3, 16.7, AT-47, AT-55, AT-119).

The chain is the production one, pure: the writer decides a send / edit / recall in a group
flagged E2EE -> ``message_dispatch`` / ``amend_dispatch`` (fanout) -> the shard's message facts
(the session preview) -> ``plan_push_tasks`` -> the provider payloads. Everywhere the body is
the client's bytes, untouched, and everywhere a preview or a push text would be, it is the
placeholder, never derived from the body.
"""

from __future__ import annotations

import dataclasses

import msgspec

from qim.agents.notify.delivery import notification_for
from qim.agents.notify.providers import ApnsConfig, ApnsProvider, FcmConfig, FcmProvider
from qim.core.conversation import Amended, ConversationWriterState
from qim.core.fanout.build import amend_dispatch, message_dispatch
from qim.core.history import (
    MemoryOrderedStore,
    MessageRecord,
    archive_batch,
    decode_message_record,
    message_key,
    write_all,
)
from qim.core.mailbox.session_store import amended_facts, facts_of
from qim.core.notify.rules import Send
from qim.core.notify.tasks import (
    E2EE_PUSH_PLACEHOLDER,
    Badge,
    DigestCache,
    UserFold,
    plan_push_tasks,
)
from qim.schemas.frames.base import EntryFlags, EventType
from qim.schemas.frames.mailbox import SyncEntry
from qim.schemas.message_types import MessageType
from qim.schemas.records import AmendRequest
from qim.schemas.records.notify import DeviceKey, DeviceTokenDigest
from qim.schemas.records.outbox import MessageAmended, MessageCommitted, PreviewPlaceholder
from tests.unit.conversation.support import (
    NOW,
    REGION,
    TENANT,
    WRITER,
    Groups,
    accepted,
    config,
    contract,
    direct_request,
    send_request,
    typed_config,
    writer,
)

SECRET, PLAIN = "g:secret", "g:plain"
CIPHERTEXT = b"\x00\x93sealed-body\xff" * 4
MARKER = b"sealed-body"


class _AdminGroups(Groups):
    def is_admin(self, tenant_id: str, conversation_id: str, user_id: str) -> bool:
        return False


def _groups() -> _AdminGroups:
    groups = _AdminGroups()
    groups.add(SECRET, {"ann", "bob"}, e2ee=True)
    groups.add(PLAIN, {"ann", "bob"})
    return groups


def _placeholder(data: bytes) -> PreviewPlaceholder:
    return msgspec.msgpack.decode(data, type=PreviewPlaceholder)


def test_a_send_in_an_e2ee_group_keeps_the_ciphertext_and_previews_the_placeholder() -> None:
    w, groups = writer(), _groups()
    record = accepted(
        w.handle_send(send_request("ann", SECRET, payload=CIPHERTEXT), NOW, groups)
    ).record
    assert isinstance(record, MessageCommitted)
    assert record.e2ee and record.payload == CIPHERTEXT
    assert _placeholder(record.preview_or_placeholder) == PreviewPlaceholder(
        message_type=MessageType.RICH_TEXT, e2ee=True
    )
    assert MARKER not in record.preview_or_placeholder
    # the same send to a plaintext group is unchanged: no flag, no e2ee key in its bytes
    plain = accepted(w.handle_send(send_request("ann", PLAIN, payload=b"hi"), NOW, groups)).record
    assert isinstance(plain, MessageCommitted) and not plain.e2ee
    assert not _placeholder(plain.preview_or_placeholder).e2ee
    assert b"e2ee" not in plain.preview_or_placeholder


def test_the_fanout_ships_the_placeholder_so_the_shard_preview_is_never_the_body() -> None:
    w, groups = writer(), _groups()
    record = accepted(
        w.handle_send(send_request("ann", SECRET, payload=CIPHERTEXT), NOW, groups)
    ).record
    assert isinstance(record, MessageCommitted)
    dispatch = message_dispatch(record, 3)
    assert dispatch.e2ee and dispatch.payload == CIPHERTEXT
    assert dispatch.preview_or_placeholder == record.preview_or_placeholder
    facts = facts_of(dispatch, mailbox_seq=11)
    assert facts.e2ee and _placeholder(facts.preview).e2ee
    assert MARKER not in facts.preview
    # an ordinary message's shard preview is still its payload copy (decision 16)
    plain = accepted(w.handle_send(send_request("ann", PLAIN, payload=b"hi"), NOW, groups)).record
    assert isinstance(plain, MessageCommitted)
    plain_facts = facts_of(message_dispatch(plain, 3), mailbox_seq=12)
    assert plain_facts.preview == b"hi" and not plain_facts.e2ee


def test_AT55_a_custom_type_in_an_e2ee_group_previews_its_placeholder_not_its_payload() -> None:
    w = writer(typed_config(contract("shop.card"), tenant=TENANT))
    request = send_request(
        "ann", SECRET, payload=CIPHERTEXT, message_type=MessageType.CUSTOM, custom_type="shop.card"
    )
    record = accepted(w.handle_send(request, NOW, _groups())).record
    assert isinstance(record, MessageCommitted)
    shown = _placeholder(message_dispatch(record, 0).preview_or_placeholder)
    assert shown.e2ee and shown.custom_type == "shop.card"
    assert record.payload == CIPHERTEXT


class _Rows:
    """The conversation's MessageStore rows as the amend path reads them."""

    def __init__(self) -> None:
        self.store = MemoryOrderedStore()

    def commit(self, record: MessageCommitted | MessageAmended) -> None:
        write_all(self.store, archive_batch([record], read=self.store.get))

    def row(self, seq: int) -> MessageRecord | None:
        raw = self.store.get(message_key(TENANT, SECRET, seq))
        return None if raw is None else decode_message_record(raw)

    def payload(self, seq: int) -> bytes | None:
        row = self.row(seq)
        assert row is not None
        return row.payload_or_ciphertext


def _amend(action: str, seq: int, payload: bytes = b"") -> AmendRequest:
    return AmendRequest(
        tenant_id=TENANT,
        user_id="ann",
        device_id="phone",
        session_epoch=7,
        connection_shard=3,
        request_id=9,
        action="edit" if action == "edit" else "recall",
        conversation_id=SECRET,
        target_conversation_seq=seq,
        new_payload=payload,
    )


def test_edit_and_recall_carry_ciphertext_and_preview_only_placeholders() -> None:
    w, groups, rows = writer(), _groups(), _Rows()
    sent = accepted(w.handle_send(send_request("ann", SECRET, payload=CIPHERTEXT), NOW, groups))
    w.apply(sent.record)
    assert isinstance(sent.record, MessageCommitted)
    rows.commit(sent.record)
    seq = sent.record.conversation_seq
    assert rows.payload(seq) == CIPHERTEXT  # stored byte for byte

    edited_body = b"\x01sealed-body-v2\xfe"
    edit = w.handle_amend(_amend("edit", seq, edited_body), NOW + 1, groups, rows.row)
    assert isinstance(edit, Amended)
    assert edit.record.new_payload == edited_body  # the edit's ciphertext, untouched
    assert _placeholder(edit.record.preview_or_placeholder) == PreviewPlaceholder(
        message_type=MessageType.RICH_TEXT, state="edited", e2ee=True
    )
    dispatch = amend_dispatch(edit.record, 0)
    assert dispatch.payload == edited_body
    facts = amended_facts(facts_of(message_dispatch(sent.record, 0), 1), dispatch, 2)
    assert MARKER not in facts.preview and _placeholder(facts.preview).e2ee
    w.apply(edit.record)
    rows.commit(edit.record)
    assert rows.payload(seq) == edited_body

    recall = w.handle_amend(_amend("recall", seq), NOW + 2, groups, rows.row)
    assert isinstance(recall, Amended)
    assert _placeholder(recall.record.preview_or_placeholder) == PreviewPlaceholder(
        message_type=MessageType.RICH_TEXT, state="recalled", e2ee=True
    )
    w.apply(recall.record)
    head = w.head(TENANT, SECRET)
    assert head is not None and _placeholder(head.preview_or_placeholder).e2ee


def _entry(conversation_id: str, seq: int) -> SyncEntry:
    return SyncEntry(
        mailbox_seq=seq,
        event_id=seq,
        event_type=EventType.MESSAGE,
        conversation_id=conversation_id,
        conversation_seq=seq,
        flags=EntryFlags.COUNTS_UNREAD,
        message_id=bytes(range(16)),
    )


async def test_AT119_push_for_an_e2ee_conversation_is_the_placeholder_only() -> None:
    cache = DigestCache()
    cache.apply(DeviceKey("t", "bob", "phone"), DeviceTokenDigest(provider="APNS"))
    badge = Badge(total_unread=2, total_mention=0, muted_unread=0, badge_projection_mailbox_seq=8)
    fold = UserFold("t", "bob", (_entry(SECRET, 7), _entry(PLAIN, 8)), badge, True, e2ee=(SECRET,))
    tasks = {t.conversation_id: t for t in plan_push_tasks([fold], digests=cache, online={})}
    assert tasks[SECRET].e2ee and tasks[SECRET].preview_or_placeholder == E2EE_PUSH_PLACEHOLDER
    assert not tasks[PLAIN].e2ee and tasks[PLAIN].preview_or_placeholder == ""
    assert tasks[SECRET].total_unread == tasks[PLAIN].total_unread == 2  # the badge is intact

    task = tasks[SECRET]
    send = Send(
        kind="alert",
        event_id=task.event_id,
        conversation_id=SECRET,
        collapse_id="c",
        merged_count=1,
        mailbox_seq=task.mailbox_seq,
        total_unread=2,
        total_mention=0,
        muted_unread=0,
        badge_projection_mailbox_seq=8,
        task=task,
    )
    note = notification_for(send, task)
    assert note.body == E2EE_PUSH_PLACEHOLDER and note.data_only and note.badge == 2
    apns = ApnsProvider(ApnsConfig(team_id="T", key_id="K", private_key_pem="", topic="app"))
    fcm = FcmProvider(
        FcmConfig(project_id="p", client_email="e", private_key_pem="", token_uri="u")
    )
    try:
        aps = apns.payload(note)["aps"]
        assert aps["mutable-content"] == 1 and aps["badge"] == 2
        assert aps["alert"]["body"] == E2EE_PUSH_PLACEHOLDER
        message = fcm.message("token", note)["message"]
        assert "notification" not in message  # data-only: the client builds it (22.4 item 4)
        assert message["data"]["e2ee"] == "1" and message["data"]["badge"] == "2"
        plain = notification_for(send, tasks[PLAIN])
        assert not plain.data_only and "notification" in fcm.message("token", plain)["message"]
    finally:
        await apns.aclose()
        await fcm.aclose()


def test_a_tenants_direct_conversations_are_e2ee_from_their_first_message_for_good() -> None:
    """22.1: "a tenant can make it the default" for 1:1; the first message fixes the flag in
    the head, so a later change of the setting only affects new conversations."""
    on = dataclasses.replace(config(), e2ee_direct_tenants=frozenset({TENANT}))
    off = config()
    w = writer(on)
    first = accepted(w.handle_send(direct_request("ann", "bob", payload=CIPHERTEXT), NOW, Groups()))
    assert isinstance(first.record, MessageCommitted)
    assert first.record.e2ee and first.record.payload == CIPHERTEXT
    assert _placeholder(first.record.preview_or_placeholder).e2ee
    w.apply(first.record)
    # the setting is switched off (a restart with the new config): the conversation stays E2EE
    later = ConversationWriterState.restore(
        w.snapshot(), off, region_id=REGION, writer_id=WRITER, fencing_epoch=2
    )
    head = later.head(TENANT, first.record.conversation_id)
    assert head is not None and head.e2ee
    second = accepted(later.handle_send(direct_request("ann", "bob", "cm-2"), NOW + 1, Groups()))
    assert isinstance(second.record, MessageCommitted) and second.record.e2ee
    # ...while a new one-to-one conversation follows the new setting: plaintext
    fresh = accepted(later.handle_send(direct_request("ann", "cat", "cm-3"), NOW + 2, Groups()))
    assert isinstance(fresh.record, MessageCommitted) and not fresh.record.e2ee
    # and the reverse: a conversation begun in plaintext is not turned E2EE by the setting
    w2 = writer(off)
    plain = accepted(w2.handle_send(direct_request("dan", "eve"), NOW, Groups()))
    w2.apply(plain.record)
    again = ConversationWriterState.restore(
        w2.snapshot(), on, region_id=REGION, writer_id=WRITER, fencing_epoch=2
    )
    follow = accepted(again.handle_send(direct_request("dan", "eve", "cm-4"), NOW + 1, Groups()))
    assert isinstance(follow.record, MessageCommitted) and not follow.record.e2ee
