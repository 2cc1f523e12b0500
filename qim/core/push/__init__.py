"""Online delivery as pure functions and state machines (spec 5.4, 9.4, 11.1-11.3, 15.1.1).

MailboxNode side: :class:`ShardPresenceCache` (fed only by its own presence partition, with
its :class:`OnlineFilter`) and :func:`plan_push`, called after entries are durable and
``W[lane]`` has advanced, returning one PushBatch per ConnectionShard (fire-and-forget).

ConnectionNode side: :func:`expand_batch` applies the 11.1.1 rules (unknown connection or
epoch mismatch -> PresenceStale), and each connection's :class:`ConnectionPush` runs the
login barrier (:mod:`.barrier`) and flow control (:mod:`.flow`) on one ledger and produces
PUSH_EVENTS bodies; :func:`enforce_node_budget` is the node-level ladder of 11.3.3.

Pure: no asyncio, faust, aiokafka or websockets; time is an argument. :func:`render_diagrams`
renders both transition tables as mermaid for the docs.
"""

from qim.core.push.barrier import (
    BARRIER_TABLE,
    DEFAULT_QUEUE_LIMIT,
    BarrierAction,
    BarrierEvent,
    BarrierResult,
    BarrierState,
    LoginBarrier,
)
from qim.core.push.budget import BudgetDecision, ConnectionLoad, enforce_node_budget
from qim.core.push.connection import (
    CLOSE_IDLE,
    CLOSE_SEND_BUFFER_HARD,
    CloseConnection,
    ConnectionPush,
    DroppedWhileDegraded,
    PushAction,
    SendControl,
    SignalDirty,
    WritePush,
)
from qim.core.push.expand import Delivery, Expansion, LocalConnection, expand_batch
from qim.core.push.flow import (
    DEFAULT_FLOW_LIMITS,
    FLOW_TABLE,
    FlowAction,
    FlowControl,
    FlowEvent,
    FlowLimits,
    FlowState,
)
from qim.core.push.online import OfflineCause, OnlineFilter, SliceKey, UserRef
from qim.core.push.planner import (
    LARGE_GROUP_MEMBER_THRESHOLD,
    MaterializedEntry,
    PushPlan,
    plan_push,
    push_body_of,
    push_priority,
)
from qim.core.push.presence_cache import ForeignPartition, ReconcileReport, ShardPresenceCache
from qim.core.push.table import IllegalTransition, Machine, Transition, TransitionTable
from qim.core.push.wire import ENTRY_OVERHEAD_BYTES, EntryFragment, PendingPush

__all__ = [
    "BARRIER_TABLE",
    "CLOSE_IDLE",
    "CLOSE_SEND_BUFFER_HARD",
    "DEFAULT_FLOW_LIMITS",
    "DEFAULT_QUEUE_LIMIT",
    "ENTRY_OVERHEAD_BYTES",
    "FLOW_TABLE",
    "LARGE_GROUP_MEMBER_THRESHOLD",
    "BarrierAction",
    "BarrierEvent",
    "BarrierResult",
    "BarrierState",
    "BudgetDecision",
    "CloseConnection",
    "ConnectionLoad",
    "ConnectionPush",
    "Delivery",
    "DroppedWhileDegraded",
    "EntryFragment",
    "Expansion",
    "FlowAction",
    "FlowControl",
    "FlowEvent",
    "FlowLimits",
    "FlowState",
    "ForeignPartition",
    "IllegalTransition",
    "LocalConnection",
    "LoginBarrier",
    "Machine",
    "MaterializedEntry",
    "OfflineCause",
    "OnlineFilter",
    "PendingPush",
    "PushAction",
    "PushPlan",
    "ReconcileReport",
    "SendControl",
    "ShardPresenceCache",
    "SignalDirty",
    "SliceKey",
    "Transition",
    "TransitionTable",
    "UserRef",
    "WritePush",
    "enforce_node_budget",
    "expand_batch",
    "plan_push",
    "push_body_of",
    "push_priority",
    "render_diagrams",
]


def render_diagrams() -> str:
    """Markdown with one mermaid block per table (login barrier, flow control) for the docs."""
    blocks = []
    for title, table in (
        ("Login barrier (9.4)", BARRIER_TABLE),
        ("Flow control (11.3)", FLOW_TABLE),
    ):
        blocks.append(f"### {title}\n\n```mermaid\n{table.render_mermaid()}\n```")
    return "\n\n".join(blocks) + "\n"
