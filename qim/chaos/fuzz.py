"""``qim chaos fuzz``: a gateway fed frames from an independent generator (issue 25).

The generator (:class:`FrameGen`) builds frames from the wire grammar of App. A.1 alone
(``struct`` and CRC32C by hand, bodies as random msgpack maps through ``msgspec``), never
through qim's codec or its test strategies, so a codec bug cannot hide itself: well-formed
headers of offered and unknown opcodes with maps of wrong keys and types, garbage bodies,
reserved flag bits, fragments, and, rarely, frames that must close the connection (bad CRC,
bad magic, a version the session did not negotiate, a length over ``max_frame_bytes``, a text
WebSocket message).

``connections`` authenticated fuzz connections send ``frames`` frames in all (reconnecting and
re-authenticating when the gateway closes one, as it must for the broken kinds) while reading
and counting whatever comes back; a well-behaved SDK client meanwhile PINGs every 0.5 s and
sends a message every 2 s, and must be answered every time. The verdict: the gateway process
is alive at the end, the observer missed nothing, and the gateway's RSS after the fuzz
connections closed is within ``rss_growth_bound`` of before.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import crc32c
import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from qim.bench.loadgen import new_client
from qim.bench.target import Target
from qim.chaos.faults import gateway_pid, rss_bytes
from qim.client import login_and_sync
from qim.devstack import procs
from qim.devstack.stack import Stack

__all__ = ["FrameGen", "FuzzParams", "run_fuzz"]

_COVERED = struct.Struct(">HBBHIHI")  # magic version flags opcode request_id stream body_len
MAGIC = 0x514D
AUTH, PING = 0x0001, 0x0003
AUTH_OK = "0x0002"
# The client-to-server frames of App. A.3 as a client writes them: opcode -> (field, type),
# typed by hand from the appendix (s str, b bytes, u8 / u32 / u64, i32, ? optional, l a list of
# str, t bool). AUTH is left out: a re-AUTH is a state change of its own, tested elsewhere.
TYPED: dict[int, tuple[tuple[str, str], ...]] = {
    0x0003: (("ping_id", "u64"), ("client_time", "u64"), ("last_applied_mailbox_seq", "u64"),
             ("network_type", "s"), ("probe", "t")),
    0x0101: (("after_seq", "u64"), ("up_to_seq", "u64"), ("max_items", "u32"),
             ("max_bytes", "u32"), ("acked_seq", "u64")),
    0x0103: (("sync_to_seq", "u64"),),
    0x0201: (("client_message_id", "s"), ("conversation_id", "s"), ("message_type", "u8"),
             ("custom_type", "s"), ("payload", "b"), ("mention_targets", "l"),
             ("reply_to_conversation_seq", "?u64"), ("peer_user_id", "s")),
    0x0301: (("conversation_id", "s"), ("direction", "s"), ("anchor_conversation_seq", "u64"),
             ("limit", "u32"), ("max_bytes", "u32")),
    0x0303: (("snapshot_revision", "u64"), ("page_cursor", "b"), ("limit", "u32")),
    0x0401: (("conversation_id", "s"), ("read_conversation_seq", "u64")),
    0x0402: (("conversation_id", "s"), ("target_conversation_seq", "u64")),
    0x0403: (("conversation_id", "s"), ("target_conversation_seq", "u64"), ("new_payload", "b")),
    0x0404: (("conversation_id", "s"),),
    0x0405: (("action", "s"), ("targets", "l"), ("conversation_id", "s")),
    0x0407: (("conversation_id", "s"), ("action", "s"), ("flag", "t"), ("pin_rank", "?i32"),
             ("notification_policy", "s")),
    0x0501: (("room_id", "s"), ("after_room_seq", "?u64")),
    0x0502: (("room_id", "s"),),
    0x0503: (("room_id", "s"), ("after_room_seq", "u64")),
    0x0601: (("conversation_id", "s"), ("target_user_id", "s"), ("signal_payload", "b"),
             ("call_id", "s"), ("signal_type", "s"), ("reason", "s")),
    0x0701: (("intent", "s"), ("object_id", "s"), ("byte_size", "u64")),
    0x0801: (("identity_pub", "b"),),
    0x0802: (("target_user_id", "s"), ("target_device_ids", "l")),
    0x0901: (("conversation_id", "s"), ("conversation_seq", "u64"), ("reaction_key", "s"),
             ("action", "s")),
    0x0903: (("conversation_id", "s"), ("conversation_seq", "u64"), ("reaction_key", "s"),
             ("offset", "u32"), ("limit", "u32")),
    0x0A01: (("conversation_id", "s"), ("filter", "s"), ("query", "s"), ("offset", "u32"),
             ("limit", "u32")),
    0x0A03: (("group_id", "s"), ("member_ids", "l")),
    0x0A04: (("group_id", "s"),),
}  # fmt: skip
UP_OPCODES = tuple(TYPED)
KEYS = tuple(sorted({name for fields in TYPED.values() for name, _ in fields} | {"x", ""}))
WORDS = (
    "d:", "g:", "r:", "fuzzer0", "observer", "add", "remove", "replace", "older", "newer",
    "offer", "answer", "ACCEPT", "CANCEL", "mute", "pin", "all", "mention_only", "\u00e9",
)  # fmt: skip
_MAX = {"u8": 2**8 - 1, "u32": 2**32 - 1, "u64": 2**64 - 1, "i32": 2**31 - 1}
# kind -> weight; the kinds of CLOSING must close the connection (A.1, 20.1): a body that does
# not decode is a protocol violation too, so the untyped kinds close it as well
KINDS: dict[str, float] = {
    "offered_typed": 62.0,
    "unknown_opcode": 12.0,
    "reserved_flags": 10.0,
    "fragment": 8.0,
    "offered_random_map": 0.3,
    "garbage_body": 0.3,
    "empty_body": 0.3,
    "bad_crc": 0.1,
    "bad_magic": 0.1,
    "bad_version": 0.1,
    "over_max_len": 0.05,
    "ws_text": 0.05,
}
CLOSING = frozenset(
    {"bad_crc", "bad_magic", "bad_version", "over_max_len", "ws_text", "offered_random_map",
     "garbage_body", "empty_body"}
)  # fmt: skip


def frame(
    opcode: int,
    body: bytes,
    *,
    request_id: int = 0,
    version: int = 1,
    flags: int = 0,
    stream_id: int = 0,
    body_len: int | None = None,
    magic: int = MAGIC,
) -> bytes:
    """One frame as A.1 writes it; ``body_len`` / ``magic`` may lie on purpose."""
    covered = _COVERED.pack(
        magic, version, flags, opcode, request_id, stream_id,
        len(body) if body_len is None else body_len,
    )  # fmt: skip
    return covered + struct.pack(">I", crc32c.crc32c(covered)) + body


class FrameGen:
    """Seeded frames of the kinds of :data:`KINDS` (module docstring)."""

    def __init__(self, seed: int, max_frame_bytes: int = 4 * 1024 * 1024) -> None:
        self.rng = random.Random(seed)
        self.max_frame_bytes = max_frame_bytes
        self._kinds = list(KINDS)
        self._weights = [KINDS[k] for k in self._kinds]

    def _value(self, depth: int = 0) -> Any:
        r = self.rng.random()
        if r < 0.2:
            return self.rng.randint(-(2**63), 2**64 - 1)
        if r < 0.35:
            return self.rng.randbytes(self.rng.randint(0, 64))
        if r < 0.5:
            return "".join(chr(self.rng.randint(0, 0x2FFF)) for _ in range(self.rng.randint(0, 24)))
        if r < 0.6:
            return self.rng.choice([None, True, False, 0.5, -1, 2**32])
        if r < 0.8 and depth < 2:
            return [self._value(depth + 1) for _ in range(self.rng.randint(0, 4))]
        if depth < 2:
            return {self.rng.choice(KEYS): self._value(depth + 1) for _ in range(3)}
        return self.rng.randint(0, 255)

    def _typed(self, kind: str) -> Any:
        rng = self.rng
        if kind.startswith("?"):
            return None if rng.random() < 0.3 else self._typed(kind[1:])
        if kind in _MAX:
            top = _MAX[kind]
            low = -(2**31) if kind == "i32" else 0
            return rng.choice([0, 1, top, rng.randint(low, top), rng.randint(0, min(top, 1000))])
        if kind == "t":
            return rng.random() < 0.5
        if kind == "b":
            return rng.randbytes(rng.choice([0, 1, 16, rng.randint(0, 512)]))
        if kind == "l":
            return [self._typed("s") for _ in range(rng.randint(0, 5))]
        word = rng.choice(WORDS)
        tail = "".join(rng.choice("abcdef0123456789:-_") for _ in range(rng.randint(0, 24)))
        return rng.choice([word, word + tail, tail, "", "x" * rng.randint(100, 1100)])

    def typed_body(self, opcode: int) -> bytes:
        """A map of the frame's own fields with values of the right types (random picks of
        them, some left out, sometimes an extra unknown key)."""
        fields = {n: self._typed(t) for n, t in TYPED[opcode] if self.rng.random() < 0.85}
        if self.rng.random() < 0.1:
            fields["x_unknown"] = self._typed("s")
        return msgspec.msgpack.encode(fields)

    def body(self) -> bytes:
        fields = {self.rng.choice(KEYS): self._value() for _ in range(self.rng.randint(0, 6))}
        return msgspec.msgpack.encode(fields)

    def next(self) -> tuple[str, bytes | str | list[bytes]]:
        """(kind, what to send: bytes as a binary message, str as a text message, a list as
        consecutive binary messages)."""
        kind = self.rng.choices(self._kinds, self._weights)[0]
        rid = self.rng.randint(0, 2**32 - 1)
        up = self.rng.choice(UP_OPCODES)
        match kind:
            case "offered_typed":
                return kind, frame(up, self.typed_body(up), request_id=rid)
            case "offered_random_map":
                return kind, frame(up, self.body(), request_id=rid)
            case "unknown_opcode":
                opcode = self.rng.choice([self.rng.randint(0x0B00, 0xFFFF), 0x0000, 0x00FF])
                return kind, frame(opcode, self.typed_body(up), request_id=rid)
            case "garbage_body":
                return kind, frame(up, self.rng.randbytes(self.rng.randint(1, 300)), request_id=rid)
            case "reserved_flags":
                flags = self.rng.randint(1, 15) << 4
                return kind, frame(up, self.typed_body(up), request_id=rid, flags=flags)
            case "fragment":  # one body in 2-4 pieces on one stream, the last unflagged
                body = self.typed_body(up)
                body = body if len(body) > 1 else msgspec.msgpack.encode({"x": "padding"})
                cuts = sorted(self.rng.sample(range(1, len(body)), min(3, len(body) - 1)))
                cuts = cuts[: self.rng.randint(1, len(cuts))] if cuts else []
                pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
                return kind, [
                    frame(up, p, request_id=rid, flags=0x02 if i < len(pieces) - 1 else 0)
                    for i, p in enumerate(pieces)
                ]
            case "empty_body":
                return kind, frame(up, b"", request_id=rid)
            case "bad_crc":
                raw = bytearray(frame(up, self.body(), request_id=rid))
                raw[16] ^= 0xFF
                return kind, bytes(raw)
            case "bad_magic":
                return kind, frame(up, self.body(), magic=self.rng.randint(0, 0x514C))
            case "bad_version":
                return kind, frame(PING, b"\x80", version=self.rng.choice([0, 2, 7, 255]))
            case "over_max_len":
                return kind, frame(up, b"", body_len=self.max_frame_bytes + 1)
            case _:
                return kind, "\x00not a qim frame"


@dataclass(frozen=True)
class FuzzParams:
    frames: int = 1_000_000
    connections: int = 4
    burst: int = 200
    seed: int = 1
    observer_ping_s: float = 0.5
    observer_send_s: float = 2.0
    observer_timeout_s: float = 10.0
    rss_growth_bound: int = 96 * 1024 * 1024
    tenant: str = "fuzz"


def auth_frame(token: str, device: str) -> bytes:
    """AUTH by hand (the A.3 #1 map), so the fuzz connections need nothing of the codec."""
    body = msgspec.msgpack.encode({"access_token": token, "device_id": device})
    return frame(AUTH, body, request_id=1)


@dataclass
class _Tally:
    sent: Counter[str]
    replies: Counter[str]
    closes: Counter[str]
    reconnects: int = 0
    after_closing: int = 0
    """frames written behind a CLOSING kind on the same connection: the gateway closes at that
    frame (or at a later one), so up to this many are never read and get no answer"""


async def _fuzz_connection(
    target: Target,
    params: FuzzParams,
    index: int,
    quota: int,
    tally: _Tally,
) -> None:
    gen = FrameGen(params.seed * 1000 + index)
    device = f"fuzz{index}"
    left = quota
    while left > 0:
        token = target.token(params.tenant, f"fuzzer{index}", device)
        try:
            ws = await connect(target.ws_url, max_size=None, open_timeout=30)
        except (OSError, TimeoutError, ConnectionClosed) as exc:
            tally.closes[f"connect:{type(exc).__name__}"] += 1
            await asyncio.sleep(0.5)
            continue
        reader: asyncio.Task[None] | None = None
        try:
            await ws.send(auth_frame(token, device))
            first = await asyncio.wait_for(ws.recv(), 30.0)
            opcode = _opcode(first)
            tally.replies[opcode] += 1
            if opcode != AUTH_OK:  # refused (a rate limit, say): try again shortly
                await asyncio.sleep(0.5)
                continue
            reader = asyncio.create_task(_drain(ws, tally))
            closing_sent = False
            while left > 0:  # until the gateway closes it (a CLOSING kind) or all are sent
                for _ in range(min(params.burst, left)):
                    kind, data = gen.next()
                    tally.sent[kind] += 1
                    left -= 1
                    if closing_sent:
                        tally.after_closing += 1
                    closing_sent = closing_sent or kind in CLOSING
                    for message in data if isinstance(data, list) else [data]:
                        await ws.send(message)
                await asyncio.sleep(0)  # let the reader run between bursts
        except (ConnectionClosed, TimeoutError):
            pass
        finally:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ws.wait_closed(), 2.0)
            await ws.close()
            if reader is not None:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
            code = ws.close_code
            tally.closes[str(code)] += 1
            tally.reconnects += 1


