"""VoIP push for a call to a callee with no online device (spec 13.5.2, AT-64): the pure rules
(which devices, dedup per call, ``rtc_voip_push_daily_quota`` per device per UTC day), the
task the callee's node builds, the registration of a PushKit token, and the wire shape the
APNs and FCM clients send (voip push type, priority 10, ``.voip`` topic, no badge)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from qim.agents.notify.delivery import voip_notification
from qim.agents.notify.providers import ApnsConfig, ApnsProvider, FcmConfig, FcmProvider
from qim.core.notify.registration import Refusal, validate_registration
from qim.core.notify.rules import DeviceState, PushPolicy, admit
from qim.core.notify.tokens import DAY_MS
from qim.core.notify.voip import (
    admit_voip,
    voip_devices,
    voip_event_id,
    voip_fields,
    voip_task,
)
from qim.schemas.frames.rtc import RtcSignalDown
from qim.schemas.records.notify import (
    VOIP_DEVICE,
    DeviceToken,
    decode_push_task,
    encode,
)

POLICY = PushPolicy(rtc_voip_push_daily_quota=3)
DAY0 = 20_000 * DAY_MS  # midnight UTC of some day


def _call(state: DeviceState, call: str, now: int, fp: str = "fp1") -> tuple[DeviceState, str]:
    return admit_voip(state, token_fingerprint=fp, call_id=call, now_ms=now, policy=POLICY)


def test_a_call_is_pushed_once_per_device_a_repeated_invite_is_a_duplicate() -> None:
    state, verdict = _call(DeviceState(), "c1", DAY0 + 1000)
    assert verdict == "push" and state.voip_count == 1
    state, verdict = _call(state, "c1", DAY0 + 2000)  # re-invite, or a replay after a crash
    assert verdict == "duplicate" and state.voip_count == 1
    state, verdict = _call(state, "c2", DAY0 + 3000)
    assert verdict == "push" and state.voip_count == 2


def test_over_the_daily_quota_no_push_until_the_next_utc_day() -> None:
    state = DeviceState()
    verdicts = []
    for n in range(5):
        state, verdict = _call(state, f"c{n}", DAY0 + 60_000 * (n + 20))
        verdicts.append(verdict)
    assert verdicts == ["push", "push", "push", "over_quota", "over_quota"]
    assert state.voip_count == 3  # refused pushes are not counted as sent
    state, verdict = _call(state, "c9", DAY0 + DAY_MS - 1)
    assert verdict == "over_quota"
    state, verdict = _call(state, "c10", DAY0 + DAY_MS)
    assert verdict == "push" and (state.voip_day, state.voip_count) == (DAY0 // DAY_MS + 1, 1)


def test_the_default_quota_is_200_per_device() -> None:
    state, policy = DeviceState(), PushPolicy()
    verdicts = []
    for n in range(201):
        state, verdict = admit_voip(
            state, token_fingerprint="fp", call_id=f"c{n}", now_ms=DAY0 + n, policy=policy
        )
        verdicts.append(verdict)
    assert verdicts.count("push") == 200 and verdicts[-1] == "over_quota"


def test_re_registering_the_device_does_not_reset_its_quota() -> None:
    state = DeviceState()
    for n in range(3):
        state, _ = _call(state, f"c{n}", DAY0 + n)
    state, verdict = _call(state, "c3", DAY0 + 10, fp="fp2")  # a new token, same device
    assert verdict == "over_quota"


def test_alert_pushes_keep_the_voip_count_and_do_not_use_it() -> None:
    state, _ = _call(DeviceState(), "c1", DAY0)
    state, sends = admit(
        state,
        token_fingerprint="fp1",
        kind="alert",
        event_id="e1",
        conversation_id="d:a:b",
        mailbox_seq=1,
        total_unread=1,
        total_mention=0,
        muted_unread=0,
        badge_projection_mailbox_seq=1,
        now_ms=DAY0 + 5,
        policy=POLICY,
    )
    assert [s.kind for s in sends] == ["alert"]
    assert state.voip_count == 1


def _token(device: str, provider: str, caps: tuple[str, ...], voip: bytes = b"") -> DeviceToken:
    return DeviceToken(
        tenant_id="t",
        user_id="bob",
        device_id=device,
        provider=provider,
        sealed_token=b"sealed",
        token_fingerprint=f"fp-{device}",
        capabilities=caps,
        sealed_voip_token=voip,
        voip_token_fingerprint="vfp" if voip else "",
    )


def test_only_devices_that_registered_voip_with_a_usable_token_are_woken() -> None:
    tokens = [
        _token("tablet", "APNS", ("voip",), b"pushkit"),
        _token("ipad-no-pushkit", "APNS", ("silent_push",)),
        _token("android", "FCM", ("voip",)),
        _token("android-old", "FCM", ()),
        _token("apns-claims-voip-without-token", "APNS", ("voip",)),
    ]
    assert [t.device_id for t in voip_devices(tokens)] == ["android", "tablet"]


def test_the_task_names_the_call_and_the_payload_carries_no_badge() -> None:
    invite = RtcSignalDown(
        conversation_id="d:alice:bob",
        from_user_id="alice",
        from_device_id="phone",
        call_id="call-7",
        signal_type="invite",
        signal_payload=b"sdp" * 100,
    )
    task = voip_task("t", "bob", invite, caller_connection_shard=5, callee_connection_shard=9)
    assert decode_push_task(encode(task)) == task
    assert (task.kind, task.device_id, task.event_id) == ("voip", VOIP_DEVICE, "rtc:call-7")
    assert (task.caller_connection_shard, task.callee_connection_shard) == (5, 9)
    assert task.total_unread == task.badge_projection_mailbox_seq == 0
    assert voip_event_id("call-7") == task.event_id
    fields = voip_fields(task)
    assert fields == {
        "type": "rtc_invite",
        "call_id": "call-7",
        "caller_user_id": "alice",
        "caller_device_id": "phone",
        "conversation_id": "d:alice:bob",
        "event_id": "rtc:call-7",
    }
    assert not any("badge" in k or "unread" in k for k in fields)


def _reg(**kw: Any) -> Any:
    body: dict[str, Any] = {"device_id": "phone", "provider": "APNS", "token": "ab" * 32}
    body.update(kw)
    return validate_registration(
        body, tenant_id="t", user_id="bob", token_device_id="phone", connection_device_id="phone"
    )


def test_an_apns_device_registers_its_pushkit_token_with_the_voip_capability() -> None:
    reg = _reg(capabilities=["voip"], voip_token="CD" * 32)
    assert (reg.capabilities, reg.voip_token, reg.token) == (("voip",), "cd" * 32, "ab" * 32)
    assert _reg(provider="FCM", token="f" * 40, capabilities=["voip"]).voip_token == ""


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"capabilities": ["voip"]}, "voip_token_required"),
        ({"capabilities": ["voip"], "voip_token": "zz" * 32}, "malformed_voip_token"),
        ({"voip_token": 7}, "malformed_voip_token"),
        ({"provider": "FCM", "token": "f" * 40, "voip_token": "ab" * 32}, "malformed_voip_token"),
    ],
)
def test_bad_voip_registrations_are_refused(body: dict[str, Any], detail: str) -> None:
    with pytest.raises(Refusal) as err:
        _reg(**body)
    assert (err.value.code, err.value.detail, err.value.status) == (
        "PERMISSION_DENIED",
        detail,
        400,
    )


class _Capture:
    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path == "/token":
            return httpx.Response(200, json={"access_token": "at", "expires_in": 3600})
        return httpx.Response(200, json={"name": "m1"}, headers={"apns-id": "x"})


def _note() -> Any:
    invite = RtcSignalDown(call_id="c1", from_user_id="alice", conversation_id="d:alice:bob")
    return voip_notification(
        voip_task("t", "bob", invite, caller_connection_shard=0, callee_connection_shard=0)
    )


async def test_apns_sends_a_voip_push_type_at_priority_10_on_the_voip_topic() -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = (
        ec.generate_private_key(ec.SECP256R1())
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode()
    )
    provider = ApnsProvider(ApnsConfig("TEAM", "KEY", pem, "im.qim.app", "https://apns.test"))
    capture = _Capture()
    await provider.aclose()
    provider._client = httpx.AsyncClient(transport=httpx.MockTransport(capture))
    result = await provider.send("cd" * 32, "production", _note())
    await provider.aclose()
    assert result.status == 200
    (request,) = capture.requests
    assert request.url.path == f"/3/device/{'cd' * 32}"
    assert request.headers["apns-push-type"] == "voip"
    assert request.headers["apns-priority"] == "10"
    assert request.headers["apns-topic"] == "im.qim.app.voip"
    assert "apns-collapse-id" not in request.headers
    payload = json.loads(request.content)
    assert payload["aps"] == {}  # no badge, no alert, no sound
    assert (payload["call_id"], payload["caller_user_id"]) == ("c1", "alice")


async def test_fcm_sends_a_high_priority_data_only_message_without_a_badge() -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    pem = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode()
    )
    config = FcmConfig("proj", "sa@proj", pem, "https://fcm.test/token", "https://fcm.test")
    provider = FcmProvider(config)
    capture = _Capture()
    await provider.aclose()
    provider._client = httpx.AsyncClient(transport=httpx.MockTransport(capture))
    result = await provider.send("f" * 40, "production", _note())
    await provider.aclose()
    assert result.status == 200
    message = json.loads(capture.requests[-1].content)["message"]
    assert message["android"] == {"priority": "high"}
    assert "notification" not in message
    assert "badge" not in message["data"] and message["data"]["call_id"] == "c1"
    assert message["data"]["type"] == "rtc_invite"
