"""E2EE groups through the ConversationWriter's request shell (spec 22.1, AT-43, AT-44).

CREATE_GROUP and the admin create carry ``e2ee`` into the create record; the configured
``e2ee_max_members`` (the RequestContext's, from B.6.1) bounds creates and adds with
``PERMISSION_DENIED`` / ``e2ee_member_limit``, appending nothing; a send then commits the
ciphertext untouched with the E2EE placeholder, and the admin plane cannot set the flag on
anything but a create.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec
import pytest

from qim.admin.groups import GroupAdmin
from qim.agents.writer.partition import Plan
from qim.agents.writer.requests import handle_request
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.frames.members import CreateGroup
from qim.schemas.records import MembershipCommitted, MessageCommitted
from qim.schemas.records.outbox import PreviewPlaceholder
from qim.schemas.records.requests import ConversationRequest
from tests.unit.agents.support import CTX, NOW, admin, create, group_on, new_writer, send

P = 2
CTX3 = dataclasses.replace(CTX, e2ee_max_members=3)


class _Writer:
    def __init__(self, path: Path) -> None:
        self.writer = new_writer(path, P)
        self.offset = 0

    def run(self, *requests: ConversationRequest) -> Plan:
        plan = Plan()
        for request in requests:
            handle_request(self.writer, CTX3, request, NOW, plan)
        appended = [(r, self.offset + i) for i, r in enumerate(plan.outbox)]
        self.offset += len(appended)
        self.writer.stored(appended)
        return plan


def _e2ee_create(user: str, group: str, members: tuple[str, ...]) -> ConversationRequest:
    request = create(user, group, members)
    message = CreateGroup(group_id=group, member_ids=members, e2ee=True)
    return msgspec.structs.replace(request, message=message)  # type: ignore[no-any-return]


def test_create_group_frame_flags_the_group_and_a_send_keeps_the_ciphertext(
    tmp_path: Path,
) -> None:
    w = _Writer(tmp_path / "store")
    group = group_on(P)
    plan = w.run(_e2ee_create("alice", group, ("bob",)))
    (record,) = plan.outbox
    assert isinstance(record, MembershipCommitted) and record.e2ee
    assert w.writer.membership.is_e2ee("acme", group)
    sent = send("alice", group, "m-1")
    body = sent.message.payload
    (message,) = w.run(sent).outbox
    assert isinstance(message, MessageCommitted)
    assert message.e2ee and message.payload == body
    preview = msgspec.msgpack.decode(message.preview_or_placeholder, type=PreviewPlaceholder)
    assert preview.e2ee


def test_the_limit_refuses_creates_and_adds_and_appends_nothing(tmp_path: Path) -> None:
    w = _Writer(tmp_path / "store")
    group, big = group_on(P), group_on(P, "g:big")
    plan = w.run(_e2ee_create("alice", big, ("bob", "carol", "dave")))
    (reply,) = plan.replies
    assert plan.outbox == [] and reply.error is not None
    assert (reply.error.code, reply.error.detail) == (
        ErrorCode.PERMISSION_DENIED,
        "e2ee_member_limit",
    )

    create_admin = msgspec.structs.replace(admin("create", group, ("bob",)), e2ee=True)
    plan = w.run(create_admin)
    assert plan.admin_replies[0].error is None and w.writer.membership.is_e2ee("acme", group)
    plan = w.run(admin("add", group, ("carol",)))
    assert plan.admin_replies[0].member_count == 3
    plan = w.run(admin("add", group, ("dave",)))
    error = plan.admin_replies[0].error
    assert plan.outbox == [] and error is not None
    assert (error.code, error.detail) == (ErrorCode.PERMISSION_DENIED, "e2ee_member_limit")
    assert w.writer.membership.member_count("acme", group) == 3
    assert w.writer.membership.is_e2ee("acme", group)


async def test_the_admin_plane_sets_the_flag_only_on_a_create() -> None:
    plane = GroupAdmin("127.0.0.1:1", node_id="ops-node")
    request = plane.request("acme", "g:team", "create", "alice", ["bob"], e2ee=True)
    assert request.e2ee and request.action == "create"
    assert not plane.request("acme", "g:team", "create", "alice", ["bob"]).e2ee
    with pytest.raises(ValueError, match="fixed when a group is created"):
        plane.request("acme", "g:team", "add", "ops", ["carol"], e2ee=True)
