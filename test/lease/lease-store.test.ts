import { beforeAll } from "vitest";
import { createPgLeaseStore } from "../../src/lease/pg-store.js";
import { type LeaseStoreHarness, leaseStoreContract } from "../support/contracts/lease-store.js";
import { testDatabase } from "../support/database.js";
import { MemoryLeaseStore, MemoryTable } from "../support/memory-store.js";

const QUEUES = ["a", "b"];
const DEFAULTS = { leaseTtlMs: 30_000, workerId: "w", maxErrorLength: 4000 };

const db = testDatabase("lease");
beforeAll(() => db.migrate());

leaseStoreContract("postgres", (): LeaseStoreHarness => {
  const m = db.names.messages;
  let cleared = false;
  return {
    store(options = {}) {
      return createPgLeaseStore({
        ...DEFAULTS,
        ...options,
        pool: () => db.pool,
        names: db.names,
        queues: QUEUES,
        synchronousCommit: false,
        preparedStatements: true,
        queryTimeoutMs: 5000,
      });
    },
    async insert(queue, n, options = {}) {
      // Each test starts from an empty table: the contract counts rows.
      if (!cleared) await db.pool.query(`DELETE FROM ${m}`);
      cleared = true;
      const { rows } = await db.pool.query<{ id: string }>(
        `INSERT INTO ${m} (queue, payload, available_at, key)
         SELECT $1, CASE WHEN $5::int IS NULL THEN '{}' ELSE jsonb_build_object('p', repeat('x', $5)) END,
                now() + $3::double precision * interval '1 millisecond', $4 FROM generate_series(1, $2)
         RETURNING id::text`,
        [queue, n, options.delayMs ?? 0, options.key ?? null, options.padding ?? null],
      );
      return rows.map((r) => r.id);
    },
    async expireLeases() {
      await db.pool.query(
        `UPDATE ${m} SET lease_expires_at = now() - interval '1 second', acquired_at = now() - interval '2 seconds'
         WHERE acquired_token IS NOT NULL`,
      );
    },
    async makeDue() {
      await db.pool.query(`UPDATE ${m} SET available_at = now() WHERE available_at > now()`);
    },
    async row(id) {
      const { rows } = await db.pool.query(
        `SELECT acquired_token::text AS token, deliveries_count, attempts_count, failures_count, last_error,
                available_at <= now() AS due,
                (extract(epoch FROM lease_expires_at - now()) * 1000)::float8 AS lease_left_ms
         FROM ${m} WHERE id = $1`,
        [id],
      );
      const r = rows[0];
      if (r === undefined) return undefined;
      return {
        leased: r.token !== null,
        token: r.token,
        deliveries: r.deliveries_count,
        attempts: r.attempts_count,
        failures: r.failures_count,
        lastError: r.last_error,
        due: r.due,
        leaseLeftMs: r.lease_left_ms,
      };
    },
    async rowsOf(queue) {
      const { rows } = await db.pool.query(
        `SELECT payload, key, head, headers FROM ${m} WHERE queue = $1 ORDER BY id`,
        [queue],
      );
      return rows;
    },
    async deadLetter(id) {
      const { rows } = await db.pool.query(
        `SELECT reason, error, attempts_count AS attempts FROM ${db.names.deadLetters} WHERE id = $1`,
        [id],
      );
      return rows[0];
    },
  };
});

leaseStoreContract("memory", (): LeaseStoreHarness => {
  let clock = 1_000_000;
  const table = new MemoryTable(() => clock);
  return {
    store: (options = {}) => new MemoryLeaseStore(table, { ...DEFAULTS, ...options, queues: QUEUES }),
    async insert(queue, n, options = {}) {
      const payload = options.padding === undefined ? {} : { p: "x".repeat(options.padding) };
      return Array.from({ length: n }, () => table.insert(queue, payload, options));
    },
    async expireLeases() {
      for (const row of table.rows.values()) if (row.token !== null) row.leaseExpiresAt = clock - 1;
    },
    async makeDue() {
      clock += 24 * 3600_000;
    },
    async row(id) {
      const r = table.rows.get(id);
      if (r === undefined) return undefined;
      return {
        leased: r.token !== null,
        token: r.token,
        deliveries: r.deliveries,
        attempts: r.attempts,
        failures: r.failures,
        lastError: r.lastError,
        due: r.availableAt <= clock,
        leaseLeftMs: r.leaseExpiresAt === null ? null : r.leaseExpiresAt - clock,
      };
    },
    async rowsOf(queue) {
      return [...table.rows.values()]
        .filter((r) => r.queue === queue)
        .sort((x, y) => Number(x.id) - Number(y.id))
        .map((r) => ({ payload: JSON.parse(r.payload), key: r.key, head: r.head, headers: r.headers }));
    },
    async deadLetter(id) {
      const d = table.deadLetters.get(id);
      return d && { reason: d.reason, error: d.error, attempts: d.row.attempts };
    },
  };
});
