// The qim browser chat client: plain ES modules over the TypeScript SDK (/sdk/index.js).
import { QimClient, IndexedDbCursorStore } from '/sdk/index.js';

const $ = (id) => document.getElementById(id);
const enc = new TextEncoder();
const dec = new TextDecoder();
const text = (bytes) => (bytes && bytes.length ? dec.decode(bytes) : '');
const COLORS = ['#3b6ef5', '#e0527e', '#0ea5a4', '#f59e0b', '#8b5cf6', '#10b981', '#ef6c3a'];
const colorOf = (s) => COLORS[[...s].reduce((h, c) => (h * 31 + c.charCodeAt(0)) >>> 0, 7) % COLORS.length];
const hhmm = (ms) => (ms ? new Date(Number(ms)).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' }) : '');
const idTime = (id) => {
  // last_activity_id: the top 48 bits are ms since 2020-01-01 (docs/protocol.md)
  if (!id || id.every((b) => b === 0)) return 0;
  let ms = 0;
  for (let i = 0; i < 6; i++) ms = ms * 256 + id[i];
  return ms + 1577836800000;
};
const title = (conv) => (conv.startsWith('g:') ? `# ${conv.slice(2)}` : conv.startsWith('d:') ? 'Direct chat' : conv);

const MESSAGE_TYPE_CONTROL = 0xff; // recall / edit / membership records: not bubbles
// One TYPING per 3 s while the user types: above the server's typing_merge_window (2 s), which
// would merge anything faster, and below typing_ttl (5 s), so the peer's indicator stays up.
const TYPING_EVERY_MS = 3000;
const PRESENCE_MAX_TARGETS = 200; // presence_sub_max_targets: more is refused, never truncated

const state = {
  client: null, me: null, open: null,
  messages: new Map(), // conversation_id -> Map(conversation_seq -> message)
  editing: null,
  members: new Map(), // conversation_id -> the other members' user ids (PULL_MEMBERS; a d: row's peer)
  typing: new Map(), // conversation_id -> Map(user_id -> indicator expiry, epoch ms)
  typingSent: { conv: null, at: 0 },
  presenceSet: null, // the user ids this connection watches (null: none yet on this connection)
  presenceQueue: Promise.resolve(),
};
window.qim = state; // for the browser tests and the curious
window.qimApp = { openConversation: (c) => openConversation(c), newGroup: (g, m) => newGroup(g, m) };

function avatar(el, name) {
  el.textContent = name.slice(0, 1);
  el.style.background = colorOf(name);
}

async function login(user, device) {
  const cfg = await (await fetch('/dev/config')).json();
  const getToken = async () => {
    const res = await fetch('/dev/token', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ user_id: user, device_id: device }) });
    const body = await res.json();
    if (!res.ok) throw new Error(body.detail || body.error);
    return body.access_token;
  };
  await getToken(); // fail fast on a bad user id, before showing the chat
  const store = new IndexedDbCursorStore('qim');
  const client = new QimClient({ url: cfg.gateway_url, token: getToken, deviceId: device, store, cursorKey: `${cfg.tenant_id}/${user}/${device}` });
  state.client = client;
  state.me = user;
  state.authCursorSeq = Number((await store.load(`${cfg.tenant_id}/${user}/${device}`))?.lastAppliedMailboxSeq ?? 0);
  localStorage.setItem('qim.login', JSON.stringify({ user, device }));
  $('login').hidden = true;
  $('chat').hidden = false;
  $('me-name').textContent = user;
  avatar($('me-avatar'), user);
  client.on(onEvent);
  await client.start();
  await client.loadSessionList();
  renderSessions();
  document.body.dataset.ready = '1';
  void learnPeers();
}

function onEvent(e) {
  if (e.type === 'state') {
    $('conn-state').textContent = e.state;
    $('conn-dot').className = `dot ${e.state}`;
    if (e.state === 'online' && state.client.sessions.rows.size) void state.client.loadSessionList().then(renderSessions);
    // presence subscriptions are soft state of one connection: a new one starts with none
    if (e.state !== 'online') state.presenceSet = null;
    else syncPresence();
  } else if (e.type === 'entries') onEntries(e.entries);
  else if (e.type === 'typing') onTyping(e);
  else if (e.type === 'error') console.warn(`qim: ${e.error.message}`);
  else if (e.type === 'presence') renderPresence();
  else if (e.type === 'sessions' || e.type === 'badge' || e.type === 'read_sync') {
    renderSessions();
    if (e.type === 'sessions' && state.open && e.conversationIds.includes(state.open)) autoRead();
    if (e.type === 'sessions') void learnPeers();
  }
}

// --- presence (PRESENCE_SUB): the peers of the one-to-one rows and the open conversation's members

