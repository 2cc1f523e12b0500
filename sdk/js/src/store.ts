/**
 * Where a device keeps its mailbox cursor between runs (§6.8): the signed token the server
 * returned and the highest mailbox_seq below which everything was applied. The browser uses
 * IndexedDB; node passes any object with these two methods (MemoryCursorStore for tests).
 */
export interface DeviceCursor {
  token: Uint8Array;
  lastAppliedMailboxSeq: number | bigint;
}

export interface CursorStore {
  load(key: string): Promise<DeviceCursor | null>;
  save(key: string, cursor: DeviceCursor): Promise<void>;
}

export class MemoryCursorStore implements CursorStore {
  readonly rows = new Map<string, DeviceCursor>();
  async load(key: string): Promise<DeviceCursor | null> {
    return this.rows.get(key) ?? null;
  }
  async save(key: string, cursor: DeviceCursor): Promise<void> {
    this.rows.set(key, { token: cursor.token.slice(), lastAppliedMailboxSeq: cursor.lastAppliedMailboxSeq });
  }
}

/** IndexedDB store: one object store "cursors", keyed by tenant/user/device. */
export class IndexedDbCursorStore implements CursorStore {
  private db: Promise<IDBDatabase> | null = null;
  constructor(private readonly name = 'qim') {}

  private open(): Promise<IDBDatabase> {
    if (!this.db) {
      this.db = new Promise((resolve, reject) => {
        const req = indexedDB.open(this.name, 1);
        req.onupgradeneeded = () => req.result.createObjectStore('cursors');
        req.onsuccess = () => resolve(req.result);
        req.onerror = () => reject(req.error);
      });
    }
    return this.db;
  }

  private async tx<T>(mode: IDBTransactionMode, run: (s: IDBObjectStore) => IDBRequest<T>): Promise<T> {
    const db = await this.open();
    return new Promise((resolve, reject) => {
      const req = run(db.transaction('cursors', mode).objectStore('cursors'));
      req.onsuccess = () => resolve(req.result);
      req.onerror = () => reject(req.error);
    });
  }

  async load(key: string): Promise<DeviceCursor | null> {
    const row = (await this.tx('readonly', (s) => s.get(key))) as { token: Uint8Array; seq: string } | undefined;
    if (!row) return null;
    const big = BigInt(row.seq);
    return { token: row.token, lastAppliedMailboxSeq: big <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(big) : big };
  }

  async save(key: string, cursor: DeviceCursor): Promise<void> {
    await this.tx('readwrite', (s) => s.put({ token: cursor.token, seq: String(cursor.lastAppliedMailboxSeq) }, key));
  }
}
