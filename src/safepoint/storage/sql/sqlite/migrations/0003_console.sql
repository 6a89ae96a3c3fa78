-- safepoint ledger, SQLite dialect, migration 3: what the console shows of a run.
--
-- The time of a worker's last heartbeat (its lease renewal), so a person sees how long ago a
-- worker that holds a run last said it is alive; and the index the console's listing pages by
-- (newest created first, by keyset). ../schema.sql is what this leaves.

ALTER TABLE safepoint_runs ADD COLUMN heartbeat_at INTEGER;

CREATE INDEX safepoint_runs_created ON safepoint_runs (created_at, run_id);
