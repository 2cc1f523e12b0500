"""Every Kafka topic of the pipeline, declared once (direction.md section 3).

The dispatch, presence, user-requests and to-gateway topics are partitioned explicitly by shard id
(never by key hash), so their partition counts are the shard counts and may never change without a
resharding procedure (spec 5.5). `topology.md` renders from these declarations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Cleanup = Literal["delete", "compact"]

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


@dataclass(frozen=True)
class TopicSpec:
    """One topic: who writes it, who reads it, how it is partitioned and kept."""

    name: str
    partitions_param: str
    partitioned_by: str
    key: str
    cleanup: Cleanup
    retention_ms: int | None
    producer: str
    consumer: str

    def partitions(self, counts: dict[str, int]) -> int:
        return counts[self.partitions_param]

    def config(self) -> dict[str, str]:
        cfg: dict[str, str] = {"cleanup.policy": self.cleanup}
        if self.retention_ms is not None:
            cfg["retention.ms"] = str(self.retention_ms)
        return cfg


CONVERSATION_REQUESTS = TopicSpec(
    name="qim.conversation-requests",
    partitions_param="conversation_partition_count",
    partitioned_by="explicit partition = conversation_partition() (blake3 of the key)",
    key="(tenant, conversation_id)",
    cleanup="delete",
    retention_ms=DAY_MS,
    producer="ConnectionNode, group admin endpoint",
    consumer="ConversationWriter",
)
OUTBOX = TopicSpec(
    name="qim.outbox",
    partitions_param="conversation_partition_count",
    partitioned_by="explicit partition = the writer's request partition (same count)",
    key="(tenant, conversation_id)",
    cleanup="delete",
    # >= mailbox retention (Appendix B mailbox_retention_days = 7) plus a day of margin.
    retention_ms=8 * DAY_MS,
    producer="ConversationWriter",
    consumer="FanoutCoordinator, HistoryArchiver",
)
DISPATCH = TopicSpec(
    name="qim.dispatch",
    partitions_param="mailbox_shard_count",
    partitioned_by="explicit partition = mailbox_shard_id",
    key="(tenant, dispatch_id) or (tenant, user_id)",
    cleanup="delete",
    retention_ms=8 * DAY_MS,
    producer="FanoutCoordinator, MailboxNode (user-state commands from user-requests)",
    consumer="MailboxNode",
)
PRESENCE = TopicSpec(
    name="qim.presence",
    partitions_param="mailbox_shard_count",
    partitioned_by="explicit partition = mailbox_shard_id of the user",
    key="(tenant, user_id, device_id)",
    cleanup="compact",
    retention_ms=None,
    producer="ConnectionNode (sole writer)",
    consumer="MailboxNode",
)
USER_REQUESTS = TopicSpec(
    name="qim.user-requests",
    partitions_param="mailbox_shard_count",
    partitioned_by="explicit partition = mailbox_shard_id of the user",
    key="(tenant, user_id)",
    cleanup="delete",
    retention_ms=HOUR_MS,
    producer="ConnectionNode",
    consumer=(
        "MailboxNode (reads: auth sync, pull mailbox, session list; user-state changes;"
        " PRESENCE_STALE; PUSHED/APPLIED/DELIVERED evidence and CONN_CLOSED, 16.1.2)"
    ),
)
TO_GATEWAY = TopicSpec(
    name="qim.to-gateway",
    partitions_param="connection_shard_count",
    partitioned_by="explicit partition = connection_shard_id",
    key="(tenant, user_id) for replies and RTC relays, (tenant, conversation_id) for "
    "PushBatch and TYPING relays",
    cleanup="delete",
    retention_ms=HOUR_MS,
    producer="ConversationWriter, MailboxNode, key worker (prekey replies, low-water notices), "
    "ConnectionNode (RTC ring timeout cancels), NotificationService (RTC cancel{offline} when "
    "no device of an offline callee could be pushed)",
    consumer="ConnectionNode owning the ConnectionShard",
)

WRITER_SNAPSHOTS = TopicSpec(
    name="qim.writer-snapshots",
    partitions_param="conversation_partition_count",
    partitioned_by="explicit partition = the writer's conversation partition",
    key="<partition>:<chunk> (a checkpoint is split into chunks of <= 512 KiB)",
    cleanup="compact",
    retention_ms=None,
    producer="ConversationWriter (in the transaction of its outbox appends)",
    consumer="ConversationWriter taking a partition over (restore, then replay the outbox)",
)
ADMIN_REPLIES = TopicSpec(
    name="qim.admin-replies",
    partitions_param="single_partition",
    partitioned_by="one partition",
    key="node_id of the admin endpoint",
    cleanup="delete",
    retention_ms=HOUR_MS,
    producer="ConversationWriter",
    consumer="the group admin endpoint (`qim admin serve`) that sent the request",
)
USER_QUOTA = TopicSpec(
    name="qim.user-quota",
    partitions_param="mailbox_shard_count",
    partitioned_by="explicit partition = mailbox_shard_id of the user",
    key="(tenant, user_id)",
    cleanup="compact",
    retention_ms=None,
    producer="MailboxNode (when a user's conversation count crosses max_conversations_per_user)",
    consumer="ConversationWriter (every worker reads every partition from the start, no group)",
)
DEVICE_TOKEN_COMMANDS = TopicSpec(
    name="qim.device-token-commands",
    partitions_param="mailbox_shard_count",
    partitioned_by="explicit partition = mailbox_shard_id of the user",
    key="(tenant, user_id, device_id)",
    cleanup="delete",
    retention_ms=DAY_MS,
    producer="device-token HTTP API (token sealed), NotificationService (410 deletions)",
    consumer="NotificationService (`device_token_commands` agent -> `device_tokens` table)",
)
DEVICE_TOKEN_DIGEST = TopicSpec(
    name="qim.device-token-digest",
    partitions_param="mailbox_shard_count",
    partitioned_by="explicit partition = mailbox_shard_id of the user",
    key="(tenant, user_id, device_id)",
    cleanup="compact",
    retention_ms=None,
    producer="NotificationService (sole writer; null value = tombstone, no token in it)",
    consumer="MailboxNode (local digest cache for D(user), spec 16.6)",
)
PUSH_TASKS = TopicSpec(
    name="qim.push-tasks",
    partitions_param="mailbox_shard_count",
    partitioned_by="explicit partition = mailbox_shard_id of the user",
    key="(tenant, user_id, device_id)",
    cleanup="delete",
    retention_ms=HOUR_MS,
    producer="MailboxNode (after materialization, per offline device), NotificationService "
    "(merge-window flush ticks), ConnectionNode (RTC: one `voip` task per invite to a callee "
    "with no online device, key (tenant, user, '*'))",
    consumer="NotificationService (`push_tasks` agent)",
)
DEVICE_TOKENS_CHANGELOG = TopicSpec(
    # Faust's name for the table's changelog, declared so it exists (compacted, with the source
    # topics' partition count) before the first notify worker writes the table: a worker that
    # joined before it was visible crashed its agent with PartitionsMismatch (0 partitions).
    name="qim-notify-device_tokens-changelog",
    partitions_param="mailbox_shard_count",
    partitioned_by="the command partition the token was written from (co-partitioned)",
    key="(tenant, user_id, device_id)",
    cleanup="compact",
    retention_ms=None,
    producer="NotificationService (table `device_tokens`, token sealed)",
    consumer="NotificationService taking a partition over (Faust table recovery)",
)
PUSH_DEVICE_STATE_CHANGELOG = TopicSpec(
    name="qim-notify-push_device_state-changelog",  # Faust's name, declared as above
    partitions_param="mailbox_shard_count",
    partitioned_by="the PushTask partition the state was written from (co-partitioned)",
    key="(tenant, user_id, device_id)",
    cleanup="compact",
    retention_ms=None,
    producer="NotificationService (table `push_device_state`; each push waits for its ack)",
    consumer="NotificationService taking a partition over (Faust table recovery)",
)
USER_DEVICES_CHANGELOG = TopicSpec(
    name="qim-notify-user_devices-changelog",  # Faust's name, declared as above
    partitions_param="mailbox_shard_count",
    partitioned_by="the command partition the token was written from (co-partitioned)",
    key="(tenant, user_id)",
    cleanup="compact",
    retention_ms=None,
    producer="NotificationService (table `user_devices`: device ids with a token, VoIP fan-out)",
    consumer="NotificationService taking a partition over (Faust table recovery)",
)
USER_CONVERSATION_STATE_CHANGELOG = TopicSpec(
    # Faust's name for a table `UserConversationState` of the app `qim-mailbox`
    # (qim.tables.user_state_changelog.declare_table reads it as one); written by the
    # MailboxNode itself after each WriteBatch that changed U rows (topology.md decision 41).
    name="qim-mailbox-UserConversationState-changelog",
    partitions_param="mailbox_shard_count",
    partitioned_by="explicit partition = mailbox_shard_id of the user",
    key="(tenant, user_id, conversation_id)",
    cleanup="compact",
    retention_ms=None,
    producer="MailboxNode (the U rows of each WriteBatch, with the dispatch offset they were "
    "folded from)",
    consumer="MailboxNode taking a shard over on an empty disk after the dispatch log's "
    "retention (restore, then replay the log on top)",
)
PREKEY_REQUESTS = TopicSpec(
    name="qim.prekey-requests",
    partitions_param="prekey_partition_count",
    partitioned_by="explicit partition = prekey_partition() (blake3 of the bundle owner's key)",
    key="(tenant, user_id) of the bundle owner (publisher, or fetch target)",
    cleanup="delete",
    retention_ms=HOUR_MS,
    producer="ConnectionNode (PREKEY_PUBLISH, PREKEY_FETCH)",
    consumer=(
        "key worker (`qim.apps.keys`, agent `prekeys`; table `DevicePreKeyBundle` is"
        " co-partitioned)"
    ),
)
PREKEY_BUNDLES_CHANGELOG = TopicSpec(
    # Faust's own name for the table's changelog ({app_id}-{table}-changelog), declared here so
    # it exists, compacted, before the first key worker joins: a group formed before its
    # metadata is visible would give the agent request partitions with no table partitions.
    name="qim-keys-DevicePreKeyBundle-changelog",
    partitions_param="prekey_partition_count",
    partitioned_by="the request partition the row was written from (co-partitioned)",
    key="(tenant, user_id): one row per user, every device's bundle (7.14)",
    cleanup="compact",
    retention_ms=None,
    producer="key worker (table `DevicePreKeyBundle`, acks=all, flushed before any reply)",
    consumer="key worker taking a partition over (Faust table recovery)",
)

REVOCATIONS = TopicSpec(
    name="qim.revocations",
    partitions_param="single_partition",
    partitioned_by="one partition: every gateway reads every revocation, in order",
    key="(tenant, user_id) or token_id",
    cleanup="delete",
    retention_ms=DAY_MS,
    producer="AuthService (`qim token serve`, `qim token revoke`), after the Redis record",
    consumer="every ConnectionNode, from its end at start (kicks live sessions it revokes)",
)
ROOM_REQUESTS = TopicSpec(
    name="qim.room-requests",
    partitions_param="room_partition_count",
    partitioned_by="explicit partition = room_partition() (blake3 of the key)",
    key="(tenant, room_id)",
    cleanup="delete",
    retention_ms=HOUR_MS,
    producer="ConnectionNode (ROOM_JOIN, ROOM_REPLAY, room sends, broadcast targets)",
    consumer="RoomWriter",
)
ROOM_LOG = TopicSpec(
    name="qim.room-log",
    partitions_param="room_partition_count",
    partitioned_by="explicit partition = the RoomWriter's request partition (same count)",
    key="(tenant, room_id)",
    cleanup="delete",
    # room_log_retention_minutes (B.3, 30 min): the short-lived RoomRecord (7.12, 14.1)
    retention_ms=30 * 60_000,
    producer="RoomWriter (each RoomRecord before its broadcast)",
    consumer="RoomWriter taking a partition over (each room's last room_epoch)",
)
ROOMS = TopicSpec(
    name="qim.rooms",
    partitions_param="single_partition",
    partitioned_by="one partition",
    key="(tenant, room_id)",
    cleanup="compact",
    retention_ms=None,
    producer="`qim room create / delete` (operators)",
    consumer="RoomWriter (every worker reads it all, no group)",
)

KEYS = TopicSpec(
    name="qim.keys",
    partitions_param="single_partition",
    partitioned_by="one partition: every decrypt point folds every key, in one order",
    key="(tenant, key_scope, key_id, key_version): one slot per key version",
    cleanup="compact",
    retention_ms=None,
    producer="ConversationWriter (TenantMasterKey / ConversationDEK on first need, acks=all, "
    "before any body sealed with it)",
    consumer="every ConversationWriter and MailboxNode (the key ring, read from the start, "
    "no group)",
)

ALL_TOPICS: tuple[TopicSpec, ...] = (
    CONVERSATION_REQUESTS,
    OUTBOX,
    DISPATCH,
    PRESENCE,
    USER_REQUESTS,
    TO_GATEWAY,
    WRITER_SNAPSHOTS,
    ADMIN_REPLIES,
    USER_QUOTA,
    DEVICE_TOKEN_COMMANDS,
    DEVICE_TOKEN_DIGEST,
    PUSH_TASKS,
    DEVICE_TOKENS_CHANGELOG,
    PUSH_DEVICE_STATE_CHANGELOG,
    USER_DEVICES_CHANGELOG,
    USER_CONVERSATION_STATE_CHANGELOG,
    PREKEY_REQUESTS,
    PREKEY_BUNDLES_CHANGELOG,
    REVOCATIONS,
    ROOM_REQUESTS,
    ROOM_LOG,
    ROOMS,
    KEYS,
)
