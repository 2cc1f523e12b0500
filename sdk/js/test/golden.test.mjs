// The TypeScript codec against the Python codec's golden vectors (tests/golden/frames.json).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { encodeFrame, decodeMessage, decodeHeader, ProtocolError } from '../dist/codec.js';
import { SCHEMA } from '../dist/schema.js';

// Integers of 16+ digits would lose precision as JSON numbers: read them as bigint.
const text = readFileSync(new URL('../../../tests/golden/frames.json', import.meta.url), 'utf8');
const golden = JSON.parse(text.replace(/(:\s*)(\d{16,})\b/g, '$1"$2n"'));
const hex = (b) => Buffer.from(b).toString('hex');
const fromHex = (h) => new Uint8Array(Buffer.from(h, 'hex'));

// JSON fields -> JS values the codec takes: bytes are base64 in the golden file.
function typed(type, v) {
  if (typeof type === 'object' && 'opt' in type) return typed(type.opt, v);
  if (typeof type === 'object' && 'list' in type) return v.map((x) => typed(type.list, x));
  if (typeof type === 'object' && 'map' in type) return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, typed(type.map, x)]));
  if (typeof type === 'object' && 'struct' in type) return typedStruct(type.struct, v);
  if (type === 'b' || type === 'u128') return new Uint8Array(Buffer.from(v, 'base64'));
  if ((type === 'u' || type === 'i') && typeof v === 'string') {
    const big = BigInt(v.slice(0, -1));
    return big <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(big) : big;
  }
  return v;
}
function typedStruct(name, obj) {
  const out = {};
  for (const [k, t] of SCHEMA.structs[name]) if (k in obj) out[k] = typed(t, obj[k]);
  return out;
}
const modelOf = (v) => v.model;

for (const v of golden.vectors) {
  test(`golden ${v.name}: encode equals the Python codec's bytes`, () => {
    const body = typedStruct(modelOf(v), bigints(v));
    const sender = v.receiver === 'server' ? 'client' : 'server';
    const out = encodeFrame(v.name, body, { requestId: v.request_id, streamId: v.stream_id, flags: v.flags, version: v.version, sender });
    assert.equal(hex(out), v.frame);
  });
  test(`golden ${v.name}: decode gives the fields and header`, () => {
    const f = decodeMessage(fromHex(v.frame), v.receiver);
    assert.equal(f.name, v.name);
    assert.equal(f.header.requestId, v.request_id);
    assert.equal(f.header.streamId, v.stream_id);
    assert.equal(f.header.flags, v.flags);
    const want = typedStruct(modelOf(v), bigints(v));
    assert.deepEqual(pick(norm(f.body), norm(want)), norm(want));
  });
}

const bigints = (v) => v.fields;
function norm(x) {
  if (x instanceof Uint8Array) return hex(x);
  if (Array.isArray(x)) return x.map(norm);
  if (x && typeof x === 'object') return Object.fromEntries(Object.entries(x).filter(([, y]) => y !== undefined).map(([k, y]) => [k, norm(y)]));
  if (typeof x === 'bigint') return `${x}n`;
  return x;
}

test('a corrupted header CRC is refused', () => {
  const f = fromHex(golden.vectors[0].frame);
  f[5] ^= 1;
  assert.throws(() => decodeHeader(f), ProtocolError);
});

test('a message longer than its header says is refused', () => {
  const f = fromHex(golden.vectors[0].frame);
  const longer = new Uint8Array(f.length + 1);
  longer.set(f);
  assert.throws(() => decodeMessage(longer, 'server'), /length/);
});

test('an unknown body key is ignored and a u64 above 2**53 stays exact', () => {
  const f = encodeFrame('SYNC_COMPLETE', { sync_to_seq: 2n ** 60n + 1n });
  const d = decodeMessage(f, 'server');
  assert.equal(d.body.sync_to_seq, 2n ** 60n + 1n);
});

// The decoded value restricted to the keys the golden fields name (missing keys are defaults).
function pick(actual, want) {
  if (Array.isArray(want)) return want.map((w, i) => pick(actual?.[i], w));
  if (want && typeof want === 'object') return Object.fromEntries(Object.keys(want).map((k) => [k, pick(actual?.[k], want[k])]));
  return actual;
}
