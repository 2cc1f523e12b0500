"""Topic declarations: the pipeline's streams."""

from qim.streams.topics import (
    ADMIN_REPLIES,
    ALL_TOPICS,
    CONVERSATION_REQUESTS,
    DISPATCH,
    OUTBOX,
    PREKEY_BUNDLES_CHANGELOG,
    PREKEY_REQUESTS,
    PRESENCE,
    TO_GATEWAY,
    USER_QUOTA,
    USER_REQUESTS,
    WRITER_SNAPSHOTS,
    TopicSpec,
)

__all__ = [
    "ADMIN_REPLIES",
    "ALL_TOPICS",
    "CONVERSATION_REQUESTS",
    "DISPATCH",
    "OUTBOX",
    "PREKEY_BUNDLES_CHANGELOG",
    "PREKEY_REQUESTS",
    "PRESENCE",
    "TO_GATEWAY",
    "USER_QUOTA",
    "USER_REQUESTS",
    "WRITER_SNAPSHOTS",
    "TopicSpec",
]
