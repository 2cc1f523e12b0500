// QimClient against an in-process fake ConnectionNode speaking the real codec.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { encodeFrame, decodeMessage } from '../dist/codec.js';
import { QimClient, MemoryCursorStore } from '../dist/index.js';

const id16 = (n) => { const b = new Uint8Array(16); b[15] = n; return b; };
const entry = (seq, n) => ({
  mailbox_seq: seq, event_id: 1000 + n, message_id: id16(n), conversation_id: 'g:team', conversation_seq: n,
  last_activity_id: id16(n), sender_id: 'bob', created_at: 1, body_included: true, message_type: 1,
  payload_or_ciphertext: new TextEncoder().encode(`m${n}`),
});

/** A scripted server: `handlers[name](body, header, server)` answers uplink frames. */
function fakeServer(handlers) {
  const server = { sockets: [], received: [] };
  server.push = (name, body, requestId = 0) => {
    const ws = server.sockets.at(-1);
    ws.onmessage({ data: encodeFrame(name, body, { requestId, sender: 'server' }).buffer });
  };
  class FakeWs {
    constructor(url) {
      this.url = url; this.readyState = 0; this.binaryType = 'blob';
      server.sockets.push(this);
      queueMicrotask(() => { this.readyState = 1; this.onopen?.({}); });
    }
    send(data) {
      const f = decodeMessage(data, 'server');
      server.received.push(f);
      const h = handlers[f.name];
      if (h) queueMicrotask(() => h(f.body, f.header, server, this));
    }
    close() {
      if (this.readyState === 3) return;
      this.readyState = 3;
      queueMicrotask(() => this.onclose?.({}));
    }
  }
  server.WebSocket = FakeWs;
  return server;
}

const reply = (ws, name, body, requestId) => ws.onmessage({ data: encodeFrame(name, body, { requestId, sender: 'server' }).buffer });

function standardHandlers(batches, opts = {}) {
  return {
    AUTH: (body, h, s, ws) => {
      s.auth = body;
      reply(ws, 'AUTH_OK', { session_epoch: 1, sync_to_seq: 3, has_offline: true, mailbox_cursor_token: new Uint8Array([9]), next_ping_interval_ms: 60000 }, h.requestId);
    },
    PULL_MAILBOX: (body, h, s, ws) => {
      const b = batches.shift() ?? { entries: [], covered_through_seq: body.after_seq, has_more: false };
      if (opts.pushDuringSync && !s.pushed) {
        s.pushed = true;
        reply(ws, 'PUSH_EVENTS', { events: [entry(4, 4), entry(2, 2)] }, 0);
      }
      reply(ws, 'MAILBOX_BATCH', b, h.requestId);
    },
    SYNC_COMPLETE: (body, h, s, ws) => reply(ws, 'ONLINE_READY', {}, 0),
    ...opts.extra,
  };
}

test('login pulls to sync_to_seq, persists the cursor, holds pushes until ONLINE_READY and drops duplicates', async () => {
  const server = fakeServer(standardHandlers([
    { entries: [entry(1, 1), entry(2, 2)], covered_through_seq: 2, has_more: true },
    { entries: [entry(3, 3)], covered_through_seq: 3, has_more: false },
  ], { pushDuringSync: true }));
  const store = new MemoryCursorStore();
  const c = new QimClient({ url: 'ws://x', token: 't', deviceId: 'd1', store, WebSocket: server.WebSocket });
  const seen = [];
  const order = [];
  c.on((e) => {
    if (e.type === 'entries') seen.push(...e.entries.map((x) => [e.source, x.conversation_seq]));
    if (e.type === 'state') order.push(e.state);
  });
  await c.start();
  assert.deepEqual(seen, [['pull', 1], ['pull', 2], ['pull', 3], ['push', 4]]);
  assert.deepEqual((await store.load('d1')).token, new Uint8Array([9]));
  assert.equal((await store.load('d1')).lastAppliedMailboxSeq, 3);
  const names = server.received.map((f) => f.name);
  assert.deepEqual(names.slice(0, 5), ['AUTH', 'PULL_MAILBOX', 'PULL_MAILBOX', 'SYNC_COMPLETE', 'PULL_MAILBOX']);
  assert.equal(order.at(-1), 'online');
  c.close();
});

