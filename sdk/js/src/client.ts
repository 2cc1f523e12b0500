/**
 * QimClient: one device's connection to a ConnectionNode over WebSocket (one frame per binary
 * message), with the behaviour of qim.client:
 *
 * - AUTH with the persisted mailbox cursor; on a lost connection, reconnect with exponential
 *   backoff and jitter (an ERROR's retry_after_ms wins) and log in again.
 * - Login sync (§9.3): PULL_MAILBOX from the cursor until covered_through_seq reaches
 *   AUTH_OK.sync_to_seq, persisting the cursor after each batch, then SYNC_COMPLETE ->
 *   ONLINE_READY, then one top-up pull (the login race of §9.3). PUSH_EVENTS that arrive before
 *   ONLINE_READY are held and released after it (the login barrier); entries are deduplicated
 *   by (message_id, event_id), so a replayed range is never delivered twice.
 * - Heartbeat: PING every next_ping_interval_ms; a missing PONG drops the connection.
 * - SEND_MESSAGE with a client_message_id that is kept across retries (the writer dedups it,
 *   §8), history paging, the session list with exact unread, MARK_READ / READ_SYNC,
 *   RECALL / EDIT.
 */
import { decodeMessage, encodeFrame, ProtocolError, type Body, type Frame } from './codec.js';
import { HistoryCoverage, SessionList, type SessionRow } from './sessions.js';
import { MemoryCursorStore, type CursorStore, type DeviceCursor } from './store.js';

export const ERROR_CODES: Record<number, string> = {
  1: 'CURSOR_EXPIRED', 2: 'CURSOR_REBASED', 3: 'CURSOR_INVALID', 4: 'MAILBOX_DIRTY', 5: 'SYNC_INCOMPLETE',
  6: 'SHARD_MOVED', 7: 'REGION_FAILOVER', 8: 'RATE_LIMITED', 9: 'FANOUT_QUOTA_EXCEEDED', 10: 'TOKEN_EXPIRED',
  11: 'TOKEN_REVOKED', 12: 'UPGRADE_REQUIRED', 13: 'CLOCK_UNSAFE', 14: 'PAYLOAD_TOO_LARGE', 15: 'PERMISSION_DENIED',
  16: 'PREKEY_EXHAUSTED',
};

/** An ERROR frame answering one of our requests (or AUTH). */
export class QimError extends Error {
  readonly codeName: string;
  constructor(readonly code: number, readonly detail: string, readonly retryAfterMs?: number) {
    super(`${ERROR_CODES[code] ?? `code ${code}`}: ${detail}`);
    this.codeName = ERROR_CODES[code] ?? 'UNKNOWN';
  }
}

export class Disconnected extends Error {}

export interface SyncEntry {
  mailbox_seq: number | bigint;
  event_id: number | bigint;
  event_type: number;
  message_id: Uint8Array;
  conversation_id: string;
  conversation_seq: number;
  sender_id: string;
  created_at: number;
  client_message_id?: string;
  target_conversation_seq?: number;
  body_included: boolean;
  message_type?: number;
  custom_type?: string;
  payload_or_ciphertext?: Uint8Array;
  [k: string]: unknown;
}

