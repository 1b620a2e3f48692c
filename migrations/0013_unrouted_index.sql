-- outbox:no-transaction
-- Events kept for want of a subscriber (dead letters `no_subscribers`, queue = the topic) are counted by
-- every status, console and /metrics refresh: without this index that count reads all of dead_letters
-- (416 ms at a million dead letters here; 3.7 ms with it). Built CONCURRENTLY: dead-letter moves and
-- producers of such events never wait for it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS dead_letters_unrouted_idx ON {{schema}}.dead_letters (queue, dead_at)
  WHERE reason = 'no_subscribers';
