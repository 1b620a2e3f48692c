import { deliveryKey, type KeyRow, type PromoteParams } from "../sql/complete.js";
import { plainArray } from "../sql/executor.js";
import { type Delivery, type Landed, landedByKey } from "./store.js";

/** What a keyed write may hand off: the promotion's parameters but the keys it finds itself. */
export type HandOff = Omit<PromoteParams, "queues" | "keys">;

/** A delivery's key in the statements' answers. */
export const key = (d: Delivery) => deliveryKey(d.id, d.token);

export const held = <W extends { held: Delivery }>(writes: readonly W[]) => writes.map((w) => w.held);

// Ids come back from the fetch as decimal text and tokens are our own UUIDs: both are safe unquoted.
export const pairs = (ds: readonly Delivery[]) => ({
  ids: plainArray(ds.map((d) => d.id)),
  tokens: plainArray(ds.map((d) => d.token)),
});

/** The deliveries a statement named in its answer landed; the others were lost. */
export const landed = (rows: KeyRow[]): Landed => landedByKey(new Set(rows.map((r) => r.key)), key);

/** Decimal ids in numeric order. */
function compareIds(a: string, b: string): number {
  return a.length - b.length || (a < b ? -1 : a > b ? 1 : 0);
}

/**
 * Writes in id order. Each statement locks its rows in the order of its arrays (the plan walks the unnest
 * and looks each id up), so the worker's statements all take rows in one order and never deadlock with
 * each other: a renewal racing a keyed ack of the same rows would otherwise wait for it in a cycle.
 */
export function byId<T extends { held: Delivery } | Delivery>(items: readonly T[]): T[] {
  const id = (t: T) => ("held" in t ? t.held.id : t.id);
  return [...items].sort((a, b) => compareIds(id(a), id(b)));
}
