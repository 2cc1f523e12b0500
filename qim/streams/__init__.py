"""Topic declarations: the pipeline's streams."""

from qim.streams.topics import (
    ALL_TOPICS,
    CONVERSATION_REQUESTS,
    DISPATCH,
    OUTBOX,
    PRESENCE,
    TO_GATEWAY,
    USER_REQUESTS,
    TopicSpec,
)

__all__ = [
    "ALL_TOPICS",
    "CONVERSATION_REQUESTS",
    "DISPATCH",
    "OUTBOX",
    "PRESENCE",
    "TO_GATEWAY",
    "USER_REQUESTS",
    "TopicSpec",
]