const isOnline = (user) => state.client.presence.get(user)?.state === 'online';
const peerOf = (conv) => (conv?.startsWith('d:') ? state.members.get(conv)?.[0] ?? null : null);

async function membersOf(conv, fresh = false) {
  if (!fresh && state.members.has(conv)) return state.members.get(conv);
  if (conv.startsWith('d:')) return directPeer(conv);
  const page = await state.client.pullMembers(conv, { limit: PRESENCE_MAX_TARGETS });
  const others = page.members.map((m) => m.user_id).filter((u) => u !== state.me);
  state.members.set(conv, others);
  return others;
}

/** A one-to-one id is a one-way hash of the pair and PULL_MEMBERS is for groups: the peer is
 * whoever else wrote in it (none yet: unknown, asked again when the row changes). */
async function directPeer(conv) {
  const batch = await state.client.pullHistory(conv, { direction: 'older', limit: 50 });
  const peer = batch.messages.map((m) => m.sender_id).find((u) => u && u !== state.me);
  if (peer) state.members.set(conv, [peer]);
  return peer ? [peer] : [];
}

let learning = null; // one pass at a time; a call during it asks for one more pass
async function learnPeers() {
  if (learning) { learning.again = true; return; }
  learning = { again: true };
  try {
    while (learning.again) {
      learning.again = false;
      for (const conv of [...state.client.sessions.rows.keys()]) {
        if (!conv.startsWith('d:') || state.members.has(conv)) continue;
        try { await directPeer(conv); } catch (e) { console.warn('peer', e); }
      }
    }
  } finally {
    learning = null;
  }
  renderSessions();
  syncPresence();
}

/** Watch exactly the users shown (one `replace`, in order), when that set changed. */
function syncPresence() {
  state.presenceQueue = state.presenceQueue.then(async () => {
    if (state.client.state !== 'online') return;
    const want = new Set(state.members.get(state.open) ?? []);
    for (const conv of state.client.sessions.rows.keys()) if (peerOf(conv)) want.add(peerOf(conv));
    const users = [...want].sort().slice(0, PRESENCE_MAX_TARGETS);
    if (state.presenceSet === users.join('\n') || (state.presenceSet === null && !users.length)) return;
    await state.client.subscribePresence({ userIds: users }, 'replace');
    state.presenceSet = users.join('\n');
    renderPresence();
  }).catch((e) => console.warn('presence', e));
}

function renderPresence() {
  renderSessions();
  renderHeader();
}

function lastSeen(user) {
  if (isOnline(user)) return 'online';
  const at = Number(state.client.presence.get(user)?.last_active_at ?? 0);
  return at ? `last seen ${hhmm(at)}` : 'offline';
}

function renderHeader() {
  const conv = state.open;
  if (!conv) return;
  const others = state.members.get(conv);
  const peer = peerOf(conv);
  $('conv-title').textContent = peer ?? title(conv);
  $('conv-dot').hidden = !peer;
  if (peer) $('conv-dot').className = `dot ${isOnline(peer) ? 'online' : 'offline'}`;
  const chips = [];
  if (peer) $('conv-sub').textContent = lastSeen(peer);
  else if (others) {
    $('conv-sub').textContent = `${others.length + 1} members · ${others.filter(isOnline).length + 1} online`;
    for (const user of [...others].sort((a, b) => isOnline(b) - isOnline(a) || a.localeCompare(b)).slice(0, 12)) {
      const chip = document.createElement('span');
      chip.className = 'member';
      chip.dataset.user = user;
      chip.dataset.presence = isOnline(user) ? 'online' : 'offline';
      chip.title = `${user}: ${lastSeen(user)}`;
      const dot = document.createElement('span');
      dot.className = `dot ${chip.dataset.presence}`;
      chip.append(dot, user);
      chips.push(chip);
    }
  } else $('conv-sub').textContent = conv;
  $('conv-members').replaceChildren(...chips);
}

// --- typing (TYPING): shown until its expires_in_ms runs out; there is no stop frame

function onTyping(e) {
  if (e.userId === state.me) return;
  const users = state.typing.get(e.conversationId) ?? new Map();
  users.set(e.userId, Date.now() + e.expiresInMs);
  state.typing.set(e.conversationId, users);
  setTimeout(renderTyping, e.expiresInMs + 20);
  renderTyping();
}

function typers(conv) {
  const users = state.typing.get(conv);
  if (!users) return [];
  const now = Date.now();
  for (const [u, until] of users) if (until <= now) users.delete(u);
  return [...users.keys()].sort();
}

function typingText(users) {
  if (users.length === 1) return `${users[0]} is typing…`;
  if (users.length === 2) return `${users[0]} and ${users[1]} are typing…`;
  return `${users.length} people are typing…`;
}

