import pg from "pg";

/** A pool that counts the lease statements (the worker's fetch) sent through it. */
export class CountingPool extends pg.Pool {
  leases = 0;
  // biome-ignore lint/suspicious/noExplicitAny: pg's query has many overloads; this only looks at the text.
  override query(config: any, ...rest: any[]): any {
    if (typeof config === "object" && /FOR UPDATE SKIP LOCKED/.test(String(config?.text))) this.leases++;
    return (super.query as (...args: unknown[]) => unknown)(config, ...rest);
  }
}
