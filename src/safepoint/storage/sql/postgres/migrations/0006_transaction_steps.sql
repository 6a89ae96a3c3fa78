-- safepoint ledger, PostgreSQL dialect, migration 6: transaction steps.
--
-- A transaction step (kind 'transaction') commits the user's writes to tables of this database
-- in the same transaction as its step record: one commit, exactly once. ../schema.sql is what
-- this leaves.

ALTER TABLE safepoint_steps
    DROP CONSTRAINT safepoint_steps_kind_check,
    ADD CONSTRAINT safepoint_steps_kind_check
        CHECK (kind IN ('pure', 'read', 'model', 'decision', 'effect', 'value', 'wait',
                        'transaction'));
