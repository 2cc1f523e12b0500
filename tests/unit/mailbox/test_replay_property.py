"""Replay is byte-identical (direction.md 4.2, 4.7; spec I-5, acceptance 26; seed 003 M-2, #8).

Random dispatch logs -- direct and group messages, chunked slices reordered against the
dispatches pinned to them (ADR-0017), re-appended duplicates, stale fencing epochs, mentions,
recalls / edits / deletes of earlier messages (and their targets re-appended after them),
``mention_only`` group messages and logins (the tier's active set and heads),
a tiny entry cap and a one-day window so trims happen -- must give the same store bytes however
the log is cut into batches, after a crash that loses an uncommitted batch, and whether
retention sweeps run often or once.
"""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from qim.core.mailbox import (
    DAY_MS,
    MailboxConfig,
    MemoryMailboxStore,
    SliceCache,
    commit,
    materialize,
    replay,
    resume_from,
    retention_sweep,
    store_digest,
)
from qim.core.mailbox.sessions import load_projection, rebuild_user
from qim.core.session_list import UserProjection
from qim.schemas.records.dispatch import EventTemplate, GroupDispatch, ShardLogRecord
from qim.schemas.records.membership import MemberSliceRecord
from qim.schemas.records.user_state import UserStateCommand
from tests.unit.mailbox.support import (
    BASE_TIME,
    EPOCH,
    T,
    amend,
    dispatch,
    group_slice,
    local_users,
    remote_user,
)

ShardLog = list[tuple[int, ShardLogRecord]]

