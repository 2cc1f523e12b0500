"""Transient delivery rules (spec 13.2, 13.3, 13.5): typing, presence subscriptions, ephemeral
custom messages, RTC ring timers.

Pure: plain data in, decisions out, time always an argument. Nothing here touches a mailbox,
the history, the session list or unread (INV-33): the shells that call these cores only ever
write to live connections.
"""

from qim.core.transient.ephemeral import ephemeral_entry, ephemeral_relays
from qim.core.transient.presence_sub import (
    ACTIONS,
    OFFLINE,
    ONLINE,
    PresenceState,
    PresenceSubscription,
    SubscriptionChange,
)
from qim.core.transient.rtc import Ringing, RingTimers, answer_reason
from qim.core.transient.typing_relay import (
    TypingForward,
    TypingGate,
    TypingRules,
    TypingVerdict,
    by_connection_shard,
    decide_typing,
)

__all__ = [
    "ACTIONS",
    "OFFLINE",
    "ONLINE",
    "PresenceState",
    "PresenceSubscription",
    "RingTimers",
    "Ringing",
    "SubscriptionChange",
    "TypingForward",
    "TypingGate",
    "TypingRules",
    "TypingVerdict",
    "answer_reason",
    "by_connection_shard",
    "decide_typing",
    "ephemeral_entry",
    "ephemeral_relays",
]
