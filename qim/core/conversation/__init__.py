"""The ConversationWriter's send path as pure functions (spec 6.2-6.4, 7.1-7.4, 7.8, 8.1-8.4).

No asyncio, Faust, Kafka or clocks: the shell passes ``now_ms`` and a ``MembershipView``, executes
the returned :data:`Decision` and feeds committed outbox records back through
``ConversationWriterState.apply`` - live and in recovery alike (``replay``).

Modules, one step of the flow each: ``ids`` (conversation ids), ``membership`` (the check),
``admission`` (L1/L2 buckets), ``dedup`` (ClientDedup), ``allocation`` (ids and seq), ``policy``
(inline body, preview), ``head`` (ConversationHead rules), ``decision`` (outcomes and replies),
``amend`` (RECALL / EDIT), ``writer`` (the state), ``snapshot`` (checkpoint bytes), ``replay``
(rebuild), ``config`` (Appendix B values).
"""

from qim.core.conversation.admission import AdmissionBuckets, Cell, Charge, charges_for
from qim.core.conversation.allocation import Coordinates, allocate, clock_state
from qim.core.conversation.amend import Amended, AmendMembershipView, HistoryLookup
from qim.core.conversation.config import WriterConfig, WriterLimits
from qim.core.conversation.decision import (
    Accepted,
    Decision,
    Duplicate,
    Rejected,
    Transient,
    ack_reply,
    error_reply,
)
from qim.core.conversation.dedup import ClientDedup, DedupEntry
from qim.core.conversation.head import (
    ApplyOutcome,
    ConversationHead,
    Sequenced,
    SequencedRecord,
)
from qim.core.conversation.ids import (
    DIRECT_PREFIX,
    GROUP_PREFIX,
    MAX_CONVERSATION_ID_BYTES,
    conversation_kind,
    direct_conversation_id,
    direct_participants,
    group_conversation_id,
    group_id_for,
    is_direct_participant,
    validate_conversation_id,
)
from qim.core.conversation.membership import MembershipView, NoGroups, Target, resolve_target
from qim.core.conversation.policy import inline_body_decision, placeholder_preview
from qim.core.conversation.replay import replay
from qim.core.conversation.snapshot import SNAPSHOT_FORMAT, WriterSnapshot, decode_snapshot
from qim.core.conversation.writer import ConversationWriterState, Reacted, WriterFencedError

__all__ = [
    "DIRECT_PREFIX",
    "GROUP_PREFIX",
    "MAX_CONVERSATION_ID_BYTES",
    "SNAPSHOT_FORMAT",
    "Accepted",
    "AdmissionBuckets",
    "AmendMembershipView",
    "Amended",
    "ApplyOutcome",
    "Cell",
    "Charge",
    "ClientDedup",
    "ConversationHead",
    "ConversationWriterState",
    "Coordinates",
    "Decision",
    "DedupEntry",
    "Duplicate",
    "HistoryLookup",
    "MembershipView",
    "NoGroups",
    "Reacted",
    "Rejected",
    "Sequenced",
    "SequencedRecord",
    "Target",
    "Transient",
    "WriterConfig",
    "WriterFencedError",
    "WriterLimits",
    "WriterSnapshot",
    "ack_reply",
    "allocate",
    "charges_for",
    "clock_state",
    "conversation_kind",
    "decode_snapshot",
    "direct_conversation_id",
    "direct_participants",
    "error_reply",
    "group_conversation_id",
    "group_id_for",
    "inline_body_decision",
    "is_direct_participant",
    "placeholder_preview",
    "replay",
    "resolve_target",
    "validate_conversation_id",
]
