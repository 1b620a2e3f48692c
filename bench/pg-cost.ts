/**
 * What a stretch of work cost Postgres, read from the server itself: WAL written (`pg_current_wal_insert_lsn`
 * before and after, split by resource manager and full-page images with pg_walinspect where it can be
 * created), row versions (updates, HOT updates, deletes, dead tuples left) and pages read of the tables
 * and indexes of one schema, and the index pages the WAL wrote.
 *
 * The statistics of a session reach the shared counters when it ends or within a second of its last
 * transaction: `stop()` waits until two reads a short while apart agree. WAL is server-wide: run on an idle
 * server.
 */
import pg from "pg";
import { DATABASE_URL, until } from "./lib.js";

/** The schema's counters; in a {@link PgCost}, row and page counts are those of the window. */
interface Counters {
  updates: number;
  hotUpdates: number;
  deletes: number;
  inserts: number;
  /** Dead row versions in the schema's tables at the end (not vacuumed yet). */
  deadTuples: number;
  /** Shared-buffer page reads (hits and misses) of the schema's tables and of their indexes. */
  heapPagesRead: number;
  indexPagesRead: number;
  /** Heap and index size of the schema's tables at the end, bytes. */
  tableBytes: number;
  indexBytes: number;
}

export interface PgCost extends Counters {
  walBytes: number;
  /** Full-page images within walBytes (the first change of each page after a checkpoint; -1: WAL recycled). */
  fpiBytes: number;
  /** WAL bytes by resource manager (Heap, Heap2, Btree, …), records and images; empty without pg_walinspect. */
  walByKind: Record<string, number>;
  /** Distinct index pages changed by the WAL of the schema's indexes (-1 without pg_walinspect). */
  indexPagesWritten: number;
}

async function counters(client: pg.Client, schema: string): Promise<Counters> {
  await client.query("SELECT pg_stat_clear_snapshot()");
  const { rows } = await client.query(
    `SELECT COALESCE(sum(s.n_tup_upd), 0)::float8 AS updates, COALESCE(sum(s.n_tup_hot_upd), 0)::float8 AS "hotUpdates",
            COALESCE(sum(s.n_tup_del), 0)::float8 AS deletes, COALESCE(sum(s.n_tup_ins), 0)::float8 AS inserts,
            COALESCE(sum(s.n_dead_tup), 0)::float8 AS "deadTuples",
            COALESCE(sum(io.heap_blks_hit + io.heap_blks_read), 0)::float8 AS "heapPagesRead",
            COALESCE(sum(COALESCE(io.idx_blks_hit, 0) + COALESCE(io.idx_blks_read, 0)), 0)::float8 AS "indexPagesRead",
            COALESCE(sum(pg_relation_size(s.relid)), 0)::float8 AS "tableBytes",
            COALESCE(sum(pg_indexes_size(s.relid)), 0)::float8 AS "indexBytes"
     FROM pg_stat_user_tables AS s JOIN pg_statio_user_tables AS io USING (relid)
     WHERE s.schemaname = $1`,
    [schema],
  );
  return rows[0] as Counters;
}

let walinspect: boolean | undefined;

/** Starts measuring the cost of what happens in `schema` from now (call after the fill and CHECKPOINT). */
export interface PgCostMeter {
  /** Ends the measured WAL window now (before stopping workers, whose exit writes are not the drain's). */
  endWal(): Promise<void>;
  /** Reads the rest (after the workers' sessions ended, so their statistics are in) and closes. */
  stop(): Promise<PgCost>;
}