test('a restarted client presents the persisted cursor and pulls after it', async () => {
  const store = new MemoryCursorStore();
  await store.save('d1', { token: new Uint8Array([7]), lastAppliedMailboxSeq: 3 });
  const server = fakeServer(standardHandlers([]));
  const c = new QimClient({ url: 'ws://x', token: 't', deviceId: 'd1', store, WebSocket: server.WebSocket });
  await c.start();
  assert.deepEqual(server.auth.mailbox_cursor, { token: new Uint8Array([7]), last_applied_mailbox_seq: 3 });
  assert.equal(server.received.find((f) => f.name === 'PULL_MAILBOX').body.after_seq, 3);
  c.close();
});

test('a send lost with its connection is retried after the reconnect with the same client_message_id; a one-to-one send names its peer', async () => {
  const cmids = [];
  const server = fakeServer(standardHandlers([], {
    extra: {
      SEND_MESSAGE: (body, h, s, ws) => {
        cmids.push(body.client_message_id);
        assert.equal(body.request_id, h.requestId);
        if (cmids.length === 1) ws.close();
        else reply(ws, 'SEND_ACK', { request_id: h.requestId, client_message_id: body.client_message_id, message_id: id16(5), conversation_seq: 5, last_activity_id: id16(5) }, h.requestId);
      },
    },
  }));
  const c = new QimClient({ url: 'ws://x', token: 't', deviceId: 'd1', WebSocket: server.WebSocket, backoffInitialMs: 1, backoffMaxMs: 5 });
  await c.start();
  const ack = await c.sendMessage('g:team', new Uint8Array([1]));
  assert.equal(ack.conversation_seq, 5);
  assert.equal(cmids.length, 2);
  assert.equal(cmids[0], cmids[1]);
  assert.equal(server.received.filter((f) => f.name === 'AUTH').length, 2);
  const sends = server.received.filter((f) => f.name === 'SEND_MESSAGE');
  assert.equal(sends[0].body.peer_user_id, ''); // a group send names no peer
  await c.sendMessage('d:0011', new Uint8Array([2]), { peerUserId: 'bob' });
  assert.equal(server.received.filter((f) => f.name === 'SEND_MESSAGE').at(-1).body.peer_user_id, 'bob');
  c.close();
});

test('an ERROR answering a request rejects it with its A.6 code', async () => {
  const server = fakeServer(standardHandlers([], {
    extra: { RECALL: (body, h, s, ws) => reply(ws, 'ERROR', { code: 15, detail: 'not yours', request_id: h.requestId }, h.requestId) },
  }));
  const c = new QimClient({ url: 'ws://x', token: 't', deviceId: 'd1', WebSocket: server.WebSocket });
  await c.start();
  await assert.rejects(c.recall('g:team', 3), (e) => e.codeName === 'PERMISSION_DENIED');
  c.close();
});

