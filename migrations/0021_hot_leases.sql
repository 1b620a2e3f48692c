-- outbox:no-transaction
-- Leases as HOT updates: no index holds a column the lease writes (acquired_token, lease_expires_at, …), so
-- taking, renewing or clearing a lease writes one new row version on the same page and no index entry.
-- The ready rows' indexes no longer leave leased rows out: the fetch skips live leases on the heap (the rows
-- in flight, oldest first at the front of each queue's range) and takes expired ones in the same scan, so
-- the leased index goes too. Built CONCURRENTLY: producers never wait for them.
CREATE INDEX CONCURRENTLY IF NOT EXISTS messages_due_idx ON {{schema}}.messages (queue, available_at, id)
  WHERE head;
CREATE INDEX CONCURRENTLY IF NOT EXISTS messages_behind_idx ON {{schema}}.messages (queue, available_at, id)
  WHERE NOT head;
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.messages_head_ready_idx;
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.messages_waiting_idx;
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.messages_leased_idx;
-- A HOT update needs room for the new version on its page, and one fetch leases every row of a page at
-- once: a page filled to 40 % leaves room for a leased copy of each of its rows (a leased row is larger by
-- its token, times and holder: with ~100-byte payloads, every lease stays HOT up to a 64-character worker
-- id). Applies to pages filled from now on; takes no lock producers wait for.
ALTER TABLE {{schema}}.messages SET (fillfactor = 40);