function renderTyping() {
  const users = state.open ? typers(state.open) : [];
  $('typing').hidden = users.length === 0;
  $('typing').dataset.users = users.join(',');
  $('typing-text').textContent = users.length ? typingText(users) : '';
  renderSessions();
}

function stopTyping(conv, user) {
  if (state.typing.get(conv)?.delete(user)) renderTyping();
}

function onEntries(entries) {
  const reload = new Set();
  for (const e of entries) {
    const conv = e.conversation_id;
    const msgs = state.messages.get(conv);
    if (!msgs) continue; // not loaded yet: the history pull will bring it
    if ((e.event_type === 0 || e.event_type === 1) && e.body_included && e.message_type !== MESSAGE_TYPE_CONTROL) {
      stopTyping(conv, e.sender_id); // their message is what they were typing
      if (!msgs.has(e.conversation_seq)) {
        msgs.set(e.conversation_seq, { seq: e.conversation_seq, sender: e.sender_id, text: text(e.payload_or_ciphertext), state: 'NORMAL', edited: false, at: e.created_at });
      }
    } else if (e.event_type === 3 && e.target_conversation_seq) reload.add(conv);
  }
  for (const conv of reload) void loadHistory(conv);
  if (state.open) renderMessages();
}

function sessionRow(row) {
  const li = document.createElement('li');
  li.className = 'session' + (row.conversation_id === state.open ? ' active' : '') + (row.muted ? ' muted-row' : '');
  li.dataset.conv = row.conversation_id;
  const av = document.createElement('div');
  av.className = 'avatar';
  const peer = peerOf(row.conversation_id);
  avatar(av, peer ?? row.conversation_id.replace(/^[gd]:/, ''));
  if (peer) {
    li.dataset.peer = peer;
    const dot = document.createElement('span');
    dot.className = `presence dot ${isOnline(peer) ? 'online' : 'offline'}`;
    dot.title = lastSeen(peer);
    av.append(dot);
  }
  const main = document.createElement('div');
  main.className = 'session-main';
  main.innerHTML = '<div class="session-top"><span class="session-name"></span><span class="session-time"></span></div><div class="session-bottom"><span class="session-preview"></span></div>';
  main.querySelector('.session-name').textContent = peer ?? title(row.conversation_id);
  main.querySelector('.session-time').textContent = hhmm(idTime(row.last_activity_id));
  const typing = typers(row.conversation_id);
  const preview = main.querySelector('.session-preview');
  preview.textContent = typing.length ? typingText(typing) : text(row.preview_or_placeholder) || ' ';
  preview.classList.toggle('typing-preview', typing.length > 0);
  if (row.unread_count > 0) {
    const b = document.createElement('span');
    b.className = 'badge';
    b.textContent = row.unread_count > 99 ? '99+' : String(row.unread_count);
    main.querySelector('.session-bottom').append(b);
  }
  li.append(av, main);
  li.onclick = () => void openConversation(row.conversation_id);
  return li;
}

function renderSessions() {
  const rows = state.client.sessions.ordered();
  $('sessions').replaceChildren(...rows.map(sessionRow));
  $('no-sessions').hidden = rows.length > 0;
  const total = rows.reduce((n, r) => n + (r.muted ? 0 : r.unread_count), 0);
  $('total-unread').hidden = total === 0;
  $('total-unread').textContent = String(total);
  document.title = total ? `(${total}) qim chat` : 'qim chat';
}

async function loadHistory(conv) {
  const batch = await state.client.pullHistory(conv, { direction: 'older', limit: 50 });
  const msgs = state.messages.get(conv) ?? new Map();
  for (const m of batch.messages) {
    if (m.message_type === MESSAGE_TYPE_CONTROL) continue;
    msgs.set(m.conversation_seq, {
      seq: m.conversation_seq, sender: m.sender_id, text: text(m.payload_or_ciphertext), state: m.state || 'NORMAL',
      edited: !!(m.edited_at_activity_id && m.edited_at_activity_id.some((b) => b)), at: m.created_at,
    });
  }
  state.messages.set(conv, msgs);
  if (state.open === conv) renderMessages();
}

async function openConversation(conv) {
  state.open = conv;
  state.editing = null;
  $('composer').hidden = false;
  renderHeader();
  renderTyping();
  renderMessages();
  void membersOf(conv, true).then(() => {
    renderHeader();
    syncPresence();
  }, (e) => console.warn('members', e));
  await loadHistory(conv);
  autoRead();
  $('input').focus();
}

function autoRead() {
  const row = state.client.sessions.rows.get(state.open);
  if (row && row.unread_count > 0 && document.visibilityState !== 'hidden') {
    state.client.markRead(state.open, row.latest_conversation_seq);
  }
}