test('the session list takes pages, newer deltas only, READ_SYNC and badges', async () => {
  const row = { conversation_id: 'g:team', latest_conversation_seq: 4, last_activity_id: id16(4), unread_count: 2, unread_exact: true };
  const server = fakeServer(standardHandlers([], {
    extra: { PULL_SESSION_LIST: (body, h, s, ws) => reply(ws, 'SESSION_LIST_BATCH', { sessions: [row], snapshot_revision: 1 }, h.requestId) },
  }));
  const c = new QimClient({ url: 'ws://x', token: 't', deviceId: 'd1', WebSocket: server.WebSocket });
  await c.start();
  const rows = await c.loadSessionList();
  assert.equal(rows[0].unread_count, 2);
  server.push('SESSION_DELTA', { conversation_id: 'g:team', projection_mailbox_seq: 9, latest_conversation_seq: 5, unread_count: 3, last_activity_id: id16(5), last_message_id: id16(5) });
  server.push('SESSION_DELTA', { conversation_id: 'g:team', projection_mailbox_seq: 8, latest_conversation_seq: 4, unread_count: 1 });
  assert.equal(c.sessions.rows.get('g:team').unread_count, 3);
  server.push('READ_SYNC', { conversation_id: 'g:team', read_conversation_seq: 5 });
  assert.equal(c.sessions.rows.get('g:team').unread_count, 0);
  server.push('BADGE_UPDATE', { total_unread: 0, badge_projection_mailbox_seq: 10 });
  assert.equal(c.sessions.badge.total_unread, 0);
  c.markRead('g:team', 5);
  assert.equal(server.received.at(-1).name, 'MARK_READ');
  c.close();
});

test('a mention_only row is filled through PULL_HISTORY up to latest_conversation_seq; always asks nothing', async () => {
  const rows = [
    { conversation_id: 'g:big', latest_conversation_seq: 7, last_activity_id: id16(7), unread_count: 5, unread_exact: false,
      write_policy: 'mention_only', delivered_conversation_seq: 7 },
    { conversation_id: 'g:team', latest_conversation_seq: 4, last_activity_id: id16(4), write_policy: 'always' },
  ];
  const pulls = [];
  const server = fakeServer(standardHandlers([], {
    extra: {
      PULL_SESSION_LIST: (body, h, s, ws) => reply(ws, 'SESSION_LIST_BATCH', { sessions: rows, snapshot_revision: 1 }, h.requestId),
      PULL_HISTORY: (body, h, s, ws) => {
        pulls.push([body.conversation_id, body.direction, Number(body.anchor_conversation_seq)]);
        const after = Number(body.anchor_conversation_seq);
        const seqs = after === 0 ? [2, 5] : [7]; // sparse seqs are no gap
        reply(ws, 'HISTORY_BATCH', {
          messages: seqs.map((n) => ({ conversation_seq: n, payload_or_ciphertext: new TextEncoder().encode(`m${n}`) })),
          latest_conversation_seq: 7, has_more: after === 0,
        }, h.requestId);
      },
    },
  }));
  const c = new QimClient({ url: 'ws://x', token: 't', deviceId: 'd1', WebSocket: server.WebSocket });
  await c.start();
  await c.loadSessionList();
  assert.equal(c.sessions.rows.get('g:big').delivered_conversation_seq, 7);
  const got = await c.enterConversation('g:big');
  assert.deepEqual(got.map((m) => Number(m.conversation_seq)), [2, 5, 7]);
  assert.deepEqual(pulls, [['g:big', 'newer', 0], ['g:big', 'newer', 5]]);
  assert.deepEqual(await c.enterConversation('g:big'), []);
  assert.deepEqual(await c.enterConversation('g:team'), []);
  assert.equal(pulls.length, 2);
  c.close();
});

test('a missing PONG drops the link and the client logs in again', async () => {
  const server = fakeServer({
    ...standardHandlers([]),
    AUTH: (body, h, s, ws) => reply(ws, 'AUTH_OK', { session_epoch: 1, next_ping_interval_ms: 5 }, h.requestId),
  });
  const c = new QimClient({ url: 'ws://x', token: 't', deviceId: 'd1', WebSocket: server.WebSocket, backoffInitialMs: 1, backoffMaxMs: 2 });
  await c.start();
  while (server.received.filter((f) => f.name === 'AUTH').length < 2) await new Promise((r) => setTimeout(r, 5));
  assert.ok(server.received.some((f) => f.name === 'PING'));
  c.close();
});

