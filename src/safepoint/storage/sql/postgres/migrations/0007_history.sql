-- safepoint ledger, PostgreSQL dialect, migration 7: bounded history and continue-as-new.
--
-- HISTORY: a run's history is its events plus its steps; event_count and step_count count both
-- exactly, in the statements that append them. A run may carry a soft limit (crossing it records
-- one run.history_warning event, at history_warned_at) and a hard limit (a write that would start
-- something new past it is refused, in the fenced statement itself; outcomes of effects already
-- in flight and the run's ending are always recorded). NULL: no limit.
--
-- CHAIN: run.continue_as_new(state) ends a run as 'continued', pointing at its successor
-- (successor_run_id), and creates the successor in the same statement with the carried state
-- as its inputs. Every run of a chain names the chain's first run (chain_id) and its place in it
-- (chain_index, 0 for the first run); a successor names its parent (parent_run_id). Nothing of the
-- parent's history is copied: an operation settled by an earlier run of the chain is found by
-- (chain_id, operation_id) in safepoint_operations, hence chain_id there too.

ALTER TABLE safepoint_runs
    DROP CONSTRAINT safepoint_runs_status_check,
    ADD CONSTRAINT safepoint_runs_status_check
        CHECK (status IN ('pending', 'running', 'completed', 'failed', 'blocked', 'cancelled',
                          'waiting', 'continued')),
    ADD COLUMN step_count          INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN history_soft_limit  INTEGER,
    ADD COLUMN history_hard_limit  INTEGER,
    ADD COLUMN history_warned_at   BIGINT,
    ADD COLUMN chain_id            TEXT,
    ADD COLUMN chain_index         INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN parent_run_id       TEXT,
    ADD COLUMN successor_run_id    TEXT;

UPDATE safepoint_runs AS r
SET chain_id = r.run_id,
    step_count = (SELECT count(*) FROM safepoint_steps s WHERE s.run_id = r.run_id);

ALTER TABLE safepoint_runs ALTER COLUMN chain_id SET NOT NULL;

-- The runs of a chain, in order: following a chain, and its next run's place.
CREATE INDEX safepoint_runs_chain ON safepoint_runs (chain_id, chain_index);

ALTER TABLE safepoint_operations ADD COLUMN chain_id TEXT;

UPDATE safepoint_operations SET chain_id = run_id;

ALTER TABLE safepoint_operations ALTER COLUMN chain_id SET NOT NULL;

-- An effect step of a successor looks its operation id up in the runs before it: one probe.
CREATE INDEX safepoint_operations_chain ON safepoint_operations (chain_id, operation_id);
