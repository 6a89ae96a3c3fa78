-- safepoint ledger, SQLite dialect, migration 4: retention (safepoint prune).
--
-- Each operation records how long its effect's owner remembers a key (dedup_retention_ms, the
-- effect's dedup_retention; NULL: none declared, and for operations prepared before this
-- migration), so that a prune can tell when deleting it is harmless (safepoint/_rules/
-- retention.py). The indexes let a prune find finished chains in order, the forks of a run, and
-- whether anything still references an artifact, without reading whole tables.
-- ../schema.sql is what this leaves.

ALTER TABLE safepoint_operations ADD COLUMN dedup_retention_ms INTEGER;

CREATE INDEX safepoint_runs_finished ON safepoint_runs (updated_at, run_id)
    WHERE successor_run_id IS NULL AND status IN ('completed', 'failed', 'cancelled');

CREATE INDEX safepoint_runs_fork_source ON safepoint_runs (json_extract(forked_from, '$.run_id'))
    WHERE forked_from IS NOT NULL;

CREATE INDEX safepoint_runs_inputs_ref ON safepoint_runs (inputs_ref) WHERE inputs_ref IS NOT NULL;

CREATE INDEX safepoint_runs_result_ref ON safepoint_runs (result_ref) WHERE result_ref IS NOT NULL;

CREATE INDEX safepoint_steps_result_ref ON safepoint_steps (result_ref) WHERE result_ref IS NOT NULL;

CREATE INDEX safepoint_operations_payload ON safepoint_operations (payload_ref);

CREATE INDEX safepoint_messages_payload_ref ON safepoint_messages (payload_ref)
    WHERE payload_ref IS NOT NULL;