CONFIG = MailboxConfig(
    mailbox_shard=0,
    mailbox_shard_count=4,
    max_mailbox_entries_per_user=9,
    mailbox_retention_days=1,
    mention_entries=True,
)
USERS = (*local_users(5, prefix="p"), remote_user())
GROUPS = ("g:0", "g:1")
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def logs(draw: st.DrawFn) -> ShardLog:
    records: list[ShardLogRecord] = []  # the fanout's records and users' MARK_READs
    versions = dict.fromkeys(GROUPS, 0)
    group_seq = dict.fromkeys(GROUPS, 0)
    epochs = dict.fromkeys(GROUPS, 1)
    now = BASE_TIME
    sent: list[GroupDispatch] = []
    for n in range(1, draw(st.integers(1, 30)) + 1):
        now += draw(st.integers(0, DAY_MS))
        kinds = ["direct", "group", "version", "dup", "epoch", "notice", "amend", "read", "online"]
        kind = draw(st.sampled_from(kinds))
        messages = [m for m in sent if m.event_type == 0 and m.amend_action is None]
        group = draw(st.sampled_from(GROUPS))
        if kind == "version" or (kind in ("group", "epoch") and versions[group] == 0):
            versions[group] += 1
            chosen = draw(st.lists(st.sampled_from(USERS[:-1]), unique=True, max_size=5))
            members = [(u, draw(st.integers(0, group_seq[group] + 1))) for u in chosen]
            records += group_slice(group, versions[group], members, chunk=draw(st.integers(1, 3)))
        if kind in ("group", "version"):
            group_seq[group] += 1
            mentions = tuple(draw(st.lists(st.sampled_from([*USERS, "@all"]), max_size=2)))
            d = dispatch(
                n,
                conversation=group,
                kind="group",
                sender=draw(st.sampled_from(USERS)),
                version=versions[group],
                seq_in_conversation=group_seq[group],
                fencing_epoch=epochs[group],
                committed_at=now,
                template=EventTemplate(mention_targets=mentions),
            )
            # the mention_only tier (10.2.3): silent members' entries depend on the log only
            policy = draw(st.sampled_from(["always", "mention_only"]))
            d = msgspec.structs.replace(d, write_policy=policy)
        elif kind == "epoch":
            epochs[group] += 1
            d = dispatch(
                n,
                conversation=group,
                kind="group",
                sender=USERS[0],
                version=versions[group],
                fencing_epoch=epochs[group] - draw(st.integers(0, 2)),
                committed_at=now,
            )
        elif kind == "notice":  # a membership notice to its subjects, broadcast or not
            subjects = draw(st.lists(st.sampled_from(USERS), unique=True, min_size=1, max_size=2))
            group_seq[group] += 1
            d = dispatch(
                n,
                conversation=group,
                kind="group",
                sender=subjects[0],
                version=draw(st.sampled_from([0, versions[group]])),
                seq_in_conversation=group_seq[group],
                participants=sorted(subjects),
                event_type=2,
                committed_at=now,
            )
        elif kind == "amend" and messages:  # a recall / edit / delete of an earlier message
            target = draw(st.sampled_from(messages))
            action = draw(st.sampled_from(["recall", "edit", "delete"]))
            conv = target.conversation_id
            seq = None
            if conv in group_seq:
                group_seq[conv] += 1
                seq = group_seq[conv]
            d = amend(
                n,
                target,
                action,
                new_payload=b"edited" if action == "edit" else b"",
                actor=draw(st.sampled_from(USERS)),
                committed_at=now,
                seq_in_conversation=seq,
            )
        elif kind == "read" and any(m.conversation_kind == "direct" for m in messages):
            # a MARK_READ of a local user (a log record: rebases, recounts). Direct
            # conversations only: these logs' group joins are bare slices without the
            # MEMBERSHIP entry the writer always sends, so the user's 7.5 state would not know
            # its joined_at and a recount would count messages from before the join
            directs = sorted(
                {m.conversation_id for m in messages if m.conversation_kind == "direct"}
            )
            conv = draw(st.sampled_from(directs))
            records.append(
                UserStateCommand(
                    tenant_id=T,
                    user_id=draw(st.sampled_from(USERS[:-1])),
                    conversation_id=conv,
                    action="mark_read",
                    command_id=n.to_bytes(16, "big"),
                    target_mailbox_shard=CONFIG.mailbox_shard,
                    committed_at=now,
                    read_conversation_seq=draw(st.integers(0, max(group_seq.values()) + n)),
                )
            )
            continue
        elif kind == "online":  # a login of a read-diffusion member: activity only
            records.append(
                UserStateCommand(
                    tenant_id=T,
                    user_id=draw(st.sampled_from(USERS[:-1])),
                    conversation_id="",
                    action="online",
                    command_id=n.to_bytes(16, "big"),
                    target_mailbox_shard=CONFIG.mailbox_shard,
                    committed_at=now,
                )
            )
            continue
        elif kind == "dup" and sent:
            d = draw(st.sampled_from(sent))
        else:
            pair = draw(st.lists(st.sampled_from(USERS), min_size=2, max_size=2, unique=True))
            d = dispatch(
                n,
                conversation="d:" + ":".join(sorted(pair)),  # one conversation per pair
                sender=pair[0],
                participants=sorted(pair),
                committed_at=now,
                template=EventTemplate(reply_to_sender_id=pair[1]),
            )
        records.append(d)
        sent.append(d)
    for _ in range(draw(st.integers(0, 6))):  # retried appends land late (ADR-0017)
        i = draw(st.integers(0, len(records) - 1))
        j = min(len(records) - 1, i + draw(st.integers(1, 4)))
        records[i], records[j] = records[j], records[i]
    return list(enumerate(records))


cuts = st.lists(st.integers(1, 7), min_size=1, max_size=6)


@FAST
@given(log=logs(), first=cuts, second=cuts)
def test_26_replay_of_any_batch_cutting_gives_identical_bytes(
    log: ShardLog, first: list[int], second: list[int]
) -> None:
    whole = replay(log, shard_epoch=EPOCH, config=CONFIG)
    one = replay(log, shard_epoch=EPOCH, config=CONFIG, batch_sizes=first)
    other = replay(log, shard_epoch=EPOCH, config=CONFIG, batch_sizes=[1])
    assert store_digest(one.items()) == store_digest(whole.items())
    assert store_digest(other.items()) == store_digest(whole.items())
    assert store_digest(
        replay(log, shard_epoch=EPOCH, config=CONFIG, batch_sizes=second).items()
    ) == (store_digest(whole.items()))


