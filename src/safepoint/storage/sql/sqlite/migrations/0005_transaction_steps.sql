-- safepoint ledger, SQLite dialect, migration 5: transaction steps.
--
-- A transaction step (kind 'transaction') commits the user's writes to tables of this database
-- in the same transaction as its step record: one commit, exactly once.
--
-- SQLite cannot change a CHECK constraint in place, so the steps table is rebuilt the way SQLite
-- documents (create, copy, drop, rename), as migration 2 did. ../schema.sql is what this leaves.

CREATE TABLE safepoint_steps_next (
    run_id        TEXT    NOT NULL REFERENCES safepoint_runs (run_id),
    step_id       TEXT    NOT NULL,
    seq           INTEGER NOT NULL,         -- order of first record within the run
    kind          TEXT    NOT NULL
                  CHECK (kind IN ('pure', 'read', 'model', 'decision', 'effect', 'value',
                                'wait', 'transaction')),
    name          TEXT    NOT NULL,
    input_hash    TEXT    NOT NULL,
    status        TEXT    NOT NULL DEFAULT 'completed'
                  CHECK (status IN ('completed', 'failed')),
    result        TEXT,
    result_ref    TEXT,
    error         TEXT,                     -- a failed step: its error type and message
    next_step_id  TEXT,                     -- decision steps: the planner's choice
    attempt       INTEGER NOT NULL DEFAULT 1,
    model_id      TEXT,                     -- model steps
    prompt_hash   TEXT,                     -- model steps
    observed_at   INTEGER,                  -- read steps: when the observation was made
    operation_id  TEXT,                     -- effect steps
    fence         INTEGER NOT NULL,
    recorded_at   INTEGER NOT NULL,
    tokens        INTEGER,                  -- model steps: the usage they reported
    cost          REAL,
    PRIMARY KEY (run_id, step_id)
) WITHOUT ROWID;

INSERT INTO safepoint_steps_next (
    run_id, step_id, seq, kind, name, input_hash, status, result, result_ref, error,
    next_step_id, attempt, model_id, prompt_hash, observed_at, operation_id, fence, recorded_at,
    tokens, cost)
SELECT
    run_id, step_id, seq, kind, name, input_hash, status, result, result_ref, error,
    next_step_id, attempt, model_id, prompt_hash, observed_at, operation_id, fence, recorded_at,
    tokens, cost
FROM safepoint_steps;

DROP TABLE safepoint_steps;

ALTER TABLE safepoint_steps_next RENAME TO safepoint_steps;

-- The rebuilt table's indexes, as migration 4 made them: what a prune probes an artifact by.
CREATE INDEX safepoint_steps_result_ref ON safepoint_steps (result_ref) WHERE result_ref IS NOT NULL;
