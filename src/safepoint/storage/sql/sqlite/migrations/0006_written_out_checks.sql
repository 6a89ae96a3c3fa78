-- safepoint ledger, SQLite dialect, migration 6: checks every write can afford.
--
-- SQLite tests `x IN (a, b, c)` — a list of more than two values — against a table it builds for
-- the list each time a statement tests it: on every write of a step (its kind), of an operation
-- (its state) and, through the partial index of finished runs, of a running run's updated_at
-- (every fenced write moves it). Written out as `x = a OR x = b OR …` the same test costs a few
-- comparisons. Nothing else changes: the same values pass, the same rows are indexed.
--
-- SQLite cannot change a CHECK constraint in place, so the steps and operations tables are
-- rebuilt the way SQLite documents (create, copy, drop, rename), as migrations 2 and 5 did. The
-- store runs migrations with foreign keys off and checks them before it commits (approvals
-- refer to operations by name: they refer to the rebuilt table). ../schema.sql is what this
-- leaves.

CREATE TABLE safepoint_steps_next (
    run_id        TEXT    NOT NULL REFERENCES safepoint_runs (run_id),
    step_id       TEXT    NOT NULL,
    seq           INTEGER NOT NULL,         -- order of first record within the run
    kind          TEXT    NOT NULL
                  CHECK (kind = 'pure' OR kind = 'read' OR kind = 'model' OR kind = 'decision'
                         OR kind = 'effect' OR kind = 'value' OR kind = 'wait'
                         OR kind = 'transaction'),
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

CREATE INDEX safepoint_steps_result_ref ON safepoint_steps (result_ref) WHERE result_ref IS NOT NULL;

CREATE TABLE safepoint_operations_next (
    run_id               TEXT    NOT NULL REFERENCES safepoint_runs (run_id),
    operation_id         TEXT    NOT NULL,
    step_id              TEXT    NOT NULL,
    effect               TEXT    NOT NULL,
    state                TEXT    NOT NULL
                         CHECK (state = 'prepared' OR state = 'dispatching' OR state = 'applied'
                                OR state = 'rejected' OR state = 'unknown'
                                OR state = 'accepted'),
    payload_ref          TEXT    NOT NULL,  -- artifact digest of the canonical payload
    effect_key           TEXT    NOT NULL,  -- minted once at prepare, never again
    dispatch_count       INTEGER NOT NULL DEFAULT 0,
    first_dispatched_at  INTEGER,           -- bounds re-dispatch by the owner's dedup retention
    receipt              TEXT,
    error                TEXT,              -- evidence of a rejection or an unknown outcome
    fence                INTEGER NOT NULL,
    prepared_at          INTEGER NOT NULL,
    updated_at           INTEGER NOT NULL,
    -- dispatched only under an approval; the target's state as last read at the gate; the
    -- approval that authorized the latest dispatch
    approval_required    INTEGER NOT NULL DEFAULT 0,
    target_digest        TEXT,
    approval_id          TEXT,
    -- the run's chain: a successor finds an operation an earlier run settled by
    -- (chain_id, operation_id)
    chain_id             TEXT,
    -- which attempt of the operation its effect_key was minted for: 1, unless a person had an
    -- operation the owner rejected sent again (retry), under a key derived from the attempt
    key_attempt          INTEGER NOT NULL DEFAULT 1,
    -- how long the effect's owner remembers a key, as the effect declared it (dedup_retention);
    -- NULL: none declared. A prune keeps an operation its owner may still remember
    dedup_retention_ms   INTEGER,
    PRIMARY KEY (run_id, operation_id)
) WITHOUT ROWID;

INSERT INTO safepoint_operations_next (
    run_id, operation_id, step_id, effect, state, payload_ref, effect_key, dispatch_count,
    first_dispatched_at, receipt, error, fence, prepared_at, updated_at, approval_required,
    target_digest, approval_id, chain_id, key_attempt, dedup_retention_ms)
SELECT
    run_id, operation_id, step_id, effect, state, payload_ref, effect_key, dispatch_count,
    first_dispatched_at, receipt, error, fence, prepared_at, updated_at, approval_required,
    target_digest, approval_id, chain_id, key_attempt, dedup_retention_ms
FROM safepoint_operations;

DROP TABLE safepoint_operations;

ALTER TABLE safepoint_operations_next RENAME TO safepoint_operations;

CREATE INDEX safepoint_operations_chain ON safepoint_operations (chain_id, operation_id);

CREATE INDEX safepoint_operations_payload ON safepoint_operations (payload_ref);

DROP INDEX safepoint_runs_finished;

CREATE INDEX safepoint_runs_finished ON safepoint_runs (updated_at, run_id)
    WHERE successor_run_id IS NULL
      AND (status = 'completed' OR status = 'failed' OR status = 'cancelled');