type WsLike = {
  binaryType: string;
  readyState: number;
  send(data: Uint8Array): void;
  close(code?: number): void;
  onopen: ((ev: unknown) => void) | null;
  onclose: ((ev: unknown) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
};
export type WebSocketCtor = new (url: string) => WsLike;

export interface ClientOptions {
  url: string;
  /** Called before every AUTH, so a reconnect can use a fresh token. */
  token: string | (() => Promise<string> | string);
  deviceId: string;
  /** Key of the persisted cursor; defaults to deviceId. */
  cursorKey?: string;
  store?: CursorStore;
  WebSocket?: WebSocketCtor;
  clientVersion?: string;
  requestTimeoutMs?: number;
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  sendAttempts?: number;
  pullMaxItems?: number;
}

export type ClientEvent =
  | { type: 'state'; state: 'connecting' | 'syncing' | 'online' | 'offline' | 'closed' }
  | { type: 'entries'; entries: SyncEntry[]; source: 'pull' | 'push' }
  | { type: 'sessions'; conversationIds: string[] }
  | { type: 'badge' }
  | { type: 'read_sync'; conversationId: string; readConversationSeq: number }
  | { type: 'reactions'; conversationId: string; conversationSeq: number; reactions: MessageReactions }
  | { type: 'typing'; conversationId: string; userId: string; expiresInMs: number }
  | { type: 'presence'; entries: PresenceEntry[] }
  | { type: 'rtc'; signal: Body }
  | { type: 'room'; batch: Body }
  | { type: 'frame'; frame: Frame }
  | { type: 'error'; error: Error };

/** A message's reaction aggregate as the client knows it (REACTION_UPDATE is absolute, 13.6). */
export interface MessageReactions {
  counts: Record<string, number>;
  summaryVersion: number;
  /** this user's own keys; a frame that omits them leaves them unchanged */
  selfReactionKeys: string[];
}

/** One user's presence as PRESENCE_SUB reports it (13.2). */
export interface PresenceEntry {
  user_id: string;
  state: string;
  last_active_at: number | bigint;
}

interface Pending {
  reply: string;
  resolve: (f: Frame) => void;
  reject: (e: Error) => void;
  timer: ReturnType<typeof setTimeout>;
}

const u32 = 0xffffffff;
const num = (v: unknown): number => Number(v as number | bigint);
const big = (v: number | bigint): bigint => BigInt(v);
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

function newClientMessageId(): string {
  const c = globalThis.crypto;
  if (c?.randomUUID) return c.randomUUID().replace(/-/g, '');
  return `${Date.now().toString(16)}${Math.random().toString(16).slice(2)}`;
}

export class QimClient {
  readonly sessions = new SessionList();
  readonly coverage = new HistoryCoverage();
  state: 'connecting' | 'syncing' | 'online' | 'offline' | 'closed' = 'offline';
  authOk: Body | null = null;
  cursor: DeviceCursor = { token: new Uint8Array(0), lastAppliedMailboxSeq: 0 };
  /** ERROR frames that answered nothing of ours, PONGs and the like are counted, not thrown. */
  unknownFrames = 0;

  private ws: WsLike | null = null;
  private readonly opts: Required<Omit<ClientOptions, 'WebSocket' | 'store' | 'cursorKey'>> & { cursorKey: string };
  private readonly store: CursorStore;
  private readonly Ws: WebSocketCtor;
  private nextRequestId = 1;
  private readonly pending = new Map<number, Pending>();
  private readonly listeners = new Set<(e: ClientEvent) => void>();
  private readonly seen = new Set<string>();
  private held: SyncEntry[] = [];
  private barrierOpen = false;
  private heartbeat: ReturnType<typeof setTimeout> | null = null;
  private pingId = 0;
  private awaitingPong = 0;
  private closedByUser = false;
  private onlineWaiters: Array<() => void> = [];
  private attempt = 0;
  private syncCompleteWaiter: ((f: Frame) => void) | null = null;
  private lastPushedUserSeq = 0n;
  private catchUpTimer: ReturnType<typeof setTimeout> | null = null;
  private catchingUp = false;

  constructor(options: ClientOptions) {
    this.opts = {
      clientVersion: 'qim-js/0.1.0', requestTimeoutMs: 15000, backoffInitialMs: 250, backoffMaxMs: 15000,
      sendAttempts: 5, pullMaxItems: 500, cursorKey: options.deviceId, ...options,
    } as typeof this.opts;
    this.store = options.store ?? new MemoryCursorStore();
    const ctor = options.WebSocket ?? (globalThis as { WebSocket?: WebSocketCtor }).WebSocket;
    if (!ctor) throw new Error('no WebSocket implementation: pass options.WebSocket');
    this.Ws = ctor;
  }

  on(listener: (e: ClientEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  private emit(e: ClientEvent): void {
    for (const l of [...this.listeners]) l(e);
  }

  private setState(state: QimClient['state']): void {
    this.state = state;
    this.emit({ type: 'state', state });
    if (state === 'online') for (const w of this.onlineWaiters.splice(0)) w();
  }

  /** Connect, log in and sync; resolves at ONLINE_READY. Reconnects on its own afterwards. */
  async start(): Promise<void> {
    this.closedByUser = false;
    const stored = await this.store.load(this.opts.cursorKey);
    if (stored) this.cursor = stored;
    await this.loginWithRetry();
  }

  /** Resolves once the client is ONLINE (after a reconnect, too). */
  online(): Promise<void> {
    if (this.state === 'online') return Promise.resolve();
    return new Promise((r) => this.onlineWaiters.push(r));
  }

  close(): void {
    this.closedByUser = true;
    if (this.catchUpTimer) clearTimeout(this.catchUpTimer);
    this.catchUpTimer = null;
    this.stopHeartbeat();
    this.ws?.close(1000);
    this.ws = null;
    this.failPending(new Disconnected('closed'));
    this.setState('closed');
  }

  private backoffMs(retryAfterMs?: number): number {
    if (retryAfterMs !== undefined) return retryAfterMs;
    const cap = Math.min(this.opts.backoffMaxMs, this.opts.backoffInitialMs * 2 ** Math.min(this.attempt, 10));
    return cap / 2 + Math.random() * (cap / 2);
  }

  private async loginWithRetry(): Promise<void> {
    for (;;) {
      if (this.closedByUser) throw new Disconnected('closed');
      try {
        await this.login();
        this.attempt = 0;
        return;
      } catch (e) {
        const err = e as Error;
        if (err instanceof QimError && ['TOKEN_REVOKED', 'CURSOR_INVALID', 'UPGRADE_REQUIRED', 'PERMISSION_DENIED'].includes(err.codeName)) {
          if (err.codeName === 'CURSOR_INVALID') {
            this.cursor = { token: new Uint8Array(0), lastAppliedMailboxSeq: 0 };
            await this.store.save(this.opts.cursorKey, this.cursor);
            continue;
          }
          this.close();
          throw err;
        }
        if (err instanceof QimError && err.codeName === 'CURSOR_EXPIRED') {
          // §9.6.3 REBUILD: re-handshake with (token, 0); the app back-fills from the session list.
          this.cursor = { token: this.cursor.token, lastAppliedMailboxSeq: 0 };
        }
        this.emit({ type: 'error', error: err });
        this.ws?.close();
        this.ws = null;
        this.attempt++;
        await sleep(this.backoffMs(err instanceof QimError ? err.retryAfterMs : undefined));
      }
    }
  }

  private open(): Promise<WsLike> {
    return new Promise((resolve, reject) => {
      const ws = new this.Ws(this.opts.url);
      ws.binaryType = 'arraybuffer';
      ws.onopen = () => resolve(ws);
      ws.onerror = () => reject(new Disconnected('websocket error'));
      ws.onclose = () => {
        reject(new Disconnected('websocket closed'));
        if (this.ws === ws) this.lost();
      };
      ws.onmessage = (ev) => {
        if (this.ws !== ws) return;
        const data = ev.data instanceof ArrayBuffer ? new Uint8Array(ev.data) : (ev.data as Uint8Array);
        if (!(data instanceof Uint8Array)) return;
        try {
          this.onFrame(decodeMessage(data, 'client'));
        } catch (e) {
          if (e instanceof ProtocolError) {
            this.emit({ type: 'error', error: e });
            ws.close();
          } else throw e;
        }
      };
    });
  }

  private lost(): void {
    this.ws = null;
    this.stopHeartbeat();
    this.failPending(new Disconnected('connection lost'));
    if (this.closedByUser) return;
    this.setState('offline');
    this.attempt++;
    setTimeout(() => void this.loginWithRetry().catch((e: Error) => this.emit({ type: 'error', error: e })), this.backoffMs());
  }

  private failPending(err: Error): void {
    for (const [id, p] of this.pending) {
      clearTimeout(p.timer);
      p.reject(err);
      this.pending.delete(id);
    }
  }

  private async login(): Promise<void> {
    this.setState('connecting');
    this.barrierOpen = false;
    this.held = [];
    const ws = await this.open();
    this.ws = ws;
    const token = typeof this.opts.token === 'function' ? await this.opts.token() : this.opts.token;
    const auth: Body = { access_token: token, device_id: this.opts.deviceId, client_version: this.opts.clientVersion };
    const { token: ctok, lastAppliedMailboxSeq: seq } = this.cursor;
    if (ctok.length > 0) auth.mailbox_cursor = { token: ctok, last_applied_mailbox_seq: seq };
    const ok = (await this.request('AUTH', auth, 'AUTH_OK')).body;
    this.authOk = ok;
    this.lastPushedUserSeq = big(ok.sync_to_seq as number | bigint);
    const okToken = ok.mailbox_cursor_token as Uint8Array;
    if (okToken.length > 0) this.cursor = { ...this.cursor, token: okToken };
    this.startHeartbeat(num(ok.next_ping_interval_ms) || 30000);
    this.sessions.applyBadge({
      total_unread: ok.total_unread, total_mention: ok.total_mention, muted_unread: ok.muted_unread,
      badge_projection_mailbox_seq: ok.badge_projection_mailbox_seq,
    });
    this.emit({ type: 'badge' });
    this.setState('syncing');
    const syncTo = big(ok.sync_to_seq as number | bigint);
    if (ok.has_offline) await this.pullRange(syncTo);
    const ready = new Promise<Frame>((resolve) => (this.syncCompleteWaiter = resolve));
    this.sendFrame('SYNC_COMPLETE', { sync_to_seq: ok.sync_to_seq }, this.allocRequestId());
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Disconnected('no ONLINE_READY')), this.opts.requestTimeoutMs);
    });
    try {
      await Promise.race([ready, late]);
    } finally {
      clearTimeout(timer);
    }
    if (!ok.has_offline && big(this.cursor.lastAppliedMailboxSeq) < syncTo) await this.saveCursor(ok.sync_to_seq as number);
    this.barrierOpen = true;
    const held = this.held;
    this.held = [];
    this.deliver(held, 'push');
    await this.pullRange(0n); // top-up: closes the login race (§9.3)
    this.setState('online');
  }

  /** PULL_MAILBOX from the cursor until `upTo` is covered (0 = the lane's current watermark). */
  private async pullRange(upTo: bigint): Promise<void> {
    for (let i = 0; i < 10000; i++) {
      const after = this.cursor.lastAppliedMailboxSeq;
      const batch = (await this.request('PULL_MAILBOX', {
        after_seq: after, up_to_seq: upTo, max_items: this.opts.pullMaxItems, max_bytes: 1 << 20,
        acked_seq: after,
      }, 'MAILBOX_BATCH')).body;
      this.deliver(batch.entries as SyncEntry[], 'pull');
      const covered = big(batch.covered_through_seq as number | bigint);
      if (covered > big(after)) await this.saveCursor(batch.covered_through_seq as number | bigint);
      if (!batch.has_more || (upTo > 0n && covered >= upTo) || covered <= big(after)) return;
    }
  }

  private async saveCursor(seq: number | bigint): Promise<void> {
    this.cursor = { token: this.cursor.token, lastAppliedMailboxSeq: seq };
    await this.store.save(this.opts.cursorKey, this.cursor);
  }

  private deliver(entries: SyncEntry[], source: 'pull' | 'push'): void {
    const fresh: SyncEntry[] = [];
    for (const e of entries) {
      const key = `${Array.from(e.message_id).join(',')}/${e.event_id}`;
      if (this.seen.has(key)) continue;
      this.seen.add(key);
      fresh.push(e);
    }
    if (fresh.length) this.emit({ type: 'entries', entries: fresh, source });
  }

  /**
   * Pushes never move the cursor (§9.4.3): a catch-up PULL_MAILBOX does, once the cursor is
   * below last_pushed_user_seq or the server says mailbox_dirty (dedup drops what was pushed).
   */
  private notePushed(seq: number | bigint, dirty: boolean): void {
    const pushed = big(seq ?? 0);
    if (pushed > this.lastPushedUserSeq) this.lastPushedUserSeq = pushed;
    if (!dirty && big(this.cursor.lastAppliedMailboxSeq) >= this.lastPushedUserSeq) return;
    if (this.catchUpTimer || this.catchingUp) return;
    this.catchUpTimer = setTimeout(() => {
      this.catchUpTimer = null;
      if (this.state !== 'online') return;
      this.catchingUp = true;
      this.pullRange(0n)
        .catch((e: Error) => this.emit({ type: 'error', error: e }))
        .finally(() => (this.catchingUp = false));
    }, 100);
  }

  private startHeartbeat(intervalMs: number): void {
    this.stopHeartbeat();
    const tick = () => {
      if (!this.ws) return;
      if (this.awaitingPong) {
        this.ws.close(); // the previous PING got no PONG in a whole interval: the link is dead
        return;
      }
      this.awaitingPong = ++this.pingId;
      this.sendFrame('PING', { ping_id: this.pingId, client_time: Date.now(), last_applied_mailbox_seq: this.cursor.lastAppliedMailboxSeq }, 0);
      this.heartbeat = setTimeout(tick, intervalMs);
    };
    this.heartbeat = setTimeout(tick, intervalMs);
  }

  private stopHeartbeat(): void {
    if (this.heartbeat) clearTimeout(this.heartbeat);
    this.heartbeat = null;
    this.awaitingPong = 0;
  }

  private allocRequestId(): number {
    let id = this.nextRequestId;
    while (this.pending.has(id)) id = (id % u32) + 1;
    this.nextRequestId = (id % u32) + 1;
    return id;
  }

  private sendFrame(name: string, body: Body, requestId: number): void {
    if (!this.ws) throw new Disconnected('not connected');
    this.ws.send(encodeFrame(name, body, { requestId }));
  }

  /** Send a request and await its reply (ERROR with our request_id rejects with QimError). */
  request(name: string, body: Body, reply: string): Promise<Frame> {
    return new Promise((resolve, reject) => {
      const id = this.allocRequestId();
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Disconnected(`no ${reply} for ${name}`));
      }, this.opts.requestTimeoutMs);
      this.pending.set(id, { reply, resolve, reject, timer });
      try {
        this.sendFrame(name, 'request_id' in body || name === 'SEND_MESSAGE' ? { ...body, request_id: id } : body, id);
      } catch (e) {
        clearTimeout(timer);
        this.pending.delete(id);
        reject(e as Error);
      }
    });
  }

  private onFrame(frame: Frame): void {
    const { name, body, header } = frame;
    this.emit({ type: 'frame', frame });
    if (name === 'ERROR') {
      const id = header.requestId || num(body.request_id);
      const p = this.pending.get(id);
      const err = new QimError(num(body.code), body.detail as string, body.retry_after_ms === undefined ? undefined : num(body.retry_after_ms));
      if (p) {
        clearTimeout(p.timer);
        this.pending.delete(id);
        p.reject(err);
      } else this.emit({ type: 'error', error: err });
      return;
    }
    if (name === 'PONG') {
      if (num(body.ping_id) === this.awaitingPong) this.awaitingPong = 0;
      this.notePushed(body.last_pushed_user_seq as number | bigint, body.mailbox_dirty === true);
      return;
    }
    if (name === 'ONLINE_READY') {
      this.syncCompleteWaiter?.(frame);
      this.syncCompleteWaiter = null;
      return;
    }
    if (header.requestId !== 0) {
      const p = this.pending.get(header.requestId);
      if (p && p.reply === name) {
        clearTimeout(p.timer);
        this.pending.delete(header.requestId);
        p.resolve(frame);
        return;
      }
    }
    switch (name) {
      case 'PUSH_EVENTS': {
        const events = body.events as SyncEntry[];
        if (this.barrierOpen) this.deliver(events, 'push');
        else this.held.push(...events); // the login barrier: nothing before ONLINE_READY
        this.notePushed(body.last_pushed_user_seq as number | bigint, false);
        return;
      }
      case 'SESSION_DELTA':
        if (this.sessions.applyDelta(body)) this.emit({ type: 'sessions', conversationIds: [body.conversation_id as string] });
        return;
      case 'BADGE_UPDATE':
        if (this.sessions.applyBadge(body)) this.emit({ type: 'badge' });
        return;
      case 'READ_SYNC': {
        const conv = body.conversation_id as string;
        const seq = num(body.read_conversation_seq);
        this.sessions.applyReadSync(conv, seq);
        this.emit({ type: 'read_sync', conversationId: conv, readConversationSeq: seq });
        this.emit({ type: 'sessions', conversationIds: [conv] });
        return;
      }
      case 'REACTION_UPDATE':
        this.applyReactionUpdate(body);
        return;
      case 'TYPING':
        this.emit({ type: 'typing', conversationId: body.conversation_id as string, userId: body.user_id as string, expiresInMs: num(body.expires_in_ms ?? 0) });
        return;
      case 'PRESENCE_SUB':
        this.emit({ type: 'presence', entries: this.applyPresence(body) });
        return;
      case 'RTC_SIGNAL':
        this.emit({ type: 'rtc', signal: body });
        return;
      case 'ROOM_BATCH':
        this.emit({ type: 'room', batch: body });
        return;
      case 'KICKED':
        this.close();
        this.emit({ type: 'error', error: new Disconnected(`kicked: ${body.reason as string}`) });
        return;
      default:
        this.unknownFrames++;
    }
  }

  /**
   * SEND_MESSAGE -> SEND_ACK (durable commit). A lost connection or a back-off error retries with
   * the same client_message_id after the next ONLINE_READY, so the writer stores it once.
   */
  async sendMessage(conversationId: string, payload: Uint8Array, opts: { clientMessageId?: string; messageType?: number; mentionTargets?: string[]; peerUserId?: string } = {}): Promise<Body> {
    const cmid = opts.clientMessageId ?? newClientMessageId();
    const body: Body = {
      client_message_id: cmid, conversation_id: conversationId, message_type: opts.messageType ?? 1,
      payload, mention_targets: opts.mentionTargets ?? [],
      // a one-to-one id is a one-way hash of the pair: the sender names the peer (docs/protocol.md)
      ...(opts.peerUserId ? { peer_user_id: opts.peerUserId } : {}),
    };
    let last: Error | null = null;
    for (let attempt = 0; attempt < this.opts.sendAttempts; attempt++) {
      try {
        await this.online();
        const ack = (await this.request('SEND_MESSAGE', body, 'SEND_ACK')).body;
        if (ack.client_message_id !== cmid) throw new Error(`SEND_ACK echoes ${String(ack.client_message_id)}, sent ${cmid}`);
        return ack;
      } catch (e) {
        last = e as Error;
        const retryable = e instanceof Disconnected || (e instanceof QimError && ['RATE_LIMITED', 'REGION_FAILOVER', 'CLOCK_UNSAFE', 'SHARD_MOVED'].includes(e.codeName));
        if (!retryable) throw e;
        await sleep(this.backoffMs(e instanceof QimError ? e.retryAfterMs : undefined));
      }
    }
    throw last ?? new Error('send failed');
  }

  /** PULL_HISTORY -> HISTORY_BATCH; page older with the smallest conversation_seq as anchor. */
  async pullHistory(conversationId: string, opts: { direction?: 'older' | 'newer'; anchor?: number; limit?: number } = {}): Promise<Body> {
    return (await this.request('PULL_HISTORY', {
      conversation_id: conversationId, direction: opts.direction ?? 'older', anchor_conversation_seq: opts.anchor ?? 0,
      limit: opts.limit ?? 50,
    }, 'HISTORY_BATCH')).body;
  }

  /** AUTH_OK asked for PULL_SESSION_LIST before the list is rendered (§9.3.1, §10.2.3). */
  get sessionListRequired(): boolean {
    return this.authOk !== null && !this.authOk.projection_complete;
  }

  /**
   * The §10.2.3 gap rule on entering a conversation: for a `mention_only` row, PULL_HISTORY
   * `newer` pages from the covered seq up to latest_conversation_seq; returns the messages.
   */
  async enterConversation(conversationId: string, opts: { limit?: number; maxPages?: number } = {}): Promise<Body[]> {
    const pulled: Body[] = [];
    for (let page = 0; page < (opts.maxPages ?? 20); page++) {
      const gap = this.coverage.gap(this.sessions.rows.get(conversationId));
      if (!gap) break;
      const batch = await this.pullHistory(conversationId, { direction: 'newer', anchor: gap[0], limit: opts.limit ?? 50 });
      pulled.push(...((batch.messages as Body[] | undefined) ?? []));
      if (this.coverage.filled(conversationId, gap[0], batch) <= gap[0]) break;
    }
    return pulled;
  }

  /** Every page of PULL_SESSION_LIST into `sessions`; restarts when the revision moves. */
  async loadSessionList(pageSize = 100): Promise<SessionRow[]> {
    for (let restart = 0; restart < 5; restart++) {
      let cursor: Uint8Array = new Uint8Array(0);
      let first = true;
      let ok = true;
      for (;;) {
        const batch = (await this.request('PULL_SESSION_LIST', {
          snapshot_revision: first ? 0 : this.sessions.revision, page_cursor: cursor, limit: pageSize,
        }, 'SESSION_LIST_BATCH')).body;
        if (!this.sessions.applyPage(batch, first)) {
          ok = false;
          break;
        }
        first = false;
        if (!batch.has_more) break;
        cursor = batch.next_page_cursor as Uint8Array;
      }
      if (ok) break;
    }
    this.emit({ type: 'sessions', conversationIds: [...this.sessions.rows.keys()] });
    return this.sessions.ordered();
  }

  /** MARK_READ (no reply); the other devices get READ_SYNC, this one updates its row now. */
  markRead(conversationId: string, readConversationSeq: number): void {
    this.sendFrame('MARK_READ', { conversation_id: conversationId, read_conversation_seq: readConversationSeq }, this.allocRequestId());
    if (this.sessions.applyReadSync(conversationId, readConversationSeq)) this.emit({ type: 'sessions', conversationIds: [conversationId] });
  }

  /** CREATE_GROUP -> MEMBER_LIST_BATCH: this user becomes the OWNER. `e2ee` makes the group
   * end-to-end encrypted for its whole life (spec 22.1; at most e2ee_max_members). */
  async createGroup(groupId: string, memberIds: string[], options: { e2ee?: boolean } = {}): Promise<Body> {
    const body: Body = { group_id: groupId, member_ids: memberIds };
    if (options.e2ee) body.e2ee = true;
    return (await this.request('CREATE_GROUP', body, 'MEMBER_LIST_BATCH')).body;
  }

  /** PULL_MEMBERS -> MEMBER_LIST_BATCH{members[]{user_id, role, ...}, next_offset, has_more}:
   * one page of a conversation's members (a non-member is refused PERMISSION_DENIED). */
  async pullMembers(conversationId: string, opts: { offset?: number; limit?: number; filter?: 'all' | 'admin' | 'banned' | 'search'; query?: string } = {}): Promise<Body> {
    const body: Body = { conversation_id: conversationId, filter: opts.filter ?? 'all', query: opts.query ?? '', offset: opts.offset ?? 0, limit: opts.limit ?? 200 };
    return (await this.request('PULL_MEMBERS', body, 'MEMBER_LIST_BATCH')).body;
  }

  async recall(conversationId: string, targetConversationSeq: number): Promise<Body> {
    return (await this.request('RECALL', { conversation_id: conversationId, target_conversation_seq: targetConversationSeq }, 'SEND_ACK')).body;
  }

  async edit(conversationId: string, targetConversationSeq: number, newPayload: Uint8Array): Promise<Body> {
    return (await this.request('EDIT', { conversation_id: conversationId, target_conversation_seq: targetConversationSeq, new_payload: newPayload }, 'SEND_ACK')).body;
  }

  /** Presence of the users this connection subscribed to, by user_id (soft state, 13.2). */
  readonly presence = new Map<string, PresenceEntry>();

  /** TYPING (13.2): "I am typing" to the other members' online devices; no reply (a refusal
   * arrives as an 'error' event with the returned request_id). */
  typing(conversationId: string): number {
    const id = this.allocRequestId();
    this.sendFrame('TYPING', { conversation_id: conversationId }, id);
    return id;
  }

  /** PRESENCE_SUB subscribe / unsubscribe / replace, by user ids or by a conversation's
   * members (never both) -> the snapshot; increments arrive as 'presence' events. */
  async subscribePresence(target: { userIds: string[] } | { conversationId: string }, action: 'subscribe' | 'unsubscribe' | 'replace' = 'subscribe'): Promise<PresenceEntry[]> {
    const body = 'userIds' in target ? { action, targets: target.userIds } : { action, conversation_id: target.conversationId };
    if (action === 'replace') this.presence.clear();
    if (action === 'unsubscribe' && 'userIds' in target) for (const u of target.userIds) this.presence.delete(u);
    return this.applyPresence((await this.request('PRESENCE_SUB', body, 'PRESENCE_SUB')).body);
  }

  private applyPresence(body: Body): PresenceEntry[] {
    const entries = [...((body.entries as PresenceEntry[] | undefined) ?? [])];
    for (const e of entries) this.presence.set(e.user_id, e);
    return entries;
  }

  /** RTC_SIGNAL (13.5): one call step to every online device of the target; no reply (the
   * server's cancels and the callee's answers arrive as 'rtc' events). */
  rtcSignal(conversationId: string, targetUserId: string, signalType: string, callId: string, signalPayload: Uint8Array = new Uint8Array(), reason = ''): number {
    const id = this.allocRequestId();
    this.sendFrame('RTC_SIGNAL', { conversation_id: conversationId, target_user_id: targetUserId, signal_type: signalType, call_id: callId, signal_payload: signalPayload, reason }, id);
    return id;
  }

  /** ROOM_JOIN -> ROOM_BATCH{room_epoch, latest_room_seq, earliest_replay_room_seq} (14.5);
   * live batches arrive as 'room' events. */
  async joinRoom(roomId: string, afterRoomSeq?: number): Promise<Body> {
    const body: Body = afterRoomSeq === undefined ? { room_id: roomId } : { room_id: roomId, after_room_seq: afterRoomSeq };
    return (await this.request('ROOM_JOIN', body, 'ROOM_BATCH')).body;
  }

  async leaveRoom(roomId: string): Promise<Body> {
    return (await this.request('ROOM_LEAVE', { room_id: roomId }, 'ROOM_BATCH')).body;
  }

  /** ROOM_REPLAY inside the window, or an empty batch with replay_truncated outside it (14.3). */
  async replayRoom(roomId: string, afterRoomSeq: number): Promise<Body> {
    return (await this.request('ROOM_REPLAY', { room_id: roomId, after_room_seq: afterRoomSeq }, 'ROOM_BATCH')).body;
  }

  /** A message into a joined room: SEND_MESSAGE to its r: id -> SEND_ACK (conversation_seq 0). */
  sendRoom(roomId: string, payload: Uint8Array): Promise<Body> {
    return this.sendMessage(roomId, payload);
  }

  /** Reaction aggregates by `${conversationId}:${conversationSeq}`, newest version only. */
  readonly reactions = new Map<string, MessageReactions>();

  /** REACT -> the absolute REACTION_UPDATE (a repeated add or a remove of nothing changes nothing). */
  async react(conversationId: string, conversationSeq: number, reactionKey: string, action: 'add' | 'remove' = 'add'): Promise<MessageReactions | undefined> {
    const frame = await this.request('REACT', { conversation_id: conversationId, conversation_seq: conversationSeq, reaction_key: reactionKey, action }, 'REACTION_UPDATE');
    this.applyReactionUpdate(frame.body);
    return this.reactions.get(`${conversationId}:${conversationSeq}`);
  }

  /** PULL_REACTIONS -> one REACTION_LIST page of who reacted with `reactionKey` (`users` empty above the detail limits, `total` always). */
  async pullReactions(conversationId: string, conversationSeq: number, reactionKey: string, opts: { offset?: number; limit?: number } = {}): Promise<{ users: string[]; total: number }> {
    const body = (await this.request('PULL_REACTIONS', { conversation_id: conversationId, conversation_seq: conversationSeq, reaction_key: reactionKey, offset: opts.offset ?? 0, limit: opts.limit ?? 0 }, 'REACTION_LIST')).body;
    return { users: [...((body.users as string[] | undefined) ?? [])], total: num(body.total ?? 0) };
  }

  /** Apply an absolute REACTION_UPDATE only if its summary_version is newer than the one held. */
  private applyReactionUpdate(body: Body): void {
    const conversationId = body.conversation_id as string;
    const conversationSeq = num(body.conversation_seq);
    const key = `${conversationId}:${conversationSeq}`;
    const version = num(body.summary_version ?? 0);
    const held = this.reactions.get(key);
    if (held && held.summaryVersion >= version) return;
    const counts: Record<string, number> = {};
    for (const [k, v] of Object.entries((body.counts as Record<string, number> | undefined) ?? {})) counts[k] = num(v);
    const self = body.self_reaction_keys as string[] | null | undefined;
    const reactions = { counts, summaryVersion: version, selfReactionKeys: self ? [...self] : (held?.selfReactionKeys ?? []) };
    this.reactions.set(key, reactions);
    this.emit({ type: 'reactions', conversationId, conversationSeq, reactions });
  }
}