export async function pgCostMeter(schema: string): Promise<PgCostMeter> {
  const client = new pg.Client({ connectionString: DATABASE_URL, application_name: "bench-cost" });
  await client.connect();
  if (walinspect === undefined) {
    walinspect = await client
      .query("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
      .then(() => true)
      .catch(() => false);
  }
  const c0 = await counters(client, schema);
  const lsn0 = (await client.query("SELECT pg_current_wal_insert_lsn()::text AS l")).rows[0].l as string;
  let lsn1: string | undefined;
  return {
    async endWal() {
      lsn1 ??= (await client.query("SELECT pg_current_wal_insert_lsn()::text AS l")).rows[0].l as string;
    },
    async stop() {
      lsn1 ??= (await client.query("SELECT pg_current_wal_insert_lsn()::text AS l")).rows[0].l as string;
      try {
        const walBytes = Number(
          (await client.query("SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn) AS d", [lsn1, lsn0])).rows[0].d,
        );
        // Settle the statistics: sessions flush theirs at exit or within a second of a transaction.
        let last = "";
        let c1 = c0;
        await until(
          async () => {
            c1 = await counters(client, schema);
            const now = JSON.stringify(c1);
            const settled = now === last;
            last = now;
            return settled;
          },
          15_000,
          700,
        );
        let fpiBytes = 0;
        let indexPagesWritten = -1;
        const walByKind: Record<string, number> = {};
        // The WAL of a long run may be recycled already (checkpoints remove old segments): then only the
        // LSN difference is known.
        if (walinspect) {
          try {
            const wal = await walBreakdown(client, schema, lsn0, lsn1);
            fpiBytes = wal.fpiBytes;
            indexPagesWritten = wal.indexPagesWritten;
            Object.assign(walByKind, wal.walByKind);
          } catch {
            fpiBytes = -1;
          }
        }
        return {
          walBytes,
          fpiBytes,
          walByKind,
          indexPagesWritten,
          updates: c1.updates - c0.updates,
          hotUpdates: c1.hotUpdates - c0.hotUpdates,
          deletes: c1.deletes - c0.deletes,
          inserts: c1.inserts - c0.inserts,
          deadTuples: c1.deadTuples,
          heapPagesRead: c1.heapPagesRead - c0.heapPagesRead,
          indexPagesRead: c1.indexPagesRead - c0.indexPagesRead,
          tableBytes: c1.tableBytes,
          indexBytes: c1.indexBytes,
        };
      } finally {
        await client.end();
      }
    },
  };
}

async function walBreakdown(
  client: pg.Client,
  schema: string,
  lsn0: string,
  lsn1: string,
): Promise<{ fpiBytes: number; indexPagesWritten: number; walByKind: Record<string, number> }> {
  // Asynchronous commits: pg_walinspect reads WAL already flushed only (the WAL writer flushes within
  // wal_writer_delay); a CHECKPOINT would add WAL of its own.
  await until(
    async () =>
      (await client.query("SELECT pg_current_wal_flush_lsn() >= $1::pg_lsn AS ok", [lsn1])).rows[0]
        .ok as boolean,
    10_000,
    50,
  );
  const walByKind: Record<string, number> = {};
  let fpiBytes = 0;
  const stats = await client.query(
    `SELECT "resource_manager/record_type" AS kind, combined_size::float8 AS bytes, fpi_size::float8 AS fpi
     FROM pg_get_wal_stats($1::pg_lsn, $2::pg_lsn) WHERE count > 0`,
    [lsn0, lsn1],
  );
  for (const r of stats.rows) {
    walByKind[r.kind] = r.bytes;
    fpiBytes += r.fpi;
  }
  const pages = await client.query(
    `SELECT count(DISTINCT (b[1], b[2]))::int AS n
     FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn) AS r
     CROSS JOIN LATERAL regexp_matches(r.block_ref, 'rel \\d+/\\d+/(\\d+)(?: fork \\w+)? blk (\\d+)', 'g') AS b
     WHERE r.resource_manager = 'Btree'
       AND b[1]::oid IN (SELECT c.relfilenode FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
                         WHERE n.nspname = $3 AND c.relkind = 'i')`,
    [lsn0, lsn1, schema],
  );
  return { fpiBytes, indexPagesWritten: pages.rows[0].n, walByKind };
}
