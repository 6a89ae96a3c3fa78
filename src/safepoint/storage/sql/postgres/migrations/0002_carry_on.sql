-- safepoint ledger, PostgreSQL dialect, migration 2: carrying a stopped run on.
--
-- A run may stop at a limit and be carried on (status 'stopped'; a turn limit, a raised
-- step-attempt limit), wait for a message or a timer (a wait step, kind 'wait'; wake_at; the
-- messages table), be forked from a step (forked_from), and have a rejected operation sent again
-- under a key derived from its attempt (key_attempt). ../schema.sql is what this leaves.

ALTER TABLE safepoint_runs
    DROP CONSTRAINT safepoint_runs_status_check,
    ADD CONSTRAINT safepoint_runs_status_check
        CHECK (status IN ('pending', 'running', 'completed', 'failed', 'blocked', 'cancelled',
                          'waiting', 'continued', 'stopped')),
    ADD COLUMN model_call_budget INTEGER,
    ADD COLUMN model_calls_spent INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN step_attempt_limit INTEGER,
    ADD COLUMN wake_at BIGINT,
    ADD COLUMN forked_from TEXT;

CREATE INDEX safepoint_runs_due ON safepoint_runs (wake_at) WHERE status = 'waiting';

ALTER TABLE safepoint_steps
    DROP CONSTRAINT safepoint_steps_kind_check,
    ADD CONSTRAINT safepoint_steps_kind_check
        CHECK (kind IN ('pure', 'read', 'model', 'decision', 'effect', 'value', 'wait'));

ALTER TABLE safepoint_operations ADD COLUMN key_attempt INTEGER NOT NULL DEFAULT 1;

CREATE TABLE safepoint_messages (
    seq          BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- the order sent in
    run_id       TEXT    NOT NULL REFERENCES safepoint_runs (run_id),
    name         TEXT    NOT NULL,
    message_id   TEXT,               -- the sender's id for it; NULL: none given
    payload      TEXT,
    payload_ref  TEXT,
    sent_by      TEXT,
    sent_at      BIGINT  NOT NULL,
    taken_by     TEXT,               -- the wait step that received it; NULL: not yet taken
    taken_at     BIGINT
);

CREATE UNIQUE INDEX safepoint_messages_id ON safepoint_messages (run_id, message_id);

CREATE INDEX safepoint_messages_name ON safepoint_messages (run_id, name, seq);