def _opcode(message: bytes | str) -> str:
    if isinstance(message, bytes) and len(message) >= 8:
        return f"0x{struct.unpack_from('>H', message, 4)[0]:04X}"
    return "other"


async def _drain(ws: ClientConnection, tally: _Tally) -> None:
    """Read every reply and count them by opcode (read by hand, as a client would)."""
    with contextlib.suppress(ConnectionClosed):
        async for message in ws:
            tally.replies[_opcode(message)] += 1


async def _observer(
    target: Target, params: FuzzParams, stop: asyncio.Event, result: dict[str, Any]
) -> None:
    """A well-behaved SDK device: PING every ``observer_ping_s``, a message every
    ``observer_send_s``; every one must be answered within ``observer_timeout_s``."""
    token = target.token(params.tenant, "observer", "obs")
    sync = await login_and_sync(new_client(), target.ws_url, token, "obs")
    client = sync.client
    worst, failures, pings, sends = 0.0, Counter[str](), 0, 0
    last_send = time.monotonic()
    try:
        while not stop.is_set():
            began = time.monotonic()
            try:
                await client.ping(timeout=params.observer_timeout_s)
                pings += 1
                if began - last_send >= params.observer_send_s:
                    last_send = began
                    await client.send_direct(
                        "observer-peer", b"still served", timeout=params.observer_timeout_s
                    )
                    sends += 1
            except Exception as exc:  # any miss is the verdict's failure
                failures[type(exc).__name__] += 1
            worst = max(worst, time.monotonic() - began)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), params.observer_ping_s)
    finally:
        with contextlib.suppress(Exception):
            await client.close()
        result.update(pings=pings, sends=sends, failures=dict(failures), worst_s=round(worst, 3))


