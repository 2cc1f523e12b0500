/**
 * The local session list (§12.6.2, §12.8.3), like qim.client.sessions: pages, SESSION_DELTA,
 * BADGE_UPDATE and READ_SYNC all overwrite, never add, so replayed or reordered frames do not
 * drift. A delta overwrites a row only with a strictly larger projection_mailbox_seq.
 * Deviation from the Python SDK: a delta whose driving entry is not applied yet is applied at
 * once instead of being held (the counts are absolute, so the row is still exact).
 */
import type { Body } from './codec.js';

export interface SessionRow {
  conversation_id: string;
  latest_conversation_seq: number;
  last_activity_id: Uint8Array;
  last_message_id: Uint8Array;
  preview_or_placeholder: Uint8Array;
  unread_count: number;
  unread_exact: boolean;
  mention_count: number;
  mention_first_conversation_seq: number;
  pin_rank?: number;
  muted: boolean;
  archived: boolean;
  write_policy: string;
  delivered_conversation_seq?: number;
  read_conversation_seq: number;
}

export interface Badge {
  total_unread: number;
  total_mention: number;
  muted_unread: number;
  badge_projection_mailbox_seq: number;
}

const num = (v: unknown): number => Number(v as number | bigint);

function compareBytes(a: Uint8Array, b: Uint8Array): number {
  for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return a[i]! - b[i]!;
  return a.length - b.length;
}

export class SessionList {
  readonly rows = new Map<string, SessionRow>();
  readonly versions = new Map<string, number>();
  badge: Badge | null = null;
  revision = 0;

  applyPage(batch: Body, first: boolean): boolean {
    const revision = num(batch.snapshot_revision);
    if (first || revision !== this.revision) {
      for (const conv of [...this.rows.keys()]) if (!this.versions.get(conv)) this.rows.delete(conv);
      this.revision = revision;
      if (!first) return false;
    }
    for (const entry of batch.sessions as SessionRow[]) {
      const local = this.rows.get(entry.conversation_id);
      if (!local || !this.versions.get(entry.conversation_id)) {
        this.rows.set(entry.conversation_id, { ...entry });
        continue;
      }
      Object.assign(local, {
        pin_rank: entry.pin_rank, muted: entry.muted, archived: entry.archived, write_policy: entry.write_policy,
        delivered_conversation_seq: entry.delivered_conversation_seq,
        read_conversation_seq: Math.max(local.read_conversation_seq, entry.read_conversation_seq),
      });
    }
    return true;
  }

  applyDelta(delta: Body): boolean {
    const conv = delta.conversation_id as string;
    const version = num(delta.projection_mailbox_seq);
    if (version <= (this.versions.get(conv) ?? 0)) return false;
    const row: SessionRow = this.rows.get(conv) ?? {
      conversation_id: conv, latest_conversation_seq: 0, last_activity_id: new Uint8Array(16),
      last_message_id: new Uint8Array(16), preview_or_placeholder: new Uint8Array(0), unread_count: 0,
      unread_exact: true, mention_count: 0, mention_first_conversation_seq: 0, muted: false, archived: false,
      write_policy: '', read_conversation_seq: 0,
    };
    for (const k of ['unread_count', 'mention_count', 'latest_conversation_seq', 'mention_first_conversation_seq'] as const)
      row[k] = num(delta[k]);
    row.last_activity_id = delta.last_activity_id as Uint8Array;
    row.last_message_id = delta.last_message_id as Uint8Array;
    row.preview_or_placeholder = delta.preview_or_placeholder as Uint8Array;
    row.unread_exact = delta.unread_exact as boolean;
    this.rows.set(conv, row);
    this.versions.set(conv, version);
    return true;
  }

  /** A read watermark (READ_SYNC or our own MARK_READ): forward only. */
  applyReadSync(conversationId: string, readSeq: number): boolean {
    const row = this.rows.get(conversationId);
    if (!row || readSeq <= row.read_conversation_seq) return false;
    row.read_conversation_seq = readSeq;
    if (readSeq >= row.latest_conversation_seq) {
      row.unread_count = 0;
      row.unread_exact = true;
      row.mention_count = 0;
      row.mention_first_conversation_seq = 0;
    }
    return true;
  }

  applyBadge(update: Body): boolean {
    const seq = num(update.badge_projection_mailbox_seq);
    if (this.badge && seq <= this.badge.badge_projection_mailbox_seq) return false;
    this.badge = {
      total_unread: num(update.total_unread), total_mention: num(update.total_mention),
      muted_unread: num(update.muted_unread), badge_projection_mailbox_seq: seq,
    };
    return true;
  }

  /** Pinned first (by rank), then newest activity first (§12.3). */
  ordered(): SessionRow[] {
    return [...this.rows.values()].sort((a, b) => {
      const pa = a.pin_rank ?? 2 ** 31, pb = b.pin_rank ?? 2 ** 31;
      if (pa !== pb) return pa - pb;
      return compareBytes(b.last_activity_id, a.last_activity_id) || (a.conversation_id < b.conversation_id ? -1 : 1);
    });
  }
}

/**
 * The gap rule of a `mention_only` conversation (§10.2.3 rules 2-3, §6.10.1), like
 * qim.client.gaps: silent-period messages have no mailbox entry and seq differences must not be
 * read as gaps, so the client keeps how far its history is known complete (`through`, moved only
 * by PULL_HISTORY pages) and fills everything up to the row's latest_conversation_seq.
 * `always` rows never ask.
 */
export class HistoryCoverage {
  readonly through = new Map<string, number>();

  gap(row: SessionRow | undefined): [number, number] | null {
    if (!row || row.write_policy !== 'mention_only') return null;
    const held = this.through.get(row.conversation_id) ?? 0;
    const latest = num(row.latest_conversation_seq);
    return held >= latest ? null : [held, latest];
  }

  /** A `newer` page pulled from `after`; returns the new `through`. */
  filled(conversationId: string, after: number, batch: Body): number {
    const held = this.through.get(conversationId) ?? 0;
    if (after > held) return held;
    const seqs = ((batch.messages as Body[] | undefined) ?? []).map((m) => num(m.conversation_seq));
    const top = batch.has_more ? Math.max(after, ...seqs) : num(batch.latest_conversation_seq ?? 0);
    const next = Math.max(held, top);
    this.through.set(conversationId, next);
    return next;
  }
}
