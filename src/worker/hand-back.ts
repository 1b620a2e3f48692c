import type { Logger } from "pino";
import { type HeldRow, lose, settle } from "../lease/held.js";
import type { LeaseStore } from "../lease/store.js";
import type { LeasePhase, WorkerEmitter } from "./events.js";
import type { HeldSet } from "./held-set.js";
import type { LoopHealth } from "./loop-health.js";

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

export interface HandBackDeps {
  store: Pick<LeaseStore, "release">;
  held: HeldSet;
  /** Another worker took the row over: drop the delivery. */
  forget(h: HeldRow, phase: LeasePhase): void;
  log: Logger;
  emitter: WorkerEmitter;
  health: LoopHealth;
}

/**
 * Hands unstarted rows back for another worker (a stop, or rows that arrived when there was no room), a
 * few tries each; and keeps count of the hand-backs still under way, for the stop to wait for.
 */
export class HandBack {
  readonly #deps: HandBackDeps;
  // Hand-backs of rows that arrived after the stop began: the stop waits for them before it returns.
  readonly #late = new Set<Promise<number>>();
  #lateReleased = 0;

  constructor(deps: HandBackDeps) {
    this.#deps = deps;
  }

  /** Hand `rows` back now → how many were. */
  async release(rows: HeldRow[]): Promise<number> {
    const { store, held, log, emitter, health } = this.#deps;
    if (rows.length === 0) return 0;
    for (let attempt = 1; ; attempt++) {
      try {
        const back = await store.release(rows);
        for (const h of rows) {
          // Not handed back: another worker took the row over while it waited here.
          if (!back.has(h)) {
            this.#deps.forget(h, "release");
            continue;
          }
          settle(h, "released");
          held.delete(h);
        }
        emitter.emit("released", { count: back.count });
        return back.count;
      } catch (error) {
        health.failed("release", error as Error, attempt);
        if (attempt >= 3) {
          // Unreleased rows are not lost: their leases expire and another worker takes them. This worker
          // holds them no more (nor renews them).
          for (const h of rows) {
            lose(h, new Error("could not hand back; its lease is left to expire"));
            held.delete(h);
          }
          log.warn(
            { rows: rows.length },
            "could not hand back unstarted rows; their leases are left to expire",
          );
          return 0;
        }
        await sleep(200 * attempt);
      }
    }
  }

  /** Hand back rows that arrived too late or too many, in the background; {@link lateReleased} waits. */
  late(rows: HeldRow[]): void {
    const back = this.release(rows).then((n) => {
      this.#lateReleased += n;
      return n;
    });
    this.#late.add(back);
    void back.finally(() => this.#late.delete(back));
  }

  /** Once the late hand-backs under way now ended → how many rows late hand-backs gave back in all. */
  lateReleased(): Promise<number> {
    return Promise.all(this.#late).then(() => this.#lateReleased);
  }
}
