// Browser test of the chat client in headless Chromium against the real local stack.
// Env: QIM_WEB_URL (the dev web endpoint), QIM_SHOT_DIR (screenshots), CHROMIUM (executable),
// QIM_DIRECT_ID (alice and bob's one-to-one conversation id, derived by the server's rule).
// Prints one "ok <step>" line per checked step; exits 1 on the first failure.
import { chromium } from 'playwright-core';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const WEB = process.env.QIM_WEB_URL;
const SHOTS = process.env.QIM_SHOT_DIR ?? tmpdir();
const WAIT = 60000;
const DIRECT = process.env.QIM_DIRECT_ID;
const group = `g:team-${Date.now().toString(36)}`;
const step = (s) => console.log(`ok ${s}`);

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  // launch() gives Chromium a fresh temporary user-data-dir of its own and removes it on close.
});

async function open(user, device) {
  const ctx = await browser.newContext({ viewport: { width: 960, height: 620 } });
  const page = await ctx.newPage();
  page.on('pageerror', (e) => console.log(`pageerror ${user}/${device}: ${e.message}`));
  page.on('console', (m) => ['warning', 'error'].includes(m.type()) && console.log(`console ${user}/${device}: ${m.text()}`));
  await page.goto(WEB);
  await page.fill('#login-user', user);
  await page.fill('#login-device', device);
  await page.click('#login-form button[type=submit]');
  await page.waitForSelector('body[data-ready="1"]', { timeout: WAIT });
  return page;
}

const row = (page) => page.locator(`li.session[data-conv="${group}"]`);
const badge = (page) => row(page).locator('.badge');
const peerDot = (page, user, presence) => page.locator(`li.session[data-conv="${DIRECT}"][data-peer="${user}"] .presence.dot.${presence}`);
const sendDirect = (page, peer, text) => page.evaluate(([d, p, t]) => window.qim.client.sendMessage(d, new TextEncoder().encode(t), { peerUserId: p }), [DIRECT, peer, text]);
const member = (page, user, presence) => page.locator(`#conv-members .member[data-user="${user}"][data-presence="${presence}"]`);

async function expectBadge(page, n, what) {
  if (n === 0) await badge(page).waitFor({ state: 'detached', timeout: WAIT });
  else await page.waitForFunction(([g, want]) => document.querySelector(`li.session[data-conv="${g}"] .badge`)?.textContent === want, [group, String(n)], { timeout: WAIT });
  step(what);
}

async function send(page, text) {
  await page.fill('#input', text);
  await page.press('#input', 'Enter');
  await page.locator('#messages .msg.mine .bubble', { hasText: text }).waitFor({ timeout: WAIT });
}

async function seqs(page) {
  return page.$$eval('#messages .msg', (els) => els.map((e) => Number(e.dataset.seq)));
}

