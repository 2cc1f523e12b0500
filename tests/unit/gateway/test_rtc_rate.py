"""RTC_SIGNAL takes the sender's ``per_user_msg_rate`` token like a send (spec 13.5.2)."""

from __future__ import annotations

from qim.gateway.routing.send_rate import UserMsgRate
from qim.params import Settings
from qim.schemas.frames import Error, ErrorCode, encode_frame
from qim.schemas.frames.rtc import RtcSignal
from tests.gateway_support import wait_until
from tests.unit.gateway.test_router import harness

ONE_PER_MINUTE = Settings.load(
    overrides={
        "per_user_msg_rate": {"count": 1, "period_ms": 60_000},
        "per_user_msg_rate_burst": 1,
    },
    env={},
)


async def test_a_second_signal_past_the_users_rate_is_refused_with_its_request_id() -> None:
    async with harness() as h:
        assert h.node.router is not None
        h.node.router.send_rate = UserMsgRate(ONE_PER_MINUTE)
        conn, pipe = await h.online()
        signal = RtcSignal(
            conversation_id="g:team", target_user_id="bob", call_id="c1", signal_type="invite"
        )
        produced = len(h.producer.sent)
        conn.feed_message(encode_frame(signal, 7))
        await wait_until(lambda: len(h.producer.sent) > produced)  # the first is forwarded
        conn.feed_message(encode_frame(signal, 8))

        def refused() -> bool:
            return any(isinstance(b, Error) and b.request_id == 8 for b in pipe.bodies())

        await wait_until(refused)
        error = next(b for b in pipe.bodies() if isinstance(b, Error) and b.request_id == 8)
        assert error.code == int(ErrorCode.RATE_LIMITED) and error.retry_after_ms
        assert len(h.producer.sent) == produced + 1  # the refused one was not produced