test('a push above the cursor triggers a catch-up pull that moves the cursor, without redelivery', async () => {
  const store = new MemoryCursorStore();
  const server = fakeServer(standardHandlers([
    { entries: [entry(1, 1)], covered_through_seq: 3, has_more: false },
    { entries: [], covered_through_seq: 3, has_more: false },
    { entries: [entry(5, 5)], covered_through_seq: 5, has_more: false },
  ]));
  const c = new QimClient({ url: 'ws://x', token: 't', deviceId: 'd1', store, WebSocket: server.WebSocket });
  const seen = [];
  c.on((e) => e.type === 'entries' && seen.push(...e.entries.map((x) => x.conversation_seq)));
  await c.start();
  server.push('PUSH_EVENTS', { events: [entry(5, 5)], last_pushed_user_seq: 5 });
  while ((await store.load('d1')).lastAppliedMailboxSeq !== 5) await new Promise((r) => setTimeout(r, 10));
  assert.deepEqual(seen, [1, 5]);
  c.close();
});

test('REACT answers with the absolute aggregate; pushed updates apply only when newer and keep own keys', async () => {
  const server = fakeServer(standardHandlers([], {
    extra: {
      REACT: (body, h, s, ws) => reply(ws, 'REACTION_UPDATE', {
        conversation_id: body.conversation_id, conversation_seq: body.conversation_seq,
        counts: { [body.reaction_key]: 2 }, summary_version: 5, self_reaction_keys: [body.reaction_key],
      }, h.requestId),
      PULL_REACTIONS: (body, h, s, ws) => reply(ws, 'REACTION_LIST', { users: ['alice', 'bob'], total: 2 }, h.requestId),
    },
  }));
  const c = new QimClient({ url: 'ws://x', token: 't', deviceId: 'd1', WebSocket: server.WebSocket });
  const seen = [];
  c.on((e) => { if (e.type === 'reactions') seen.push(e.reactions.summaryVersion); });
  await c.start();
  const mine = await c.react('g:team', 3, 'like');
  assert.deepEqual(mine, { counts: { like: 2 }, summaryVersion: 5, selfReactionKeys: ['like'] });
  const react = server.received.find((f) => f.name === 'REACT');
  assert.deepEqual([react.body.reaction_key, react.body.action], ['like', 'add']);
  server.push('REACTION_UPDATE', { conversation_id: 'g:team', conversation_seq: 3, counts: { like: 1 }, summary_version: 4 });
  server.push('REACTION_UPDATE', { conversation_id: 'g:team', conversation_seq: 3, counts: { like: 3, ok: 1 }, summary_version: 6 });
  assert.deepEqual(c.reactions.get('g:team:3'), { counts: { like: 3, ok: 1 }, summaryVersion: 6, selfReactionKeys: ['like'] });
  assert.deepEqual(seen, [5, 6]); // version 4 was older: not applied
  assert.deepEqual(await c.pullReactions('g:team', 3, 'like'), { users: ['alice', 'bob'], total: 2 });
  c.close();
});

