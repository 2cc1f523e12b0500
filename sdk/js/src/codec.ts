/**
 * The App. A frame codec: a 20-octet big-endian header (magic "QM", CRC32C of octets 0-15) and a
 * msgpack map body keyed by field name with defaults omitted, exactly as qim.schemas.frames
 * encodes it (tests/golden/frames.json pins both). One frame per WebSocket binary message.
 *
 * JS values: u64 is a number when it is a safe integer and a bigint above 2**53; u128 ids are
 * 16-octet big-endian Uint8Arrays (their byte order is their numeric order); bytes are
 * Uint8Arrays. Unknown body keys are ignored and missing keys take their zero (§27.1.2).
 */
import { decode, encode } from '@msgpack/msgpack';
import { crc32c } from './crc32c.js';
import { SCHEMA } from './schema.js';
import type { FieldSpec, FrameRow, WireType } from './schema_types.js';

export const MAGIC = 0x514d;
export const HEADER_LEN = 20;
export const PROTOCOL_VERSION = 1;
export const MAX_FRAME_BYTES = 4 * 1024 * 1024;
export const FLAG_FRAGMENTED = 0x02;
export const FLAG_COMPRESSED = 0x01;

export type Body = Record<string, unknown>;
export type Role = 'client' | 'server';

export interface FrameHeader {
  version: number;
  flags: number;
  opcode: number;
  requestId: number;
  streamId: number;
  bodyLen: number;
}

export interface Frame {
  name: string;
  header: FrameHeader;
  body: Body;
}

export class ProtocolError extends Error {}

const BY_NAME = new Map<string, FrameRow>(SCHEMA.frames.map((f) => [f.name, f]));
const BY_OPCODE = new Map<number, FrameRow>(SCHEMA.frames.map((f) => [f.opcode, f]));

export function frameRow(name: string): FrameRow {
  const row = BY_NAME.get(name);
  if (!row) throw new Error(`unknown frame ${name}`);
  return row;
}

function isZero(t: WireType, v: unknown, dflt: FieldSpec[2]): boolean {
  if (v === undefined || v === null) return true;
  if (typeof t === 'object' && 'opt' in t) return false;
  if (dflt !== null) return v === dflt;
  if (t === 'u' || t === 'i') return v === 0 || v === 0n;
  if (t === 's') return v === '';
  if (t === 'bool') return v === false;
  if (t === 'b') return (v as Uint8Array).length === 0;
  if (t === 'u128') return (v as Uint8Array).every((x) => x === 0);
  if (typeof t === 'object' && 'list' in t) return (v as unknown[]).length === 0;
  if (typeof t === 'object' && 'map' in t) return Object.keys(v as object).length === 0;
  return false;
}

function concat(parts: Uint8Array[]): Uint8Array {
  let n = 0;
  for (const p of parts) n += p.length;
  const out = new Uint8Array(n);
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}

function containerHeader(n: number, fix: number, c16: number, c32: number, forceWide = false): Uint8Array {
  if (n < 16 && !forceWide) return Uint8Array.of(fix | n);
  if (n < 0x10000) return Uint8Array.of(c16, n >> 8, n & 0xff);
  return Uint8Array.of(c32, n >>> 24, (n >>> 16) & 0xff, (n >>> 8) & 0xff, n & 0xff);
}

const MSGPACK = { useBigInt64: true } as const;

function scalar(v: unknown): Uint8Array {
  // @msgpack/msgpack writes integers above 32 bits as float64; msgspec (and the spec) write uint64.
  if (typeof v === 'number' && Number.isInteger(v) && (v > 0xffffffff || v < -0x80000000)) v = BigInt(v);
  if (typeof v === 'bigint' && v >= -0x80000000n && v <= 0xffffffffn) v = Number(v);
  return encode(v, MSGPACK);
}

function encodeValue(t: WireType, v: unknown): Uint8Array {
  if (typeof t === 'string') {
    if (t === 'u128' && (!(v instanceof Uint8Array) || v.length !== 16)) throw new Error('u128 needs 16 octets');
    if ((t === 'u' || t === 'i') && typeof v !== 'number' && typeof v !== 'bigint') throw new Error('integer expected');
    return scalar(v);
  }
  if ('opt' in t) return encodeValue(t.opt, v);
  if ('list' in t) {
    const items = v as unknown[];
    return concat([containerHeader(items.length, 0x90, 0xdc, 0xdd), ...items.map((x) => encodeValue(t.list, x))]);
  }
  if ('map' in t) {
    const entries = Object.entries(v as object);
    const parts = [containerHeader(entries.length, 0x80, 0xde, 0xdf)];
    for (const [k, x] of entries) parts.push(scalar(k), encodeValue(t.map, x));
    return concat(parts);
  }
  return encodeStruct(t.struct, v as Body);
}

/** msgspec sizes a struct's map header by its field count (fixmap below 16 fields, else map16). */
function encodeStruct(name: string, body: Body): Uint8Array {
  const fields = SCHEMA.structs[name];
  if (!fields) throw new Error(`unknown struct ${name}`);
  const parts: Uint8Array[] = [];
  let n = 0;
  for (const [key, t, dflt] of fields) {
    const v = body[key];
    if (isZero(t, v, dflt)) continue;
    parts.push(scalar(key), encodeValue(t, v));
    n++;
  }
  return concat([containerHeader(n, 0x80, 0xde, 0xdf, fields.length >= 16), ...parts]);
}

