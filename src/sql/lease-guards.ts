import { defineQuery, type Query } from "./executor.js";
import type { OutboxNames } from "./names.js";

/**
 * The SET list that leaves a row whose delivery ended without an outcome as one held through a crash: an
 * expired lease in the worker's name (a row another worker leased meanwhile keeps its lease), so that it is
 * leased alone next (aloneStatement), as a token lease that ran out is. `worker` names the crashed holder.
 */
export function suspectSet(worker: string): string {
  return `acquired_token = COALESCE(t.acquired_token, gen_random_uuid()),
  acquired_at = COALESCE(t.acquired_at, now()),
  lease_expires_at = CASE WHEN t.acquired_token IS NULL THEN now() ELSE t.lease_expires_at END,
  acquired_by = CASE WHEN t.acquired_token IS NULL THEN ${worker} ELSE t.acquired_by END`;
}

export interface GuardRepairRow {
  /** Deliveries counted on rows that are still there. */
  counted: number;
  /** Guards done with (deleted). */
  cleared: number;
}

/**
 * The crash-loop guard of transaction-held batches (migration 0023): every guard whose leasing transaction
 * is no longer in progress (it rolled back: a crash, a killed connection, a stop that gave up; NULL when
 * too old to tell) names deliveries that ran without an outcome. Each of its rows still there gets one
 * delivery counted, as a token lease counts it when leased, so a message that crashes its worker every
 * time reaches maxDeliveries and is dead-lettered.
 *
 * A row another transaction locks right now (leased again already) is skipped and its id kept in the
 * guard: counted by a later repair, never waited for (that batch's handlers may run for long). Guards are
 * taken SKIP LOCKED, so two workers' repairs never count a guard twice.
 */
export function repairGuardsStatement(names: OutboxNames): Query<{ limit: number }, GuardRepairRow> {
  const g = `${names.quotedSchema}.lease_guards`;
  const m = names.messages;
  return defineQuery(
    "repair_lease_guards",
    `WITH ended AS (
  SELECT id, ids, worker, alone FROM ${g}
  WHERE pg_xact_status(xid) IS DISTINCT FROM 'in progress'
  ORDER BY id LIMIT $1
  FOR UPDATE SKIP LOCKED
), named AS (
  -- Which row of a crashed batch of several crashed it is unknown: each is charged that crash once, however
  -- many such batches held it before a repair marked it (a batch leasing it in between is no fault of its),
  -- and left to run alone (suspectSet), where each crash is its own and is charged.
  SELECT u.id, ((bool_or(NOT e.alone))::int + count(*) FILTER (WHERE e.alone))::int AS n, min(e.worker) AS worker
  FROM ended AS e CROSS JOIN LATERAL unnest(e.ids) AS u(id) GROUP BY u.id
), free AS (
  SELECT t.id FROM ${m} AS t WHERE t.id IN (SELECT id FROM named) FOR UPDATE SKIP LOCKED
), counted AS (
  UPDATE ${m} AS t SET deliveries_count = LEAST(t.deliveries_count::bigint + n.n, 2147483647)::int,
  ${suspectSet("n.worker")}
  FROM free AS f JOIN named AS n ON n.id = f.id
  WHERE t.id = f.id
  RETURNING t.id
), busy AS (
  SELECT COALESCE(array_agg(n.id), '{}') AS ids FROM named AS n
  WHERE n.id NOT IN (SELECT id FROM free) AND EXISTS (SELECT 1 FROM ${m} AS t WHERE t.id = n.id)
), kept AS (
  UPDATE ${g} AS k SET ids = ARRAY(SELECT x FROM unnest(k.ids) AS x WHERE x = ANY (b.ids))
  FROM ended AS e, busy AS b
  WHERE k.id = e.id AND k.ids && b.ids
  RETURNING k.id
), gone AS (
  DELETE FROM ${g} AS k USING ended AS e, busy AS b
  WHERE k.id = e.id AND NOT (k.ids && b.ids)
  RETURNING k.id
)
SELECT (SELECT count(*) FROM counted)::int AS counted, (SELECT count(*) FROM gone)::int AS cleared`,
    (p) => [p.limit],
  );
}

/** → the guards among `ids` still there. */
export function guardsLeftStatement(names: OutboxNames): Query<{ ids: string }, { id: string }> {
  return defineQuery(
    "lease_guards_left",
    `SELECT id::text AS id FROM ${names.quotedSchema}.lease_guards WHERE id = ANY ($1::bigint[])`,
    (p) => [p.ids],
  );
}
