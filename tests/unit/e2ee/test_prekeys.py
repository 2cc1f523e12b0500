"""DevicePreKeyBundle rules (qim.core.e2ee.prekeys): checks, selection, exactly-once, low water."""

from __future__ import annotations

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from qim.client.e2ee import DeviceKeys
from qim.core.e2ee.prekeys import (
    MAX_ONE_TIME_PREKEYS,
    UserBundles,
    check_publish,
    crossed_low_water,
    decode_user_bundles,
    encode_user_bundles,
    fetch,
    own_status,
    publish,
    signed_prekey_message,
)
from qim.schemas.frames import ErrorCode, OneTimePreKey, PrekeyFetch, SignedPreKey


def keys(one_time: int = 3) -> DeviceKeys:
    k = DeviceKeys()
    k.add_one_time(one_time)
    return k


def row_of(**devices: DeviceKeys) -> UserBundles:
    return UserBundles.of({d: publish(None, k.publish_frame()) for d, k in devices.items()})


def test_a_well_formed_bundle_passes_the_check() -> None:
    assert check_publish(keys().publish_frame()) is None


def test_a_signature_by_another_identity_is_refused_as_permission_denied() -> None:
    frame = keys().publish_frame()
    forger = Ed25519PrivateKey.generate()
    spk = frame.signed_prekey
    assert spk is not None
    forged = SignedPreKey(
        key_id=spk.key_id,
        pub=spk.pub,
        signature=forger.sign(signed_prekey_message(spk.key_id, spk.pub)),
    )
    refusal = check_publish(msgspec.structs.replace(frame, signed_prekey=forged))
    assert refusal is not None
    assert (refusal.code, refusal.detail) == (
        ErrorCode.PERMISSION_DENIED,
        "signed_prekey_signature_invalid",
    )


def test_a_signature_over_another_key_id_is_refused() -> None:
    frame = keys().publish_frame()
    spk = frame.signed_prekey
    assert spk is not None
    relabelled = msgspec.structs.replace(spk, key_id=spk.key_id + 1)
    refusal = check_publish(msgspec.structs.replace(frame, signed_prekey=relabelled))
    assert refusal is not None and refusal.detail == "signed_prekey_signature_invalid"


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        ({"identity_pub": b"\x01" * 32}, "identity_pub_invalid"),
        ({"signed_prekey": None}, "signed_prekey_invalid"),
        ({"one_time_prekeys": (OneTimePreKey(key_id=5, pub=b"short"),)}, "one_time_prekey_invalid"),
        (
            {"one_time_prekeys": (OneTimePreKey(key_id=0, pub=b"\x09" * 32),)},
            "one_time_prekey_ids_invalid",
        ),
    ],
)
def test_malformed_keys_are_refused_with_a_detail(change: dict[str, object], detail: str) -> None:
    refusal = check_publish(msgspec.structs.replace(keys().publish_frame(), **change))
    assert refusal is not None
    assert (refusal.code, refusal.detail) == (ErrorCode.PERMISSION_DENIED, detail)


def test_duplicate_one_time_ids_are_refused() -> None:
    frame = keys(2).publish_frame()
    dup = (frame.one_time_prekeys[0], frame.one_time_prekeys[0])
    refusal = check_publish(msgspec.structs.replace(frame, one_time_prekeys=dup))
    assert refusal is not None and refusal.detail == "one_time_prekey_ids_invalid"


def test_too_many_one_time_prekeys_is_payload_too_large() -> None:
    refusal = check_publish(keys(MAX_ONE_TIME_PREKEYS + 1).publish_frame())
    assert refusal is not None and refusal.code is ErrorCode.PAYLOAD_TOO_LARGE


def test_fetch_hands_out_the_lowest_one_time_key_once_and_removes_it() -> None:
    phone = keys(3)
    row = row_of(phone=phone)
    first = fetch(row, PrekeyFetch(target_user_id="bob"), fallback_allowed=True, low_watermark=1)
    second = fetch(
        first.after, PrekeyFetch(target_user_id="bob"), fallback_allowed=True, low_watermark=1
    )
    got = [o.bundles[0].one_time_prekey for o in (first, second)]
    assert [k.key_id for k in got if k is not None] == [1, 2]
    assert [k.key_id for k in second.after.as_dict()["phone"].one_time] == [3]
    assert second.after.as_dict()["phone"].handed_through == 2


