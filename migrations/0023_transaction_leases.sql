-- Transaction-held leases (worker option leaseMode "transaction"): a batch's rows are locked by the
-- transaction that leased them and written nothing until their outcomes; one guard row per batch, committed
-- before its handlers run and deleted by that transaction's commit, records which rows it holds. A guard
-- whose transaction ended without deleting it (a crash, a killed connection) names a delivery that ran
-- without an outcome: the repair counts it on each row (deliveries_count), as a token lease counts it when
-- leased, so the crash-loop guard (maxDeliveries) holds in this mode too. A new small table: no lock on
-- messages.
CREATE TABLE {{schema}}.lease_guards (
  id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  ids        bigint[]    NOT NULL,
  -- The leasing transaction: pg_xact_status tells whether it is still in progress.
  xid        xid8        NOT NULL,
  worker     text        NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);