async def run_fuzz(
    stack: Stack, params: FuzzParams, *, progress: Callable[[str], None] = print
) -> dict[str, Any]:
    """The run of the module docstring against ``stack``'s first gateway."""
    target = Target.from_stack(stack.cfg)
    pid = gateway_pid(stack)
    rss_before = rss_bytes(pid)
    tally = _Tally(Counter(), Counter(), Counter())
    stop = asyncio.Event()
    observed: dict[str, Any] = {}
    observer = asyncio.create_task(_observer(target, params, stop, observed))
    started = time.monotonic()
    share = params.frames // params.connections
    quotas = [share + (1 if i < params.frames % params.connections else 0)
              for i in range(params.connections)]  # fmt: skip
    peak = rss_before or 0

    async def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, rss_bytes(pid) or 0)
            total = sum(tally.sent.values())
            replies = sum(tally.replies.values())
            progress(
                f"  {total} frames sent, {replies} replies, {tally.reconnects} reconnects, "
                f"gateway RSS {peak // 2**20} MiB peak"
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 10.0)

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.gather(
            *(_fuzz_connection(target, params, i, q, tally) for i, q in enumerate(quotas))
        )
    finally:
        seconds = time.monotonic() - started
        stop.set()
        await asyncio.gather(observer, watcher, return_exceptions=True)
    await asyncio.sleep(5.0)  # the closed connections' buffers go back
    rss_after = rss_bytes(pid)
    alive = pid is not None and procs.pid_alive(pid)
    grew = None if rss_after is None or rss_before is None else rss_after - rss_before
    ok = (
        alive
        and not observed.get("failures")
        and observed.get("pings", 0) > 0
        and grew is not None
        and grew <= params.rss_growth_bound
    )
    frames = sum(tally.sent.values())
    return {
        "scenario": "chaos-fuzz",
        "ok": ok,
        "headline": (
            f"{frames} fuzz frames in {seconds:.0f} s over {params.connections} connections "
            f"({tally.reconnects} reconnects): gateway alive {alive}, RSS growth "
            f"{None if grew is None else grew // 2**20} MiB, observer {observed.get('pings')} "
            f"pings and {observed.get('sends')} sends answered, failures "
            f"{observed.get('failures') or 'none'}"
        ),
        "params": asdict(params),
        "frames_by_kind": dict(sorted(tally.sent.items())),
        "replies_by_opcode": dict(sorted(tally.replies.items())),
        "closes_by_code": dict(sorted(tally.closes.items())),
        "frames_after_a_closing_kind": tally.after_closing,
        "observer": observed,
        "gateway_alive": alive,
        "gateway_rss_bytes": {"before": rss_before, "peak": peak, "after": rss_after},
        "seconds": round(seconds, 1),
    }
