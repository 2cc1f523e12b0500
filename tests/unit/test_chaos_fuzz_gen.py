"""The fuzz generator of ``qim chaos fuzz`` is written from A.1 alone; here the codec's header
parser checks it: the well-formed kinds parse, each closing kind fails the way it must."""

from __future__ import annotations

import contextlib
from collections import Counter

import pytest

from qim.chaos.fuzz import CLOSING, KINDS, FrameGen, auth_frame
from qim.schemas.frames import Auth, Role, decode_message
from qim.schemas.frames.exceptions import BadHeaderCrc, BadMagic, FrameTooLarge, LimitExceeded
from qim.schemas.frames.header import decode_header


def sample(n: int, seed: int = 7) -> list[tuple[str, bytes | str | list[bytes]]]:
    gen = FrameGen(seed, max_frame_bytes=1024)
    return [gen.next() for _ in range(n)]


def test_the_same_seed_gives_the_same_frames() -> None:
    assert sample(500) == sample(500)
    assert sample(500) != sample(500, seed=8)


def test_every_kind_appears_and_the_closing_ones_are_rare() -> None:
    kinds = Counter(kind for kind, _ in sample(20_000))
    assert set(kinds) == set(KINDS)
    assert sum(kinds[k] for k in CLOSING) < 0.03 * sum(kinds.values())


def test_well_formed_kinds_parse_and_closing_kinds_fail_as_they_must() -> None:
    for kind, data in sample(5_000):
        if kind == "ws_text":
            assert isinstance(data, str)
            continue
        if kind == "fragment":
            assert isinstance(data, list) and len(data) >= 2
            headers = [decode_header(piece) for piece in data]
            assert [h.flags & 0x02 for h in headers] == [0x02] * (len(data) - 1) + [0]
            assert len({(h.opcode, h.request_id, h.stream_id) for h in headers}) == 1
            continue
        assert isinstance(data, bytes)
        if kind == "bad_crc":
            with pytest.raises(BadHeaderCrc):
                decode_header(data)
        elif kind == "bad_magic":
            with pytest.raises(BadMagic):
                decode_header(data)
        elif kind == "over_max_len":
            with pytest.raises(FrameTooLarge):
                decode_header(data, max_frame_bytes=1024)
        else:
            header = decode_header(data)
            assert header.body_len == len(data) - 20
            assert (header.version != 1) == (kind == "bad_version")
            if kind == "offered_typed":  # the hand-typed table agrees with the codec
                with contextlib.suppress(LimitExceeded):  # answered, not closed (20.1)
                    decode_message(data, Role.SERVER)


def test_the_hand_built_auth_is_the_codecs_auth() -> None:
    frame = decode_message(auth_frame("tok", "d1"), Role.SERVER)
    assert getattr(frame, "body", None) == Auth(access_token="tok", device_id="d1")
