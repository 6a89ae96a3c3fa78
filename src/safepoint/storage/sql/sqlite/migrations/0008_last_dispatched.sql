-- safepoint ledger, SQLite dialect, migration 8: an operation remembers that it was sent.
--
-- A retry that sends a rejected operation again (resend) clears its dispatch count and first
-- dispatch for the next attempt, and a "not applied" resolution clears the first dispatch; the
-- owner still remembers the key it was sent under. last_dispatched_at is the last time a
-- dispatch of the operation, under any of its keys, was committed, and nothing clears it: a
-- prune keeps an operation that was ever sent while its owner may remember it (safepoint/
-- _rules/retention.py). Operations from before this migration take it from their history (the
-- last effect.dispatching event), or else from their row: counted, timed, or sent again (a key
-- attempt past the first was sent only after an earlier one was rejected) — their last write.
-- ../schema.sql is what this leaves.

ALTER TABLE safepoint_operations ADD COLUMN last_dispatched_at INTEGER;

UPDATE safepoint_operations AS o
SET last_dispatched_at = COALESCE(
    (SELECT max(e.at) FROM safepoint_events AS e
     WHERE e.run_id = o.run_id AND e.operation_id = o.operation_id
       AND e.kind = 'effect.dispatching'),
    CASE WHEN o.dispatch_count > 0 OR o.first_dispatched_at IS NOT NULL OR o.key_attempt > 1
         THEN o.updated_at END);
