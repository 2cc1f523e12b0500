"""The SDK's reference X3DH + Double Ratchet + sender keys (qim.client.e2ee_session)."""

from __future__ import annotations

import msgspec
import pytest
from cryptography.exceptions import InvalidSignature, InvalidTag

from qim.client.e2ee import DeviceKeys
from qim.client.e2ee_session import accept, initiate, open_sealed, seal
from qim.core.e2ee.prekeys import UserBundles, fetch, publish
from qim.schemas.frames import PrekeyBundle, PrekeyFetch


def bundle_of(keys: DeviceKeys, device: str = "phone") -> PrekeyBundle:
    """What PREKEY_FETCH hands out for ``keys``, through the server's own rules."""
    row = UserBundles.of({device: publish(None, keys.publish_frame())})
    out = fetch(row, PrekeyFetch(target_user_id="bob"), fallback_allowed=True, low_watermark=0)
    return out.bundles[0]


def test_a_session_opened_from_a_bundle_decrypts_both_ways_and_out_of_order() -> None:
    alice, bob = DeviceKeys(), DeviceKeys()
    bob.add_one_time(2)
    a, initial = initiate(alice, bundle_of(bob), b"hello bob")
    b, first = accept(bob, initial)
    assert first == b"hello bob"
    assert 1 not in bob.one_time  # the one-time prekey's private half is gone after use
    m1, m2, m3 = (a.encrypt(f"a{i}".encode()) for i in (1, 2, 3))
    assert b.decrypt(m3) == b"a3" and b.decrypt(m1) == b"a1" and b.decrypt(m2) == b"a2"
    reply = b.encrypt(b"hi alice")
    assert a.decrypt(reply) == b"hi alice"
    assert b.decrypt(a.encrypt(b"again")) == b"again"  # after a DH ratchet step


def test_the_signed_prekey_fallback_still_opens_a_session() -> None:
    alice, bob = DeviceKeys(), DeviceKeys()  # bob has no one-time prekeys left
    bundle = bundle_of(bob)
    assert bundle.one_time_exhausted and bundle.one_time_prekey is None
    _, initial = initiate(alice, bundle, b"fallback")
    assert accept(bob, initial)[1] == b"fallback"


def test_a_bundle_with_a_forged_signed_prekey_is_refused_by_the_client_too() -> None:
    bundle = bundle_of(DeviceKeys())
    other = DeviceKeys()
    forged = msgspec.structs.replace(bundle, identity_pub=other.identity_pub)
    with pytest.raises(InvalidSignature):
        initiate(DeviceKeys(), forged, b"x")


def test_a_sealed_body_opens_with_the_sender_key_and_only_in_its_conversation() -> None:
    key = bytes(range(32))
    sealed = seal(key, "d:abc", b"secret")
    assert b"secret" not in sealed
    assert open_sealed(key, "d:abc", sealed) == b"secret"
    with pytest.raises(InvalidTag):
        open_sealed(key, "d:other", sealed)
