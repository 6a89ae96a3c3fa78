-- safepoint ledger, PostgreSQL dialect, migration 5: limits that survive restarts.
--
-- A run's deadline (an instant on the database clock: past it, no new step and no new dispatch
-- is started), its model budgets with what it spent so far (added up in the statement that
-- records each model step, so no restart resets them), and its default step attempts (the
-- numbers of a Retry policy, as JSON). A model step records the usage it reported.
ALTER TABLE safepoint_runs ADD COLUMN deadline_at BIGINT;
ALTER TABLE safepoint_runs ADD COLUMN token_budget BIGINT;
ALTER TABLE safepoint_runs ADD COLUMN cost_budget DOUBLE PRECISION;
ALTER TABLE safepoint_runs ADD COLUMN tokens_spent BIGINT NOT NULL DEFAULT 0;
ALTER TABLE safepoint_runs ADD COLUMN cost_spent DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE safepoint_runs ADD COLUMN step_attempts TEXT;
ALTER TABLE safepoint_steps ADD COLUMN tokens BIGINT;
ALTER TABLE safepoint_steps ADD COLUMN cost DOUBLE PRECISION;

-- ATTEMPTS: each failed attempt of a read or model step that is tried again, recorded before
-- the back-off (with the instant the next attempt may start), so that a restart continues the
-- count and waits out the rest. Kept after the step succeeds or fails for good: its history.
CREATE TABLE safepoint_attempts (
    run_id      TEXT    NOT NULL REFERENCES safepoint_runs (run_id),
    step_id     TEXT    NOT NULL,
    attempt     INTEGER NOT NULL,           -- counts every call of the step's function
    kind        TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    input_hash  TEXT    NOT NULL,
    error       TEXT    NOT NULL,           -- the failure's type and message
    retry_at    BIGINT  NOT NULL,           -- the next attempt starts no earlier
    fence       BIGINT  NOT NULL,
    recorded_at BIGINT  NOT NULL,
    PRIMARY KEY (run_id, step_id, attempt)
);
