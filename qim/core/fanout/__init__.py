"""FanoutCoordinator core: outbox records in, dispatch-log records out (spec 7.8, 10.1, 6.7).

Pure (no I/O, no clock, no randomness, no set/dict order in outputs). The Faust agent on the
outbox feeds each record, in log order, to :meth:`FanoutState.apply_outbox` and produces what it
returns, in that order, to the returned records' explicit partitions (``record.partition``, the
target MailboxShard); a :class:`NotReady` is held and surfaced, never skipped. It checkpoints
the state (:meth:`FanoutState.encode`) only after everything produced is acknowledged. Member
slices are the ConversationWriter's to publish (same transaction as the outbox record).

* ``state`` -- :class:`FanoutState`: exactly one dispatch per target shard of each commit;
* ``build`` -- the GroupDispatch of a message or of a membership CONTROL message;
* ``event_group`` -- the 6.7 caps: worst case, split (each chunk's ``dispatch_id``: chunk 0 =
  spec 7.8, later chunks a documented variant), :func:`check_event_group_caps`;
* ``recipients`` -- :func:`expand_dispatch`, the MailboxNode's rule for who gets entries;
* ``audit`` -- :func:`audit_fanout`, replay the outbox and diff it with the dispatch log.
"""

from qim.core.fanout.audit import COORDINATE_FIELDS, Finding, FindingKind, audit_fanout
from qim.core.fanout.build import (
    AMEND_TEMPLATE,
    MEMBERSHIP_TEMPLATE,
    MESSAGE_TEMPLATE_FLAGS,
    amend_dispatch,
    membership_dispatch,
    message_dispatch,
    message_template,
)
from qim.core.fanout.config import INLINE_DEK_ID_ALLOWANCE, FanoutConfig
from qim.core.fanout.event_group import (
    CHUNK_DISPATCH_ID_DOMAIN,
    EventGroupOverflow,
    PlannedEntry,
    check_event_group_caps,
    chunk_dispatch_id,
    chunk_dispatch_id_input,
    planned_entries,
    split_event_groups,
)
from qim.core.fanout.recipients import Delivery, SliceMismatch, expand_dispatch, mention_type_of
from qim.core.fanout.state import (
    FanoutLogError,
    FanoutState,
    NotReady,
    NotReadyReason,
    VersionInfo,
)

__all__ = [
    "AMEND_TEMPLATE",
    "CHUNK_DISPATCH_ID_DOMAIN",
    "COORDINATE_FIELDS",
    "INLINE_DEK_ID_ALLOWANCE",
    "MEMBERSHIP_TEMPLATE",
    "MESSAGE_TEMPLATE_FLAGS",
    "Delivery",
    "EventGroupOverflow",
    "FanoutConfig",
    "FanoutLogError",
    "FanoutState",
    "Finding",
    "FindingKind",
    "NotReady",
    "NotReadyReason",
    "PlannedEntry",
    "SliceMismatch",
    "VersionInfo",
    "amend_dispatch",
    "audit_fanout",
    "check_event_group_caps",
    "chunk_dispatch_id",
    "chunk_dispatch_id_input",
    "expand_dispatch",
    "membership_dispatch",
    "mention_type_of",
    "message_dispatch",
    "message_template",
    "planned_entries",
    "split_event_groups",
]