def test_a_sequence_of_fetches_never_hands_out_a_key_twice() -> None:
    row = row_of(phone=keys(10), laptop=keys(4))
    handed: list[tuple[str, int]] = []
    fallbacks = 0
    for _ in range(12):
        out = fetch(row, PrekeyFetch(target_user_id="bob"), fallback_allowed=True, low_watermark=2)
        row = out.after
        for b in out.bundles:
            if b.one_time_prekey is None:
                assert b.one_time_exhausted
                fallbacks += 1
            else:
                handed.append((b.device_id, b.one_time_prekey.key_id))
    assert len(handed) == len(set(handed)) == 14
    assert fallbacks == 12 * 2 - 14


def test_all_devices_in_device_order_or_the_named_ones_in_the_clients_order() -> None:
    row = row_of(tablet=keys(), laptop=keys(), phone=keys())
    every = fetch(row, PrekeyFetch(target_user_id="bob"), fallback_allowed=True, low_watermark=0)
    assert [b.device_id for b in every.bundles] == ["laptop", "phone", "tablet"]
    named = fetch(
        row,
        PrekeyFetch(
            target_user_id="bob", target_device_ids=("tablet", "ghost", "laptop", "tablet")
        ),
        fallback_allowed=True,
        low_watermark=0,
    )
    assert [b.device_id for b in named.bundles] == ["tablet", "laptop"]


def test_a_bundle_handed_to_another_user_does_not_carry_the_remaining_count() -> None:
    out = fetch(
        row_of(phone=keys(5)), PrekeyFetch(target_user_id="bob"), fallback_allowed=True,
        low_watermark=0,
    )  # fmt: skip
    assert out.bundles[0].one_time_remaining == 0


def test_exhausted_falls_back_to_the_signed_prekey_when_allowed() -> None:
    phone = keys(0)
    out = fetch(row_of(phone=phone), PrekeyFetch(target_user_id="bob"), fallback_allowed=True,
                low_watermark=20)  # fmt: skip
    (bundle,) = out.bundles
    assert bundle.one_time_exhausted and bundle.one_time_prekey is None
    assert bundle.signed_prekey == phone.signed_prekey_frame()
    assert out.fallbacks == ("phone",)
    assert not out.changed


def test_exhausted_under_the_strict_policy_refuses_the_whole_fetch_and_consumes_nothing() -> None:
    row = row_of(phone=keys(0), laptop=keys(2))
    out = fetch(row, PrekeyFetch(target_user_id="bob"), fallback_allowed=False, low_watermark=1)
    assert out.refusal is not None and out.refusal.code is ErrorCode.PREKEY_EXHAUSTED
    assert out.bundles == () and out.after == row and not out.changed
    only_laptop = fetch(
        row,
        PrekeyFetch(target_user_id="bob", target_device_ids=("laptop",)),
        fallback_allowed=False,
        low_watermark=1,
    )
    assert only_laptop.refusal is None and only_laptop.bundles[0].one_time_prekey is not None


def test_republishing_a_handed_out_key_never_offers_it_again() -> None:
    phone = keys(3)
    row = row_of(phone=phone)
    out = fetch(row, PrekeyFetch(target_user_id="bob"), fallback_allowed=True, low_watermark=0)
    # the device does not know key 1 was taken yet and re-uploads everything plus two more
    phone.add_one_time(2)
    stored = publish(out.after.as_dict()["phone"], phone.publish_frame())
    assert [k.key_id for k in stored.one_time] == [2, 3, 4, 5]
    # a new identity is a new key space
    fresh = keys(2)
    assert [k.key_id for k in publish(stored, fresh.publish_frame()).one_time] == [1, 2]


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [(20, 19, True), (21, 20, False), (19, 18, False), (1, 0, True), (0, 0, False), (5, 5, False)],
)
def test_low_water_fires_when_crossing_the_watermark_or_reaching_zero(
    before: int, after: int, expected: bool
) -> None:
    assert crossed_low_water(before, after, 20) is expected


def test_fetch_reports_the_device_that_crossed_low_water() -> None:
    row = row_of(phone=keys(3), laptop=keys(10))
    out = fetch(row, PrekeyFetch(target_user_id="bob"), fallback_allowed=True, low_watermark=3)
    assert out.low_water == ("phone",)
    status = own_status("phone", out.after.as_dict()["phone"])
    assert status.one_time_remaining == 2 and not status.one_time_exhausted


def test_rows_round_trip_byte_for_byte() -> None:
    row = row_of(b=keys(2), a=keys(1))
    data = encode_user_bundles(row)
    assert decode_user_bundles(data) == row
    assert encode_user_bundles(decode_user_bundles(data)) == data
    assert decode_user_bundles(None) == UserBundles()