test('typing, presence, RTC and rooms: frames out with the spec fields, answers and live frames as events', async () => {
  const server = fakeServer(standardHandlers([], {
    extra: {
      PRESENCE_SUB: (body, h, s, ws) => reply(ws, 'PRESENCE_SUB', { entries: body.targets.map((u) => ({ user_id: u, state: 'online', last_active_at: 5 })) }, h.requestId),
      ROOM_JOIN: (body, h, s, ws) => reply(ws, 'ROOM_BATCH', { room_id: body.room_id, room_epoch: 1, latest_room_seq: 7, earliest_replay_room_seq: 2 }, h.requestId),
      ROOM_REPLAY: (body, h, s, ws) => reply(ws, 'ROOM_BATCH', { room_id: body.room_id, room_epoch: 1, replay_truncated: body.after_room_seq < 2 }, h.requestId),
      ROOM_LEAVE: (body, h, s, ws) => reply(ws, 'ROOM_BATCH', { room_id: body.room_id, latest_room_seq: 7 }, h.requestId),
    },
  }));
  const c = new QimClient({ url: 'ws://x', token: 't', deviceId: 'd1', WebSocket: server.WebSocket });
  const events = [];
  c.on((e) => { if (['typing', 'presence', 'rtc', 'room'].includes(e.type)) events.push(e); });
  await c.start();
  const tid = c.typing('g:team');
  const typing = server.received.find((f) => f.name === 'TYPING');
  assert.equal(typing.body.conversation_id, 'g:team');
  assert.equal(typing.header.requestId, tid);
  const snapshot = await c.subscribePresence({ userIds: ['bob', 'carol'] });
  assert.deepEqual(snapshot.map((e) => e.user_id), ['bob', 'carol']);
  assert.equal(server.received.find((f) => f.name === 'PRESENCE_SUB').body.action, 'subscribe');
  c.rtcSignal('d:alice:bob', 'bob', 'invite', 'call-1', new Uint8Array([1]));
  const rtc = server.received.find((f) => f.name === 'RTC_SIGNAL').body;
  assert.deepEqual([rtc.target_user_id, rtc.signal_type, rtc.call_id], ['bob', 'invite', 'call-1']);
  const joined = await c.joinRoom('r:live');
  assert.deepEqual([joined.latest_room_seq, joined.earliest_replay_room_seq], [7, 2]);
  assert.equal((await c.replayRoom('r:live', 1)).replay_truncated, true);
  // live downlink frames
  server.push('TYPING', { conversation_id: 'g:team', user_id: 'bob', expires_in_ms: 5000 });
  server.push('PRESENCE_SUB', { entries: [{ user_id: 'bob', state: 'offline', last_active_at: 9 }] });
  server.push('RTC_SIGNAL', { conversation_id: 'd:alice:bob', call_id: 'call-1', signal_type: 'cancel', reason: 'timeout' });
  server.push('ROOM_BATCH', { room_id: 'r:live', room_epoch: 1, events: [], latest_room_seq: 8 });
  assert.deepEqual(events.map((e) => e.type), ['typing', 'presence', 'rtc', 'room']);
  assert.equal(events[0].expiresInMs, 5000);
  assert.equal(c.presence.get('bob').state, 'offline');
  assert.equal(events[2].signal.reason, 'timeout');
  assert.equal((await c.leaveRoom('r:live')).room_id, 'r:live');
  c.close();
});

test('pullMembers: PULL_MEMBERS with the page fields, answered by MEMBER_LIST_BATCH', async () => {
  const server = fakeServer(standardHandlers([], {
    extra: {
      PULL_MEMBERS: (body, h, s, ws) => reply(ws, 'MEMBER_LIST_BATCH', { members: [{ user_id: 'alice', role: 'OWNER' }, { user_id: 'bob', role: 'MEMBER' }].slice(body.offset, body.offset + body.limit), next_offset: body.offset + body.limit, has_more: body.offset + body.limit < 2 }, h.requestId),
    },
  }));
  const c = new QimClient({ url: 'ws://x', token: 't', deviceId: 'd1', WebSocket: server.WebSocket });
  await c.start();
  const all = await c.pullMembers('g:team');
  assert.deepEqual(all.members.map((m) => [m.user_id, m.role]), [['alice', 'OWNER'], ['bob', 'MEMBER']]);
  assert.equal(all.has_more, false);
  const sent = server.received.find((f) => f.name === 'PULL_MEMBERS').body;
  assert.deepEqual([sent.conversation_id, sent.filter, sent.offset, sent.limit], ['g:team', 'all', 0, 200]);
  const page = await c.pullMembers('g:team', { offset: 0, limit: 1 });
  assert.deepEqual([page.members.map((m) => m.user_id), page.has_more, page.next_offset], [['alice'], true, 1]);
  c.close();
});
