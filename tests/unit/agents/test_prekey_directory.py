"""The key worker's one call per request (qim.agents.prekeys.PreKeyDirectory.handle)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from prometheus_client import CollectorRegistry

from qim.agents.prekeys import PreKeyDirectory, PreKeyOptions
from qim.client.e2ee import DeviceKeys
from qim.core.e2ee.prekeys import decode_user_bundles, signed_prekey_message
from qim.schemas.frames import ErrorCode, PrekeyFetch, SignedPreKey
from qim.schemas.records.prekeys import (
    PrekeyFetchRequest,
    PrekeyPublishRequest,
    PrekeyReply,
    decode_prekey_reply,
    decode_prekey_request,
    encode_prekey_record,
)
from qim.schemas.routing import connection_shard_id, user_bucket

SESSION: dict[str, Any] = {"tenant_id": "t", "session_epoch": 7, "connection_shard": 3}


def directory(**options: object) -> PreKeyDirectory:
    return PreKeyDirectory(PreKeyOptions(**options), CollectorRegistry())  # type: ignore[arg-type]


def publish_request(keys: DeviceKeys, device: str = "phone", rid: int = 11) -> PrekeyPublishRequest:
    return PrekeyPublishRequest(
        user_id="bob", device_id=device, request_id=rid, message=keys.publish_frame(), **SESSION
    )


def fetch_request(rid: int = 21, **kw: object) -> PrekeyFetchRequest:
    return PrekeyFetchRequest(
        user_id="alice",
        device_id="pc",
        request_id=rid,
        message=PrekeyFetch(target_user_id="bob", **kw),  # type: ignore[arg-type]
        **SESSION,
    )


def only(replies: tuple[PrekeyReply, ...]) -> PrekeyReply:
    (reply,) = replies
    return reply


def test_requests_and_replies_round_trip_through_their_wire_form() -> None:
    req = publish_request(DeviceKeys())
    assert decode_prekey_request(encode_prekey_record(req)) == req
    with pytest.raises(ValueError, match="exactly one"):
        PrekeyReply(tenant_id="t", user_id="u", device_id="d", connection_shard=1)


def test_a_publish_is_stored_and_answered_with_the_devices_own_status() -> None:
    keys = DeviceKeys()
    keys.add_one_time(4)
    handled = directory().handle(publish_request(keys), None)
    assert handled.store is not None
    row = decode_user_bundles(handled.store).as_dict()
    assert [k.key_id for k in row["phone"].one_time] == [1, 2, 3, 4]
    reply = only(handled.replies)
    assert (reply.user_id, reply.device_id, reply.request_id, reply.session_epoch) == (
        "bob", "phone", 11, 7,
    )  # fmt: skip
    assert reply.bundles is not None and reply.bundles.bundles[0].one_time_remaining == 4


def test_a_forged_publish_stores_nothing_and_answers_the_error_with_its_request_id() -> None:
    keys = DeviceKeys()
    frame = keys.publish_frame()
    spk = frame.signed_prekey
    assert spk is not None
    bad = Ed25519PrivateKey.generate().sign(signed_prekey_message(spk.key_id, spk.pub))
    forged = msgspec.structs.replace(
        frame, signed_prekey=SignedPreKey(key_id=spk.key_id, pub=spk.pub, signature=bad)
    )
    req = msgspec.structs.replace(publish_request(keys), message=forged)
    handled = directory().handle(req, None)
    assert handled.store is None
    error = only(handled.replies).error
    assert error is not None
    assert (error.code, error.request_id, error.detail) == (
        int(ErrorCode.PERMISSION_DENIED), 11, "signed_prekey_signature_invalid",
    )  # fmt: skip


def test_a_fetch_under_the_strict_policy_is_prekey_exhausted_and_stores_nothing() -> None:
    d = directory(no_fallback_tenants=frozenset({"t"}))
    row = d.handle(publish_request(DeviceKeys()), None).store
    handled = d.handle(fetch_request(), row)
    assert handled.store is None
    error = only(handled.replies).error
    assert error is not None and (error.code, error.request_id) == (
        int(ErrorCode.PREKEY_EXHAUSTED), 21,
    )  # fmt: skip


def test_a_fetch_that_crosses_low_water_also_notifies_the_owner_device() -> None:
    d = directory(low_watermark=2, connection_shard_count=16)
    keys = DeviceKeys()
    keys.add_one_time(2)
    row = d.handle(publish_request(keys), None).store
    handled = d.handle(fetch_request(), row)
    answer, notice = handled.replies
    assert answer.user_id == "alice" and answer.request_id == 21
    assert (notice.user_id, notice.device_id, notice.request_id, notice.session_epoch) == (
        "bob", "phone", 0, 0,
    )  # fmt: skip
    assert notice.connection_shard == connection_shard_id(user_bucket("t", "bob", 65536), 16)
    assert notice.bundles is not None and notice.bundles.bundles[0].one_time_remaining == 1
    assert handled.store is not None


def test_a_fallback_fetch_changes_nothing_stored() -> None:
    d = directory()
    row = d.handle(publish_request(DeviceKeys()), None).store
    handled = d.handle(fetch_request(), row)
    assert handled.store is None
    reply = only(handled.replies)
    assert reply.bundles is not None and reply.bundles.bundles[0].one_time_exhausted
    assert decode_prekey_reply(encode_prekey_record(reply)) == reply
