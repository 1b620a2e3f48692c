/**
 * The worker's own writes may skip the WAL flush wait (`synchronous_commit = off`): a server crash can then
 * undo the last fraction of a second of leases and outcomes, which only delivers those messages again.
 *
 * The setting travels inside each write statement as a transaction-local `set_config`, never as a startup
 * parameter (a pooler such as PgBouncer refuses `options`) nor a session `SET` (behind a transaction pooler
 * that would stick to a server connection that producers then share, and their commits would stop waiting
 * for the flush). It is read at commit, which ends the statement's implicit transaction.
 */
export interface StatementSettings {
  /** Wait for the WAL flush at commit (the server's default); false adds the transaction-local setting. */
  synchronousCommit: boolean;
}

/**
 * A CTE named `settings` to list first in a statement's WITH, or "" when nothing is to be set. The caller
 * joins `settings` into the rows it writes: a volatile CTE is evaluated once, before the first row changes.
 */
export function settingsCte(settings: StatementSettings): string {
  return settings.synchronousCommit
    ? ""
    : "settings AS (SELECT set_config('synchronous_commit', 'off', true))";
}

/** `, settings` to add to a FROM / USING list when the CTE exists. */
export function settingsJoin(settings: StatementSettings): string {
  return settings.synchronousCommit ? "" : ", settings";
}

/** `WITH <settings>` (plus a comma when more CTEs follow), or "" / "WITH " as needed. */
export function withSettings(settings: StatementSettings, more: boolean): string {
  const cte = settingsCte(settings);
  if (cte === "") return more ? "WITH " : "";
  return more ? `WITH ${cte}, ` : `WITH ${cte} `;
}
