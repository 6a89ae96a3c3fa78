-- safepoint ledger, PostgreSQL dialect, migration 5: every table a distributed PostgreSQL can
-- split by run_id, and "now" in a form it accepts. ../schema.sql is what this leaves.
--
-- A database that shards tables by a column (Citus) needs that column in every primary key and
-- unique constraint, so each is enforced on one shard: the events', approvals' and messages'
-- keys now start with run_id (their own ids stay unique on their own: identities and uuids).
-- The events' key is the index a run's history was read by, so that index goes.
--
-- The clock is STABLE: a distributed UPDATE refuses a VOLATILE function in its SET, WHERE and
-- RETURNING, and evaluates a STABLE one on the node that plans the statement: one clock for
-- every shard. It still reads clock_timestamp(), so each statement (not each transaction)
-- reads the time; every statement reads it once, in its `clock` CTE, which stays materialized.

ALTER TABLE safepoint_events DROP CONSTRAINT safepoint_events_pkey;
ALTER TABLE safepoint_events ADD PRIMARY KEY (run_id, event_id);
DROP INDEX safepoint_events_run;

ALTER TABLE safepoint_approvals DROP CONSTRAINT safepoint_approvals_pkey;
ALTER TABLE safepoint_approvals ADD PRIMARY KEY (run_id, approval_id);

ALTER TABLE safepoint_messages DROP CONSTRAINT safepoint_messages_pkey;
ALTER TABLE safepoint_messages ADD PRIMARY KEY (run_id, seq);

CREATE OR REPLACE FUNCTION safepoint_now_ms() RETURNS BIGINT
    LANGUAGE sql STABLE
    AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;

-- Artifacts are kept with the run that stores them, so they sit on that run's shard and are
-- written in the run's own fenced statements: the same bytes are stored once per run, not once
-- per ledger. A read by digest alone (a fork reads its source's) finds them in any run. What was
-- stored before this migration is kept under no run ('').
ALTER TABLE safepoint_artifacts ADD COLUMN run_id TEXT NOT NULL DEFAULT '';
ALTER TABLE safepoint_artifacts ALTER COLUMN run_id DROP DEFAULT;
ALTER TABLE safepoint_artifacts DROP CONSTRAINT safepoint_artifacts_pkey;
ALTER TABLE safepoint_artifacts ADD PRIMARY KEY (run_id, digest);
CREATE INDEX safepoint_artifacts_digest ON safepoint_artifacts (digest);