function renderMessages() {
  const msgs = [...(state.messages.get(state.open)?.values() ?? [])].sort((a, b) => a.seq - b.seq);
  const box = $('messages');
  const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  let prevSender = null;
  box.replaceChildren(...msgs.map((m) => {
    const mine = m.sender === state.me;
    const div = document.createElement('div');
    div.className = 'msg' + (mine ? ' mine' : '') + (m.state === 'RECALLED' ? ' recalled' : '');
    div.dataset.seq = String(m.seq);
    if (!mine && m.sender !== prevSender) {
      const s = document.createElement('div');
      s.className = 'sender';
      s.textContent = m.sender;
      div.append(s);
    }
    prevSender = m.sender;
    const bubble = document.createElement('div');
    bubble.className = 'bubble';
    bubble.textContent = m.state === 'RECALLED' ? 'This message was recalled' : m.text;
    const meta = document.createElement('div');
    meta.className = 'meta';
    meta.append(hhmm(m.at) + (m.edited && m.state !== 'RECALLED' ? ' · edited' : ''));
    if (mine && m.state !== 'RECALLED') {
      for (const [label, fn] of [['Edit', () => startEdit(m)], ['Recall', () => recall(m)]]) {
        const b = document.createElement('button');
        b.type = 'button'; b.className = 'ghost'; b.textContent = label; b.dataset.action = label.toLowerCase();
        b.onclick = fn;
        meta.append(b);
      }
    }
    div.append(bubble, meta);
    return div;
  }));
  if (atBottom || msgs.length < 30) box.scrollTop = box.scrollHeight;
}

function startEdit(m) {
  state.editing = m;
  $('editing').hidden = false;
  $('input').value = m.text;
  $('input').focus();
}

async function recall(m) {
  try {
    await state.client.recall(state.open, m.seq);
    await loadHistory(state.open);
  } catch (e) {
    alert(`Recall failed: ${e.message}`);
  }
}

async function newGroup(groupId, members) {
  await state.client.createGroup(groupId, members);
  await state.client.loadSessionList();
  renderSessions();
  await openConversation(groupId);
}

$('new-group').onclick = async () => {
  const name = prompt('Group name (letters, digits, - and _)');
  if (!name) return;
  const members = (prompt('Members (comma separated user ids)') || '').split(',').map((s) => s.trim()).filter(Boolean);
  try {
    await newGroup(`g:${name}`, members);
  } catch (e) {
    alert(`Could not create the group: ${e.message}`);
  }
};

$('cancel-edit').onclick = () => { state.editing = null; $('editing').hidden = true; $('input').value = ''; };

$('composer').onsubmit = async (ev) => {
  ev.preventDefault();
  const value = $('input').value.trim();
  if (!value || !state.open) return;
  const conv = state.open;
  $('input').value = '';
  state.typingSent = { conv: null, at: 0 }; // the next message's first keystroke says so at once
  try {
    if (state.editing) {
      const target = state.editing;
      state.editing = null;
      $('editing').hidden = true;
      await state.client.edit(conv, target.seq, enc.encode(value));
      await loadHistory(conv);
    } else {
      const ack = await state.client.sendMessage(conv, enc.encode(value));
      const msgs = state.messages.get(conv);
      if (msgs && !msgs.has(ack.conversation_seq)) msgs.set(ack.conversation_seq, { seq: ack.conversation_seq, sender: state.me, text: value, state: 'NORMAL', edited: false, at: Date.now() });
      renderMessages();
    }
  } catch (e) {
    alert(`Send failed: ${e.message}`);
  }
};

$('input').onkeydown = (ev) => {
  if (ev.key === 'Enter' && !ev.shiftKey) {
    ev.preventDefault();
    $('composer').requestSubmit();
  }
};

$('input').addEventListener('input', () => {
  const conv = state.open;
  if (!conv || state.editing || !$('input').value.trim() || state.client?.state !== 'online') return;
  const now = Date.now();
  if (state.typingSent.conv === conv && now - state.typingSent.at < TYPING_EVERY_MS) return;
  state.typingSent = { conv, at: now };
  state.client.typing(conv);
});

$('login-form').onsubmit = async (ev) => {
  ev.preventDefault();
  try {
    await login($('login-user').value.trim(), $('login-device').value.trim());
  } catch (e) {
    $('login-error').hidden = false;
    $('login-error').textContent = e.message;
    $('login').hidden = false;
    $('chat').hidden = true;
  }
};

$('logout').onclick = () => {
  state.client?.close();
  localStorage.removeItem('qim.login');
  location.reload();
};

document.addEventListener('visibilitychange', () => state.open && autoRead());

const saved = JSON.parse(localStorage.getItem('qim.login') || 'null');
if (saved) void login(saved.user, saved.device).catch(() => { $('login').hidden = false; $('chat').hidden = true; });
else {
  $('login').hidden = false;
  void fetch('/dev/config').then((r) => r.json()).then((c) => ($('tenant').textContent = c.tenant_id));
}