function zero(t: WireType, dflt: FieldSpec[2]): unknown {
  if (dflt !== null) return dflt;
  if (typeof t === 'object') {
    if ('opt' in t) return undefined;
    if ('list' in t) return [];
    if ('map' in t) return {};
    return undefined;
  }
  switch (t) {
    case 'u': case 'i': return 0;
    case 's': return '';
    case 'bool': return false;
    case 'b': return new Uint8Array(0);
    case 'u128': return new Uint8Array(16);
  }
}

function bad(what: string): never {
  throw new ProtocolError(`malformed body: ${what}`);
}

function fromWire(t: WireType, v: unknown): unknown {
  if (typeof t === 'string') {
    switch (t) {
      case 'u': case 'i': {
        if (typeof v === 'bigint') return v <= BigInt(Number.MAX_SAFE_INTEGER) && v >= -BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v;
        if (typeof v !== 'number' || !Number.isInteger(v)) bad('integer expected');
        if (t === 'u' && v < 0) bad('unsigned expected');
        return v;
      }
      case 's': if (typeof v !== 'string') bad('str expected'); return v;
      case 'bool': if (typeof v !== 'boolean') bad('bool expected'); return v;
      case 'b': if (!(v instanceof Uint8Array)) bad('bin expected'); return v;
      case 'u128': if (!(v instanceof Uint8Array) || v.length !== 16) bad('u128 expected'); return v;
    }
  }
  if ('opt' in t) return v === null ? undefined : fromWire(t.opt, v);
  if ('list' in t) {
    if (!Array.isArray(v)) bad('array expected');
    return v.map((x) => fromWire(t.list, x));
  }
  if ('map' in t) {
    if (typeof v !== 'object' || v === null) bad('map expected');
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) out[k] = fromWire(t.map, x);
    return out;
  }
  return structFromWire(t.struct, v);
}

function structFromWire(name: string, raw: unknown): Body {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw) || raw instanceof Uint8Array) bad(`${name} is not a map`);
  const src = raw as Record<string, unknown>;
  const out: Body = {};
  for (const [key, t, dflt] of SCHEMA.structs[name]!) {
    out[key] = key in src ? fromWire(t, src[key]) : zero(t, dflt);
  }
  return out;
}

/** The msgpack body of a frame as the given side sends it (defaults omitted). */
export function encodeBody(name: string, body: Body, sender: Role = 'client'): Uint8Array {
  const row = frameRow(name);
  const model = sender === 'client' ? row.up : row.down;
  if (!model) throw new Error(`${name} is not sent by the ${sender}`);
  return encodeStruct(model, body);
}

export interface EncodeOptions {
  requestId?: number;
  streamId?: number;
  flags?: number;
  version?: number;
  sender?: Role;
}

/** One whole frame: header (with CRC32C) + body. The stream defaults to the frame's A.5 stream. */
export function encodeFrame(name: string, body: Body, opts: EncodeOptions = {}): Uint8Array {
  const row = frameRow(name);
  const payload = encodeBody(name, body, opts.sender ?? 'client');
  if (payload.length > MAX_FRAME_BYTES) throw new Error('frame too large');
  const out = new Uint8Array(HEADER_LEN + payload.length);
  const dv = new DataView(out.buffer);
  dv.setUint16(0, MAGIC);
  dv.setUint8(2, opts.version ?? PROTOCOL_VERSION);
  dv.setUint8(3, opts.flags ?? 0);
  dv.setUint16(4, row.opcode);
  dv.setUint32(6, opts.requestId ?? 0);
  dv.setUint16(10, opts.streamId ?? row.stream);
  dv.setUint32(12, payload.length);
  dv.setUint32(16, crc32c(out.subarray(0, 16)));
  out.set(payload, HEADER_LEN);
  return out;
}

/** Header checks in the order of docs/protocol.md: magic, CRC, then body_len. */
export function decodeHeader(data: Uint8Array): FrameHeader {
  if (data.length < HEADER_LEN) throw new ProtocolError('truncated header');
  const dv = new DataView(data.buffer, data.byteOffset, HEADER_LEN);
  if (dv.getUint16(0) !== MAGIC) throw new ProtocolError('bad magic');
  if (dv.getUint32(16) !== crc32c(data.subarray(0, 16))) throw new ProtocolError('bad header crc');
  const bodyLen = dv.getUint32(12);
  if (bodyLen > MAX_FRAME_BYTES) throw new ProtocolError('frame too large');
  return {
    version: dv.getUint8(2),
    flags: dv.getUint8(3),
    opcode: dv.getUint16(4),
    requestId: dv.getUint32(6),
    streamId: dv.getUint16(10),
    bodyLen,
  };
}

/**
 * Decode one WebSocket message holding exactly one unfragmented frame, received by `receiver`.
 * An unknown opcode decodes as name "UNKNOWN" with an empty body (skipped, never fatal).
 */
export function decodeMessage(data: Uint8Array, receiver: Role = 'client'): Frame {
  const header = decodeHeader(data);
  if (data.length !== HEADER_LEN + header.bodyLen) throw new ProtocolError('message length differs from its header');
  if (header.flags & (FLAG_FRAGMENTED | FLAG_COMPRESSED)) throw new ProtocolError('unsupported flags');
  const row = BY_OPCODE.get(header.opcode);
  if (!row) return { name: 'UNKNOWN', header, body: {} };
  const model = receiver === 'client' ? row.down : row.up;
  if (!model) throw new ProtocolError(`${row.name} in the wrong direction`);
  let raw: unknown;
  try {
    raw = decode(data.subarray(HEADER_LEN), { useBigInt64: true });
  } catch (e) {
    throw new ProtocolError(`malformed body: ${(e as Error).message}`);
  }
  return { name: row.name, header, body: structFromWire(model, raw) };
}