try {
  const alice = await open('alice', 'laptop');
  const bob = await open('bob', 'laptop');
  const bobPhone = await open('bob', 'phone');
  step('three windows logged in through /dev/token');

  await alice.evaluate(([g]) => window.qimApp.newGroup(g, ['bob']), [group]);
  await alice.locator('#composer').waitFor({ timeout: WAIT });
  step('alice created the group');

  await send(alice, 'Hi Bob! Did the deploy go out?');
  await row(alice).waitFor({ timeout: WAIT }); // the first message makes the session row
  await expectBadge(bob, 1, 'bob laptop shows 1 unread');
  await expectBadge(bobPhone, 1, 'bob phone shows 1 unread');
  await send(alice, 'The new dashboard looks great!');
  await expectBadge(bob, 2, 'bob laptop shows 2 unread');
  await expectBadge(bobPhone, 2, 'bob phone shows 2 unread');

  await row(bob).click();
  await bob.locator('#messages .msg .bubble', { hasText: 'dashboard' }).waitFor({ timeout: WAIT });
  await expectBadge(bob, 0, 'reading on bob laptop clears its badge');
  await expectBadge(bobPhone, 0, 'READ_SYNC clears the badge on bob phone');

  await send(bob, 'Yes, shipped 10 minutes ago. Thanks!');
  await alice.locator('#messages .msg:not(.mine) .bubble', { hasText: 'shipped' }).waitFor({ timeout: WAIT });
  step('alice sees bob\'s reply live');

  // presence: bob has two pages open, so alice's header shows him online
  await member(alice, 'bob', 'online').waitFor({ timeout: WAIT });
  step('alice sees bob online');
  // one-to-one: each side's row shows the peer (who wrote in it) with the peer's presence dot
  await sendDirect(alice, 'bob', 'Lunch at 12:30?');
  await peerDot(bob, 'alice', 'online').waitFor({ timeout: WAIT });
  await sendDirect(bob, 'alice', 'Sure!');
  await peerDot(alice, 'bob', 'online').waitFor({ timeout: WAIT });
  step('the one-to-one rows show the peer online');

  // edit and recall, seen by the other side
  const first = alice.locator('#messages .msg.mine', { hasText: 'deploy' });
  await first.hover();
  await first.locator('button[data-action=edit]').click();
  await alice.fill('#input', 'Hi Bob! Did the release go out?');
  await alice.press('#input', 'Enter');
  await bob.locator('#messages .msg .bubble', { hasText: 'release go out' }).waitFor({ timeout: WAIT });
  step('bob sees alice\'s edit');
  const second = alice.locator('#messages .msg.mine', { hasText: 'dashboard' });
  await second.hover();
  await second.locator('button[data-action=recall]').click();
  await bob.locator('#messages .msg.recalled').waitFor({ timeout: WAIT });
  step('bob sees alice\'s recall');
  await send(alice, 'Let\'s celebrate on Friday');
  await bob.locator('#messages .bubble', { hasText: 'celebrate' }).waitFor({ timeout: WAIT });

  // typing: bob types without sending; alice's open conversation shows it, and only until the
  // TYPING frame's expires_in_ms runs out (there is no stop frame). Bob types for about 4 s, as
  // people do: the client says so every 3 s, so one of his frames falls outside the server's
  // 2 s typing_merge_window of any earlier one (a frame inside it is merged away).
  await bob.locator('#input').pressSequentially('Also, the new metrics page is live for everyone', { delay: 90 });
  await alice.locator('#typing', { hasText: 'bob is typing' }).waitFor({ timeout: WAIT });
  await row(alice).locator('.session-preview', { hasText: 'bob is typing' }).waitFor({ timeout: WAIT });
  step('alice sees "bob is typing" in the conversation and its row');
  await alice.screenshot({ path: join(SHOTS, 'alice-typing.png') });
  await bob.fill('#input', '');
  await alice.locator('#typing').waitFor({ state: 'hidden', timeout: WAIT });
  step('the typing indicator is gone once expires_in_ms ran out');

  await alice.screenshot({ path: join(SHOTS, 'alice.png') });
  await bob.screenshot({ path: join(SHOTS, 'bob.png') });
  step('screenshots written');

  // Reload: the session comes back from the persisted cursor, without duplicates.
  const before = await seqs(alice);
  await alice.reload();
  await alice.waitForSelector('body[data-ready="1"]', { timeout: WAIT });
  const cursorSeq = await alice.evaluate(() => window.qim.authCursorSeq);
  if (!(cursorSeq > 0)) throw new Error(`no persisted cursor after reload (${cursorSeq})`);
  step(`reload presented the persisted cursor (mailbox_seq ${cursorSeq})`);
  await row(alice).click();
  await alice.locator('#messages .msg .bubble', { hasText: 'celebrate' }).waitFor({ timeout: WAIT });
  await send(bob, 'See you there');
  await alice.locator('#messages .bubble', { hasText: 'See you there' }).waitFor({ timeout: WAIT });
  const after = await seqs(alice);
  if (new Set(after).size !== after.length) throw new Error(`duplicate messages after reload: ${after}`);
  const want = [...before, Math.max(...after)];
  if (JSON.stringify(after) !== JSON.stringify(want)) throw new Error(`after reload ${after}, want ${want}`);
  step(`after reload: ${after.length} messages, no duplicates`);
  await alice.screenshot({ path: join(SHOTS, 'alice-reloaded.png') });

  // presence after the reload (a new connection subscribes again), then bob closes both pages
  await member(alice, 'bob', 'online').waitFor({ timeout: WAIT });
  step('alice sees bob online again after her reload');
  await bob.context().close();
  await bobPhone.context().close();
  await member(alice, 'bob', 'offline').waitFor({ timeout: WAIT });
  await peerDot(alice, 'bob', 'offline').waitFor({ timeout: WAIT });
  step('alice sees bob offline once his pages closed');
  await alice.screenshot({ path: join(SHOTS, 'alice-bob-offline.png') });
  console.log('PASS');
} catch (e) {
  console.log(`FAIL ${e.stack ?? e}`);
  process.exitCode = 1;
} finally {
  await browser.close();
}