@FAST
@given(log=logs(), data=st.data())
def test_M2_a_lost_batch_and_a_restart_from_min_w_converge(
    log: ShardLog, data: st.DataObject
) -> None:
    reference = replay(log, shard_epoch=EPOCH, config=CONFIG)
    crash = data.draw(st.integers(0, len(log)))
    cache = SliceCache(max_entries=2)  # survives the lost batch: must not change the outcome
    store = replay(
        log[:crash],
        shard_epoch=EPOCH,
        config=CONFIG,
        batch_sizes=data.draw(cuts),
        slice_cache=cache,
    )
    lost = log[crash : crash + 5]
    materialize(store, lost, shard_epoch=EPOCH, config=CONFIG, slice_cache=cache)  # not committed
    start = resume_from(store, CONFIG)
    assert start <= crash
    rest = log[start:]
    again = data.draw(cuts)
    replay(
        rest, shard_epoch=EPOCH, config=CONFIG, store=store, batch_sizes=again, slice_cache=cache
    )
    assert store_digest(store.items()) == store_digest(reference.items())


@FAST
@given(log=logs(), every=cuts)
def test_18_3_sweeps_at_any_log_time_converge_with_one_final_sweep(
    log: ShardLog, every: list[int]
) -> None:
    once = replay(log, shard_epoch=EPOCH, config=CONFIG)
    once.apply(retention_sweep(once, 1 << 62, CONFIG).ops)
    often = MemoryMailboxStore()
    position = 0
    for size in every * len(log):
        if position >= len(log):
            break
        commit(
            often,
            materialize(often, log[position : position + size], shard_epoch=EPOCH, config=CONFIG),
        )
        position += size
        often.apply(retention_sweep(often, 1 << 62, CONFIG).ops)
    often.apply(retention_sweep(often, 1 << 62, CONFIG).ops)
    assert store_digest(often.items()) == store_digest(once.items())


def _shown(p: UserProjection) -> tuple[object, ...]:
    """What a device sees (``projection_replay._content``): rows without stamps, the badge."""
    rows = {c: msgspec.structs.replace(r, projection_mailbox_seq=0) for c, r in p.rows.items()}
    return rows, p.badge.sums


@settings(FAST, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(log=logs(), every=cuts)
def test_12_2_every_list_rebuilds_identically_after_any_trims(
    log: ShardLog, every: list[int]
) -> None:
    """Issue 14: the time window (1 day here) and the entry cap (9) trim every user's mailbox
    in these logs; the rebuild from the retained and carried entries gives the live list.

    Logs where one writer epoch gave one conversation_seq to two different messages are left
    out: no ConversationWriter can commit that (the seq is allocated once per epoch, and a new
    epoch restores the counter), and which of the two the live fold keeps is then arbitrary.
    So are logs with a member joining mid-conversation (``joined_at`` > 0) by a bare member
    slice: the real writer announces a join with its MEMBERSHIP entry (12.9), which these
    generated logs do not carry, so the recount has no boundary to start from."""
    seen: dict[tuple[str, int, int], bytes] = {}
    for _, record in log:
        if isinstance(record, MemberSliceRecord):
            assume(not any(record.joined_at))
        if isinstance(record, GroupDispatch) and record.amend_action is None:
            key = (record.conversation_id, record.fencing_epoch, record.conversation_seq)
            assume(seen.setdefault(key, record.message_id) == record.message_id)
    store = MemoryMailboxStore()
    position = 0
    for size in every * len(log):
        if position >= len(log):
            break
        commit(
            store,
            materialize(store, log[position : position + size], shard_epoch=EPOCH, config=CONFIG),
        )
        position += size
        store.apply(retention_sweep(store, 1 << 62, CONFIG).ops)
    for user in USERS[:-1]:
        live = load_projection(store, T, user)
        rebuilt = rebuild_user(store, T, user, CONFIG.session_list, CONFIG.lane_count)
        assert _shown(rebuilt) == _shown(live), user
