/** Types of the generated frame table (schema.ts): one row per frame, one field list per struct. */
export type WireType =
  | 'u' | 'i' | 's' | 'b' | 'u128' | 'bool'
  | { opt: WireType }
  | { list: WireType }
  | { map: WireType }
  | { struct: string };

/** [wire name, type, default (null = the type's zero)] in the struct's encoding order. */
export type FieldSpec = [string, WireType, string | number | boolean | null];

export interface FrameRow {
  name: string;
  opcode: number;
  stream: number;
  up: string | null;
  down: string | null;
}

export interface SchemaTable {
  frames: FrameRow[];
  structs: Record<string, FieldSpec[]>;
}
