-- safepoint ledger, SQLite dialect, migration 4: bounded history and continue-as-new.
--
-- HISTORY: a run's history is its events plus its steps; event_count and step_count count both
-- exactly, in the statements that append them. A run may carry a soft limit (crossing it records
-- one run.history_warning event, at history_warned_at) and a hard limit (a write that would start
-- something new past it is refused, in the fenced statement itself; outcomes of effects already
-- in flight and the run's ending are always recorded). NULL: no limit.
--
-- CHAIN: run.continue_as_new(state) ends a run as 'continued', pointing at its successor
-- (successor_run_id), and creates the successor in the same transaction with the carried state
-- as its inputs. Every run of a chain names the chain's first run (chain_id) and its place in it
-- (chain_index, 0 for the first run); a successor names its parent (parent_run_id). Nothing of the
-- parent's history is copied: an operation settled by an earlier run of the chain is found by
-- (chain_id, operation_id) in safepoint_operations, hence chain_id there too.
--
-- The new status 'continued' widens a CHECK constraint, which SQLite can only change by
-- rebuilding the table: the rows are copied aside, the table is created anew and filled again.
-- Foreign keys of steps and operations are deferred meanwhile (until this migration commits),
-- so the moment the runs table is dropped does not count as a violation.

PRAGMA defer_foreign_keys = ON;

CREATE TEMP TABLE safepoint_runs_before_history AS SELECT * FROM safepoint_runs;

DROP INDEX safepoint_runs_status;

DROP TABLE safepoint_runs;

CREATE TABLE safepoint_runs (
    run_id               TEXT    PRIMARY KEY,
    workflow             TEXT    NOT NULL,
    workflow_version     TEXT    NOT NULL,
    status               TEXT    NOT NULL
                         CHECK (status IN ('pending', 'running', 'completed', 'failed',
                                           'blocked', 'cancelled', 'continued')),
    input_hash           TEXT    NOT NULL,
    inputs               TEXT,
    inputs_ref           TEXT,
    state_revision       INTEGER NOT NULL DEFAULT 0,
    owner                TEXT,
    lease_expires_at     INTEGER,
    fence                INTEGER NOT NULL DEFAULT 0,
    resume_count         INTEGER NOT NULL DEFAULT 0,
    event_count          INTEGER NOT NULL DEFAULT 0,
    result               TEXT,
    result_ref           TEXT,
    error                TEXT,
    recovery_record      TEXT,
    created_at           INTEGER NOT NULL,
    updated_at           INTEGER NOT NULL,
    resume_budget        INTEGER,
    cancel_requested_at  INTEGER,
    step_count           INTEGER NOT NULL DEFAULT 0,
    history_soft_limit   INTEGER,
    history_hard_limit   INTEGER,
    history_warned_at    INTEGER,
    chain_id             TEXT    NOT NULL,
    chain_index          INTEGER NOT NULL DEFAULT 0,
    parent_run_id        TEXT,
    successor_run_id     TEXT
);

INSERT INTO safepoint_runs (run_id, workflow, workflow_version, status, input_hash, inputs,
                            inputs_ref, state_revision, owner, lease_expires_at, fence,
                            resume_count, event_count, result, result_ref, error,
                            recovery_record, created_at, updated_at, resume_budget,
                            cancel_requested_at, step_count, chain_id)
SELECT run_id, workflow, workflow_version, status, input_hash, inputs, inputs_ref,
       state_revision, owner, lease_expires_at, fence, resume_count, event_count, result,
       result_ref, error, recovery_record, created_at, updated_at, resume_budget,
       cancel_requested_at,
       (SELECT count(*) FROM safepoint_steps s WHERE s.run_id = r.run_id), run_id
FROM safepoint_runs_before_history AS r;

DROP TABLE safepoint_runs_before_history;

CREATE INDEX safepoint_runs_status ON safepoint_runs (status, updated_at);

-- The runs of a chain, in order: following a chain, and its next run's place.
CREATE INDEX safepoint_runs_chain ON safepoint_runs (chain_id, chain_index);

ALTER TABLE safepoint_operations ADD COLUMN chain_id TEXT;

UPDATE safepoint_operations SET chain_id = run_id;

-- An effect step of a successor looks its operation id up in the runs before it: one probe.
CREATE INDEX safepoint_operations_chain ON safepoint_operations (chain_id, operation_id);
