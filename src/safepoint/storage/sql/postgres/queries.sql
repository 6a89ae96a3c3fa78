-- Named queries of the PostgreSQL store. Each starts with `-- name: <name>` and a one-line
-- purpose. Parameters are named (%(run_id)s) and bound by the driver; nothing is ever
-- formatted into the SQL text.
--
-- A query is named after the store method that runs it (`claim_next`, `record_steps`), or after
-- that method and its part (`load_ledger_steps`, `await_approval_fence`); a statement several
-- methods share is named after what it does (`fence_state`, `notify_work`). The reading
-- queries (`get_run`, `list_runs`, `load_ledger_*`, `events`, `approvals` …) have the same
-- names and columns as SQLite's: both stores read through one set of plans
-- (safepoint/storage/ledger.py). Fencing end to end: safepoint/_rules/fencing.py.
--
-- Each worker write is ONE statement: a CTE (`owned`) is the fence — an UPDATE of the runs
-- row that matches only while the worker's fence is current and the run is running — and
-- every other write in the statement reads from it (PostgreSQL runs every data-modifying CTE
-- whether or not the query reads it: selecting FROM `owned` is what holds it back), so a
-- stale worker's statement writes nothing and returns no row (the store raises LostOwnership).
-- A write that is right only for an operation as it must be (there, dispatchable) checks that
-- in the fence's own condition, so a wrong operation writes nothing either; `fence_state` then
-- tells which it was. The UPDATE also takes the runs row lock: a claim racing the write waits
-- for it, or the write waits for the claim and then finds the fence moved. `clock` reads the
-- database clock once per statement, so a run's updated_at, lease and event time agree.

-- name: now
-- The database clock in epoch milliseconds.
SELECT safepoint_now_ms() AS now;

-- name: next_event_id
-- The id an event will be inserted with, taken before so that its detail can be sealed for its
-- row (storage/codec.py): the statement that inserts it takes it as %(event_id)s, and takes the
-- next one itself where none is given (the identity's own sequence, named as migration 1's
-- table makes it; tests/integration/test_sealed_rows.py checks the name).
SELECT nextval('safepoint_events_event_id_seq') AS event_id;

-- name: next_message_seq
-- The seq a message will be inserted with (as next_event_id, for a payload sealed for its row).
SELECT nextval('safepoint_messages_seq_seq') AS seq;

-- name: schema_version
-- The highest migration applied.
SELECT COALESCE(MAX(version), 0) AS version FROM safepoint_schema_version;

-- name: power_loss_durability
-- durability=power_loss, on every connection whatever the server's default: a commit returns
-- only once its WAL is flushed. Only remote_apply is stricter, and is left as it is.
SELECT set_config('synchronous_commit', 'on', false)
WHERE current_setting('synchronous_commit') <> 'remote_apply';

-- name: migration_lock
-- Serialise concurrent openers: held until the migrating transaction ends.
SELECT pg_advisory_xact_lock(hashtextextended('safepoint.migrate', 0));

-- name: citus_distributed_tables
-- The ledger's tables Citus already distributes (or copies to every node), in this schema.
SELECT c.relname AS table_name
FROM pg_dist_partition AS p JOIN pg_class AS c ON c.oid = p.logicalrelid
WHERE c.relnamespace = current_schema()::regnamespace;

-- name: citus_distribute_table
-- One table distributed by its column, co-located with the runs (the runs: a group of their own).
SELECT create_distributed_table(
    %(table)s::text::regclass, %(column)s::text,
    colocate_with => CASE WHEN %(table)s::text = 'safepoint_runs' THEN 'default' ELSE 'safepoint_runs' END);

-- name: citus_function_body
-- The body of one of the ledger's functions in this schema, if it has it.
SELECT p.prosrc AS body FROM pg_proc AS p
WHERE p.proname = %(function)s AND p.pronamespace = current_schema()::regnamespace;

-- name: citus_distribute_function
-- A function of the ledger whose first argument is a run's id, carried out on that run's node.
SELECT create_distributed_function(%(signature)s::text::regprocedure, 'p_run_id',
                                   colocate_with => 'safepoint_runs');

-- name: citus_function_on_every_node
-- A function of the ledger the routed forms call, made on every node.
SELECT create_distributed_function(%(signature)s::text::regprocedure);

-- name: citus_reference_table
-- A table of one row per ledger, copied to every node.
SELECT create_reference_table(%(table)s::text::regclass);

-- name: create_version_table
-- The ledger of applied migrations (in the first schema of the search path).
CREATE TABLE IF NOT EXISTS safepoint_schema_version (
    version     INTEGER PRIMARY KEY,
    name        TEXT    NOT NULL,
    checksum    TEXT    NOT NULL,
    applied_at  BIGINT  NOT NULL
);

-- name: version_table_exists
-- Whether this schema has been migrated at all.
SELECT to_regclass('safepoint_schema_version') IS NOT NULL AS found;

-- name: applied_migrations
-- Every applied migration with the checksum of its SQL text.
SELECT version, name, checksum FROM safepoint_schema_version ORDER BY version;

-- name: record_migration
-- Remember one applied migration, in the transaction that applied it.
INSERT INTO safepoint_schema_version (version, name, checksum, applied_at)
VALUES (%(version)s, %(name)s, %(checksum)s, safepoint_now_ms());

-- name: create_run
-- Create a run, claimed by its starter (running, fence 1) or pending for a worker (fence 0),
-- with its first event; returns nothing if the run id exists. A relative deadline counts from
-- its creation. It starts a chain of its own.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
created AS (
    INSERT INTO safepoint_runs (run_id, workflow, workflow_version, status, input_hash, inputs,
                                inputs_ref, state_revision, owner, lease_expires_at, fence,
                                resume_count, event_count, resume_budget, created_at,
                                updated_at, workflow_fingerprint, workflow_manifest,
                                deadline_at, token_budget, cost_budget, step_attempts,
                                history_soft_limit, history_hard_limit, chain_id,
                                model_call_budget, step_attempt_limit, family_id)
    SELECT %(run_id)s, %(workflow)s, %(workflow_version)s,
           CASE WHEN %(owner)s::text IS NULL THEN 'pending' ELSE 'running' END,
           %(input_hash)s, %(inputs)s, %(inputs_ref)s, 1, %(owner)s,
           CASE WHEN %(owner)s::text IS NULL THEN NULL ELSE clock.now + %(lease_ms)s END,
           CASE WHEN %(owner)s::text IS NULL THEN 0 ELSE 1 END,
           0, 1, %(resume_budget)s, clock.now, clock.now, %(workflow_fingerprint)s,
           %(workflow_manifest)s,
           COALESCE(%(deadline_at)s::bigint, clock.now + %(deadline_ms)s::bigint),
           %(token_budget)s::bigint, %(cost_budget)s::double precision, %(step_attempts)s,
           %(history_soft_limit)s, %(history_hard_limit)s, %(run_id)s,
           %(model_call_budget)s, %(step_attempt_limit)s, %(run_id)s
    FROM clock
    ON CONFLICT (run_id) DO NOTHING
    RETURNING *
),
event AS (
    INSERT INTO safepoint_events (run_id, at, kind, fence, worker, detail)
    SELECT run_id, created_at,
           CASE WHEN owner IS NULL THEN 'run.submitted' ELSE 'run.started' END,
           fence, owner, %(detail)s
    FROM created
)
SELECT * FROM created;

-- name: resolve
-- A person settled an uncertain operation of a blocked run, in one statement: the run leaves
-- "blocked" (compare-and-set on the revision they looked at) and is released for any worker;
-- the operation moves to accepted (with the receipt they found) or back to prepared (it never
-- happened: dispatch again, a fresh retention window); the decision is appended as an event.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
run AS (
    UPDATE safepoint_runs
    SET status = 'running', error = NULL, recovery_record = NULL, owner = NULL, fence = fence + 1,
        lease_expires_at = NULL, state_revision = state_revision + 1,
        event_count = event_count + 1, updated_at = (SELECT now FROM clock)
    WHERE run_id = %(run_id)s AND state_revision = %(expected_revision)s AND status = 'blocked'
      AND EXISTS (SELECT 1 FROM safepoint_operations
                  WHERE run_id = %(run_id)s AND operation_id = %(operation_id)s
                    -- an applied operation has the owner's receipt: never "not applied"
                    AND (state IN ('dispatching', 'unknown')
                         OR (state = 'applied' AND %(to_state)s = 'accepted')))
    RETURNING run_id, workflow
),
op AS (
    UPDATE safepoint_operations
    SET state = %(to_state)s, error = NULL,
        receipt = CASE WHEN %(to_state)s = 'prepared' THEN NULL
                       ELSE COALESCE(%(receipt)s, receipt) END,
        first_dispatched_at = CASE WHEN %(to_state)s = 'prepared' THEN NULL
                                   ELSE first_dispatched_at END,
        updated_at = (SELECT now FROM clock)
    -- the run's id as the parameter, not from the CTE: one shard, where sharded
    WHERE run_id = %(run_id)s AND operation_id = %(operation_id)s AND EXISTS (SELECT 1 FROM run)
    RETURNING operation_id
),
event AS (
    INSERT INTO safepoint_events (event_id, run_id, at, kind, operation_id, worker, detail)
    OVERRIDING SYSTEM VALUE
    SELECT coalesce(%(event_id)s::bigint, nextval('safepoint_events_event_id_seq')),
           run_id, (SELECT now FROM clock), 'run.resolved', %(operation_id)s, %(by)s,
           %(detail)s
    FROM run
)
SELECT workflow FROM run;

-- name: resolve_transaction_step
-- A person settled a transaction step recorded as uncertain (its function ended the step's
-- transaction: it may have committed) of a blocked run, in one statement: the run leaves
-- "blocked" (compare-and-set on the revision they looked at) and is released for any worker;
-- the step is recorded completed with the value they gave as what it returns (applied: its
-- writes are in the database), or its record goes, with its count in the history (not
-- applied: none is — it runs again from nothing); the decision is appended as an event.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
run AS (
    UPDATE safepoint_runs
    SET status = 'running', error = NULL, recovery_record = NULL, owner = NULL, fence = fence + 1,
        lease_expires_at = NULL, state_revision = state_revision + 1,
        event_count = event_count + 1,
        step_count = step_count - CASE WHEN %(applied)s THEN 0 ELSE 1 END,
        updated_at = (SELECT now FROM clock)
    WHERE run_id = %(run_id)s AND state_revision = %(expected_revision)s AND status = 'blocked'
      AND EXISTS (SELECT 1 FROM safepoint_steps
                  WHERE run_id = %(run_id)s AND step_id = %(step_id)s
                    AND kind = 'transaction' AND status = 'failed')
    RETURNING run_id, workflow
),
applied AS (
    UPDATE safepoint_steps
    SET status = 'completed', result = %(result)s, result_ref = %(result_ref)s, error = NULL,
        recorded_at = (SELECT now FROM clock)
    WHERE %(applied)s AND run_id = (SELECT run_id FROM run) AND step_id = %(step_id)s
),
not_applied AS (
    DELETE FROM safepoint_steps
    WHERE NOT %(applied)s AND run_id = (SELECT run_id FROM run) AND step_id = %(step_id)s
),
event AS (
    INSERT INTO safepoint_events (event_id, run_id, at, kind, operation_id, worker, detail)
    OVERRIDING SYSTEM VALUE
    SELECT coalesce(%(event_id)s::bigint, nextval('safepoint_events_event_id_seq')),
           run_id, (SELECT now FROM clock), 'run.resolved', NULL, %(by)s, %(detail)s
    FROM run
)
SELECT workflow FROM run;

-- name: resolve_abandon
-- A person gave a blocked run up: it ends cancelled (compare-and-set on the revision they
-- looked at), with the decision appended as an event.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
run AS (
    UPDATE safepoint_runs
    SET status = 'cancelled', error = %(error)s, recovery_record = NULL, owner = NULL, fence = fence + 1,
        lease_expires_at = NULL, state_revision = state_revision + 1,
        event_count = event_count + 1, updated_at = (SELECT now FROM clock)
    WHERE run_id = %(run_id)s AND state_revision = %(expected_revision)s AND status = 'blocked'
    RETURNING run_id
),
event AS (
    INSERT INTO safepoint_events (event_id, run_id, at, kind, operation_id, worker, detail)
    OVERRIDING SYSTEM VALUE
    SELECT coalesce(%(event_id)s::bigint, nextval('safepoint_events_event_id_seq')),
           run_id, (SELECT now FROM clock), 'run.resolved', %(operation_id)s, %(by)s,
           %(detail)s
    FROM run
)
SELECT run_id FROM run;

-- name: resolve_last_event
-- The newest event of a run (a repeated resolution finds its own there).
SELECT event_id, kind, detail FROM safepoint_events WHERE run_id = %(run_id)s
ORDER BY event_id DESC LIMIT 1;

-- name: notify_work
-- Wake idle workers on the ledger's channel (work_channel); delivered only when the transaction
-- commits.
SELECT pg_notify(%(channel)s, %(workflow)s);

-- name: fence_state
-- Why a fenced statement matched nothing: a stale fence, a cancel request, the deadline, the
-- history limit — or, for a statement that writes only with its operation (operation_id),
-- that operation: whether it needs approval (NULL: the run has no such operation).
-- (The operation as a subquery on the run's id, not a join: a database sharded by run_id sends
-- the statement whole to the run's shard.)
SELECT r.fence, r.status, r.cancel_requested_at, r.deadline_at, safepoint_now_ms() AS now,
       r.event_count + r.step_count AS history, r.history_hard_limit,
       (SELECT o.approval_required FROM safepoint_operations AS o
        WHERE o.run_id = %(run_id)s AND o.operation_id = %(operation_id)s) AS approval_required
FROM safepoint_runs AS r
WHERE r.run_id = %(run_id)s;

-- name: request_cancel
-- Ask a run to stop. A run nobody holds (pending, blocked, waiting, stopped) ends cancelled at
-- once; a running one is marked, and its worker stops before its next step or dispatch. An ended run is
-- left as it is. The request is appended as an event.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
run AS (
    UPDATE safepoint_runs
    -- a blocked run whose effect is still uncertain stays blocked, marked: a person settles
    -- the effect first (resolve), never a cancel that would forget it; a waiting one (its
    -- approval lapsed before a re-dispatch) becomes pending, marked: a worker settles the
    -- effect with its owner and ends the run, dispatching nothing
    SET status = CASE WHEN status IN ('pending', 'stopped')
                        OR (status IN ('blocked', 'waiting') AND NOT EXISTS (
                     SELECT 1 FROM safepoint_operations o
                     WHERE o.run_id = %(run_id)s  -- the parameter: one shard, where sharded
                       AND o.state IN ('dispatching', 'unknown', 'applied')))
                 THEN 'cancelled'
                 WHEN status = 'waiting' THEN 'pending'
                 ELSE status END,
        error = CASE WHEN status IN ('pending', 'blocked', 'waiting', 'stopped') THEN %(error)s
                ELSE error END,
        owner = CASE WHEN status IN ('pending', 'blocked') THEN NULL ELSE owner END,
        waiting_for = NULL,
        cancel_requested_at = COALESCE(cancel_requested_at, (SELECT now FROM clock)),
        state_revision = state_revision + 1, event_count = event_count + 1,
        updated_at = (SELECT now FROM clock)
    WHERE run_id = %(run_id)s AND status IN ('pending', 'blocked', 'running', 'waiting', 'stopped')
    RETURNING run_id, status, workflow
),
event AS (
    INSERT INTO safepoint_events (event_id, run_id, at, kind, worker, detail)
    OVERRIDING SYSTEM VALUE
    SELECT coalesce(%(event_id)s::bigint, nextval('safepoint_events_event_id_seq')),
           run_id, (SELECT now FROM clock),
           CASE WHEN status = 'cancelled' THEN 'run.cancelled' ELSE 'run.cancel_requested' END,
           %(by)s,
           -- on a sealed ledger, the detail sealed for each kind it may be (bound to the kind)
           CASE WHEN status = 'cancelled' THEN %(cancelled_detail)s ELSE %(detail)s END
    FROM run
)
SELECT status, workflow FROM run;

-- name: get_run
-- One run by id.
SELECT * FROM safepoint_runs WHERE run_id = %(run_id)s;

-- name: list_runs
-- Most recently changed runs first, optionally of one status.
SELECT * FROM safepoint_runs
WHERE (%(status)s::text IS NULL OR status = %(status)s)
ORDER BY updated_at DESC, run_id
LIMIT %(limit)s;

-- name: query_runs
-- One page of the runs a console asks for: every filter given narrows it (NULL: not asked);
-- newest created first, after the keyset (created_at, run_id) of the page before. The store
-- asks for one row more than the page, to know whether another page follows. (run_id is
-- compared byte-wise, as SQLite does, so both stores page alike.)
SELECT * FROM safepoint_runs
WHERE (%(workflow)s::text IS NULL OR workflow = %(workflow)s)
  AND (%(workflow_version)s::text IS NULL OR workflow_version = %(workflow_version)s)
  AND (%(search)s::text IS NULL OR strpos(lower(run_id), lower(%(search)s)) > 0)
  AND (%(created_from)s::bigint IS NULL OR created_at >= %(created_from)s)
  AND (%(created_to)s::bigint IS NULL OR created_at < %(created_to)s)
  AND (%(updated_from)s::bigint IS NULL OR updated_at >= %(updated_from)s)
  AND (%(updated_to)s::bigint IS NULL OR updated_at < %(updated_to)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(after_created)s::bigint IS NULL OR created_at < %(after_created)s
       OR (created_at = %(after_created)s AND run_id COLLATE "C" < %(after_run_id)s))
ORDER BY created_at DESC, run_id COLLATE "C" DESC
LIMIT %(limit)s;

-- name: count_runs
-- How many runs of each status match a console's filters (its status filter aside).
SELECT status, count(*) AS runs FROM safepoint_runs
WHERE (%(workflow)s::text IS NULL OR workflow = %(workflow)s)
  AND (%(workflow_version)s::text IS NULL OR workflow_version = %(workflow_version)s)
  AND (%(search)s::text IS NULL OR strpos(lower(run_id), lower(%(search)s)) > 0)
  AND (%(created_from)s::bigint IS NULL OR created_at >= %(created_from)s)
  AND (%(created_to)s::bigint IS NULL OR created_at < %(created_to)s)
  AND (%(updated_from)s::bigint IS NULL OR updated_at >= %(updated_from)s)
  AND (%(updated_to)s::bigint IS NULL OR updated_at < %(updated_to)s)
GROUP BY status;

-- name: claim_run
-- Compare-and-set on state_revision: take a run whose lease expired on the database clock, that
-- has no owner, or whose owner is known to be dead; bump the fence and the resume count.
-- A waiting run is claimed by name (a resume looks at its gate again: an approval, a message,
-- its timer), and by claim_next only once it is due (wake_at).
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
claimed AS (
    UPDATE safepoint_runs
    SET status = 'running', owner = %(owner)s, lease_expires_at = clock.now + %(lease_ms)s,
        fence = fence + 1, state_revision = state_revision + 1,
        resume_count = resume_count + CASE WHEN status = 'running' AND owner IS NOT NULL
                                           THEN 1 ELSE 0 END,
        event_count = event_count + 1, waiting_for = NULL, wake_at = NULL,
        updated_at = clock.now
    FROM clock
    WHERE run_id = %(run_id)s AND state_revision = %(expected_revision)s
      AND status IN ('pending', 'running', 'blocked', 'waiting')
      AND (owner IS NULL OR lease_expires_at <= clock.now OR owner = %(dead_owner)s)
    RETURNING run_id, fence, state_revision, lease_expires_at, updated_at
),
event AS (
    INSERT INTO safepoint_events (run_id, at, kind, fence, worker, detail)
    SELECT run_id, updated_at, 'run.claimed', fence, %(owner)s, %(detail)s FROM claimed
)
SELECT run_id, fence, state_revision, lease_expires_at FROM claimed;

-- name: claim_next
-- Take the oldest runnable run of these workflows ("name", any version, or "name@version") —
-- pending, released, left by a worker whose lease expired, or waiting and due (its sleep
-- ended, its wait timed out: wake_at passed) — skipping rows another worker is claiming right
-- now (SKIP LOCKED). Only a takeover of a running run counts as a resume.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
candidate AS (
    SELECT run_id FROM safepoint_runs
    WHERE (status = 'pending'
           OR (status = 'running'
               AND (lease_expires_at IS NULL OR lease_expires_at <= (SELECT now FROM clock)))
           OR (status = 'waiting' AND wake_at <= (SELECT now FROM clock)))
      AND (workflow = ANY(%(workflows)s)
           OR workflow || '@' || workflow_version = ANY(%(workflows)s))
    ORDER BY created_at, run_id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE safepoint_runs AS r
    SET status = 'running', owner = %(owner)s, lease_expires_at = clock.now + %(lease_ms)s,
        fence = r.fence + 1, state_revision = r.state_revision + 1,
        resume_count = r.resume_count + CASE WHEN r.status = 'running' AND r.owner IS NOT NULL
                                             THEN 1 ELSE 0 END,
        event_count = r.event_count + 1, waiting_for = NULL, wake_at = NULL,
        updated_at = clock.now
    FROM candidate, clock
    WHERE r.run_id = candidate.run_id
    RETURNING r.run_id, r.fence, r.state_revision, r.lease_expires_at, r.updated_at
),
event AS (
    INSERT INTO safepoint_events (run_id, at, kind, fence, worker)
    SELECT run_id, updated_at, 'run.claimed', fence, %(owner)s FROM claimed
)
SELECT run_id, fence, state_revision, lease_expires_at FROM claimed;

-- name: claim_candidates
-- The per-run claim (`?claim=per_run`), its first part: the oldest runnable runs of these
-- workflows, as claim_next finds them, read without a lock, after the candidates tried before
-- (keyset: created_at, run_id). A hint only: claim_candidate checks each again as it takes it.
-- Reading many shards without FOR UPDATE is what a database sharded by run_id allows, where
-- claim_next's FOR UPDATE SKIP LOCKED across every run is refused.
SELECT run_id, created_at FROM safepoint_runs
WHERE (status = 'pending'
       OR (status = 'running'
           AND (lease_expires_at IS NULL OR lease_expires_at <= safepoint_now_ms()))
       OR (status = 'waiting' AND wake_at <= safepoint_now_ms()))
  AND (workflow = ANY(%(workflows)s) OR workflow || '@' || workflow_version = ANY(%(workflows)s))
  AND (%(after_created)s::bigint IS NULL
       OR (created_at, run_id) > (%(after_created)s::bigint, %(after_run_id)s::text))
ORDER BY created_at, run_id
LIMIT %(limit)s;

-- name: claim_candidate
-- The per-run claim, its second part: take one candidate by its run id if it is still runnable,
-- as claim_next would have — a statement that touches one run only (one shard), so its
-- FOR UPDATE SKIP LOCKED is allowed there: a candidate another transaction holds (a claim, a
-- fenced write, a person's change) is passed over, no row, and the caller tries the next.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
candidate AS (
    SELECT run_id FROM safepoint_runs
    WHERE run_id = %(run_id)s
      AND (status = 'pending'
           OR (status = 'running'
               AND (lease_expires_at IS NULL OR lease_expires_at <= (SELECT now FROM clock)))
           OR (status = 'waiting' AND wake_at <= (SELECT now FROM clock)))
      AND (workflow = ANY(%(workflows)s)
           OR workflow || '@' || workflow_version = ANY(%(workflows)s))
    FOR UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE safepoint_runs AS r
    SET status = 'running', owner = %(owner)s, lease_expires_at = clock.now + %(lease_ms)s,
        fence = r.fence + 1, state_revision = r.state_revision + 1,
        resume_count = r.resume_count + CASE WHEN r.status = 'running' AND r.owner IS NOT NULL
                                             THEN 1 ELSE 0 END,
        event_count = r.event_count + 1, waiting_for = NULL, wake_at = NULL,
        updated_at = clock.now
    FROM candidate, clock
    WHERE r.run_id = %(run_id)s AND candidate.run_id = %(run_id)s
    RETURNING r.run_id, r.fence, r.state_revision, r.lease_expires_at, r.updated_at
),
event AS (
    INSERT INTO safepoint_events (run_id, at, kind, fence, worker)
    SELECT run_id, updated_at, 'run.claimed', fence, %(owner)s FROM claimed
)
SELECT run_id, fence, state_revision, lease_expires_at FROM claimed;

-- name: renew_lease
-- The heartbeat: push the lease out while this worker's fence is current. Not progress, so
-- the state revision stays.
UPDATE safepoint_runs
SET lease_expires_at = safepoint_now_ms() + %(lease_ms)s, heartbeat_at = safepoint_now_ms()
WHERE run_id = %(run_id)s AND fence = %(fence)s AND status = 'running'
RETURNING lease_expires_at;

-- name: prepare_effect
-- Fence and commit prepared intent, in one statement: the payload (a content-addressed
-- artifact), the operation — payload reference, operation id, effect key, and whether it needs
-- approval — and its event become durable together. With `dispatching` (no gate stands between
-- the two, DESIGN §3) the same statement commits the operation "dispatching", its first
-- dispatch counted and timed, with that event too: the ledger two writes would leave, in one
-- commit. New work: refused once a cancel is asked for, past the deadline, and when the
-- prepare's event would take the history past the hard limit (an operation prepared is sent
-- whatever the history: its dispatching event is never held to it). The operation is filed
-- under the run's chain, where a successor looks it up. An operation id the run has already
-- fails the statement whole (a unique violation).
-- What it commits, prepared (no dispatch yet) or dispatching (the first), is read with the
-- clock: `dispatches` is 0 or 1.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now,
                                   %(dispatching)s::boolean::integer AS dispatches),
-- dispatching: the family's claim on the operation, taken first — a racing claim waits for
-- the row, then re-checks the condition against the row as committed (READ COMMITTED): never
-- two holders; another run of the family holding it refuses the whole statement
-- (family_refusal tells)
claimed AS (
    INSERT INTO safepoint_family_claims (family_id, claim_key, run_id, operation_id, sent)
    SELECT COALESCE(family_id, run_id), %(family_key)s, run_id, %(operation_id)s, true
    FROM safepoint_runs, clock
    -- owned's conditions, as this statement sees the row: a claim is never taken for a write
    -- they refuse (a later member would find nothing sent to take)
    WHERE run_id = %(run_id)s AND fence = %(fence)s AND status = 'running'
      AND cancel_requested_at IS NULL AND (deadline_at IS NULL OR deadline_at > clock.now)
      AND (history_hard_limit IS NULL OR event_count + step_count + 1 <= history_hard_limit)
      AND %(dispatching)s AND %(family_key)s::text IS NOT NULL
    ON CONFLICT (family_id, claim_key) DO UPDATE
    SET run_id = EXCLUDED.run_id, operation_id = EXCLUDED.operation_id, sent = true
    WHERE NOT safepoint_family_claims.sent
       OR (safepoint_family_claims.run_id = EXCLUDED.run_id
           AND safepoint_family_claims.operation_id = EXCLUDED.operation_id)
    RETURNING run_id
),
-- the fence; counts the events and moves the revision as the two writes would, one each
owned AS (
    UPDATE safepoint_runs
    SET state_revision = state_revision + 1 + clock.dispatches,
        lease_expires_at = clock.now + %(lease_ms)s,
        event_count = event_count + 1 + clock.dispatches, updated_at = clock.now
    FROM clock
    WHERE run_id = %(run_id)s AND fence = %(fence)s AND status = 'running'
      -- new work: none once a cancel is asked for, none past the deadline
      AND cancel_requested_at IS NULL AND (deadline_at IS NULL OR deadline_at > clock.now)
      -- only the prepare is held to the hard limit
      AND (history_hard_limit IS NULL OR event_count + step_count + 1 <= history_hard_limit)
      AND (NOT %(dispatching)s OR %(family_key)s::text IS NULL OR EXISTS (SELECT 1 FROM claimed))
    RETURNING run_id, chain_id, updated_at AS now, event_count + step_count AS history,
              history_soft_limit, history_hard_limit, history_warned_at
),
-- the payload, stored once whoever stores it; like every write here, only past the fence
artifact AS (
    INSERT INTO safepoint_artifacts (run_id, digest, size, content, created_at)
    SELECT run_id, %(payload_ref)s, %(size)s, %(payload)s, now FROM owned
    ON CONFLICT (run_id, digest) DO UPDATE SET size = EXCLUDED.size WHERE false
),
operation AS (
    INSERT INTO safepoint_operations (run_id, operation_id, step_id, effect, state, payload_ref,
                                      effect_key, dispatch_count, first_dispatched_at,
                                      approval_required, target_digest, fence, prepared_at,
                                      updated_at, chain_id, dedup_retention_ms, family_key,
                                      last_dispatched_at)
    SELECT run_id, %(operation_id)s, %(step_id)s, %(effect)s,
           CASE WHEN %(dispatching)s THEN 'dispatching' ELSE 'prepared' END, %(payload_ref)s,
           %(effect_key)s, clock.dispatches, CASE WHEN clock.dispatches > 0 THEN owned.now END,
           %(approval_required)s, %(target_digest)s, %(fence)s::bigint, owned.now, owned.now,
           chain_id, %(dedup_retention_ms)s::bigint, %(family_key)s,
           CASE WHEN clock.dispatches > 0 THEN owned.now END
    FROM owned, clock
    RETURNING *
),
-- effect.prepared, then (dispatching) effect.dispatching: inserted in that order, so their
-- event ids keep it
event AS (
    INSERT INTO safepoint_events (run_id, at, kind, step_id, operation_id, fence, worker, detail)
    SELECT run_id, updated_at, e.kind, step_id, operation_id, %(fence)s, %(worker)s, e.detail
    FROM operation,
         (VALUES (0, 'effect.prepared', %(detail)s),
                 (1, 'effect.dispatching', %(dispatching_detail)s)) AS e (dispatches, kind, detail)
    WHERE e.dispatches <= operation.dispatch_count
    ORDER BY e.dispatches
)
SELECT operation.*, owned.history, owned.history_soft_limit, owned.history_hard_limit,
       owned.history_warned_at
FROM owned, operation;

-- name: mark_dispatching
-- "Dispatch may have happened", committed before the call in the statement that checks the
-- fence: a stale worker can never reach dispatching. Remembers the first dispatch time and
-- the last (which nothing clears: a prune keeps what an owner may remember). Only
-- for an operation still to be sent, or uncertain, and that needs no approval — unless `gate`:
-- the caller checks the approvals in this statement's transaction. Otherwise nothing is
-- written and no row returned, as for a refused fence (fence_state tells which). An operation
-- already prepared is sent whatever the history: never held to its limit.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
-- the family's claim on the operation, taken first — a racing claim waits for the row, then
-- re-checks the condition against the row as committed (READ COMMITTED): never two holders;
-- another run of the family holding it refuses the whole statement (family_refusal tells)
claimed AS (
    INSERT INTO safepoint_family_claims (family_id, claim_key, run_id, operation_id, sent)
    SELECT COALESCE(r.family_id, r.run_id), o.family_key, r.run_id, o.operation_id, true
    FROM clock, safepoint_runs AS r
    JOIN safepoint_operations AS o ON o.run_id = r.run_id AND o.operation_id = %(operation_id)s
    -- owned's conditions, as this statement sees the rows: a claim is never taken for a write
    -- they refuse (a later member would find nothing sent to take)
    WHERE r.run_id = %(run_id)s AND r.fence = %(fence)s AND r.status = 'running'
      AND r.cancel_requested_at IS NULL AND (r.deadline_at IS NULL OR r.deadline_at > clock.now)
      AND o.family_key IS NOT NULL AND o.state IN ('prepared', 'dispatching', 'unknown')
      AND (%(gate)s OR NOT o.approval_required)
    ON CONFLICT (family_id, claim_key) DO UPDATE
    SET run_id = EXCLUDED.run_id, operation_id = EXCLUDED.operation_id, sent = true
    WHERE NOT safepoint_family_claims.sent
       OR (safepoint_family_claims.run_id = EXCLUDED.run_id
           AND safepoint_family_claims.operation_id = EXCLUDED.operation_id)
    RETURNING run_id
),
owned AS (
    UPDATE safepoint_runs
    SET state_revision = state_revision + 1, lease_expires_at = clock.now + %(lease_ms)s,
        event_count = event_count + 1, updated_at = clock.now
    FROM clock
    WHERE run_id = %(run_id)s AND fence = %(fence)s AND status = 'running'
      -- new work: none once a cancel is asked for, none past the deadline
      AND cancel_requested_at IS NULL AND (deadline_at IS NULL OR deadline_at > clock.now)
      -- an operation to dispatch (read before the lock is taken: only the holder of this
      -- run's fence changes it), whose family's claim this run holds
      AND EXISTS (SELECT 1 FROM safepoint_operations
                  WHERE run_id = %(run_id)s AND operation_id = %(operation_id)s
                    AND state IN ('prepared', 'dispatching', 'unknown')
                    AND (%(gate)s OR NOT approval_required)
                    AND (family_key IS NULL OR EXISTS (SELECT 1 FROM claimed)))
    RETURNING run_id, updated_at AS now, event_count + step_count AS history,
              history_soft_limit, history_hard_limit, history_warned_at
),
operation AS (
    UPDATE safepoint_operations AS o
    SET state = 'dispatching', dispatch_count = o.dispatch_count + 1,
        first_dispatched_at = COALESCE(o.first_dispatched_at, owned.now),
        last_dispatched_at = owned.now, fence = %(fence)s, updated_at = owned.now
    FROM owned
    -- the key as given, not owned.run_id: a primary-key probe whatever the planner's
    -- statistics (joined on owned, a young table's operations were scanned); owned only
    -- conditions the write
    WHERE o.run_id = %(run_id)s AND o.operation_id = %(operation_id)s
      AND o.state IN ('prepared', 'dispatching', 'unknown')
    RETURNING o.*
),
event AS (
    INSERT INTO safepoint_events (run_id, at, kind, step_id, operation_id, fence, worker, detail)
    SELECT run_id, updated_at, 'effect.dispatching', step_id, operation_id, %(fence)s,
           %(worker)s, json_build_object('dispatch', dispatch_count)::text
    FROM operation
)
SELECT operation.*, owned.history, owned.history_soft_limit, owned.history_hard_limit,
       owned.history_warned_at
FROM owned, operation;

-- name: record_outcome
-- Fence and record the evidence of one dispatch: applied (receipt), rejected or unknown
-- (error), or accepted — with acceptance, the effect's step row too (step_id not NULL), its
-- result stored as an artifact when large (result_content). Only for an operation the run
-- has: otherwise nothing is written and no row returned, as for a refused fence (fence_state
-- tells which). Neither a cancel request, the deadline nor the history limit refuses it: what
-- happened is always recorded.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
owned AS (
    UPDATE safepoint_runs
    SET state_revision = state_revision + 1, lease_expires_at = clock.now + %(lease_ms)s,
        event_count = event_count + 1,
        -- the step row is new history unless this step id has one (a primary-key probe)
        step_count = step_count + CASE WHEN %(step_id)s::text IS NULL OR EXISTS (
                                           SELECT 1 FROM safepoint_steps
                                           WHERE run_id = %(run_id)s AND step_id = %(step_id)s)
                                       THEN 0 ELSE 1 END,
        updated_at = clock.now
    FROM clock
    WHERE run_id = %(run_id)s AND fence = %(fence)s AND status = 'running'
      -- the operation to record it on
      AND EXISTS (SELECT 1 FROM safepoint_operations
                  WHERE run_id = %(run_id)s AND operation_id = %(operation_id)s)
    RETURNING run_id, updated_at AS now, event_count + step_count AS history,
              history_soft_limit, history_hard_limit, history_warned_at
),
operation AS (
    UPDATE safepoint_operations AS o
    SET state = %(state)s, receipt = COALESCE(%(receipt)s::text, o.receipt), error = %(error)s,
        fence = %(fence)s, updated_at = owned.now
    FROM owned
    WHERE o.run_id = %(run_id)s AND o.operation_id = %(operation_id)s  -- a key probe, as above
    RETURNING o.run_id, owned.now
),
-- a dispatch that provably never left: the family's claim on it goes back (any other outcome
-- keeps it here: a request this run sent may still arrive, and only its key absorbs that)
released AS (
    UPDATE safepoint_family_claims SET sent = false
    WHERE %(not_sent)s AND run_id = %(run_id)s AND operation_id = %(operation_id)s
      AND EXISTS (SELECT 1 FROM owned)
),
-- a large step result, stored once whoever stores it; only with the outcome (FROM operation)
artifact AS (
    INSERT INTO safepoint_artifacts (run_id, digest, size, content, created_at)
    SELECT run_id, %(result_ref)s, %(result_size)s, %(result_content)s::bytea, now FROM operation
    WHERE %(result_content)s::bytea IS NOT NULL
    ON CONFLICT (run_id, digest) DO UPDATE SET size = EXCLUDED.size WHERE false
),
step AS (
    INSERT INTO safepoint_steps (run_id, step_id, seq, kind, name, input_hash, status, result,
                                 result_ref, error, next_step_id, attempt, model_id,
                                 prompt_hash, observed_at, operation_id, fence, recorded_at)
    SELECT run_id, %(step_id)s, %(seq)s::integer, %(kind)s, %(name)s, %(input_hash)s,
           %(step_status)s, %(result)s, %(result_ref)s, %(step_error)s, %(next_step_id)s,
           %(attempt)s::integer, %(model_id)s, %(prompt_hash)s, %(observed_at)s::bigint,
           %(step_operation_id)s, %(fence)s::bigint, now
    FROM operation
    WHERE %(step_id)s::text IS NOT NULL
    ON CONFLICT (run_id, step_id) DO UPDATE SET
        kind = excluded.kind, name = excluded.name, input_hash = excluded.input_hash,
        status = excluded.status, result = excluded.result, result_ref = excluded.result_ref,
        error = excluded.error, next_step_id = excluded.next_step_id,
        attempt = excluded.attempt, model_id = excluded.model_id,
        prompt_hash = excluded.prompt_hash, observed_at = excluded.observed_at,
        operation_id = excluded.operation_id, fence = excluded.fence,
        recorded_at = excluded.recorded_at
),
event AS (
    INSERT INTO safepoint_events (event_id, run_id, at, kind, step_id, operation_id, fence,
                                  worker, detail)
    OVERRIDING SYSTEM VALUE
    SELECT coalesce(%(event_id)s::bigint, nextval('safepoint_events_event_id_seq')),
           run_id, now, %(event_kind)s, %(step_id)s, %(operation_id)s, %(fence)s,
           %(worker)s, %(detail)s
    FROM operation
)
SELECT * FROM owned;

-- name: finish_run
-- End the run (completed, failed, blocked, or stopped at a limit), release ownership and log it. A recovery record
-- gets the revision this very statement creates, spliced in as text so the stored record is
-- exactly the JSON the worker wrote (the worker leaves state_revision out of it).
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
finished AS (
    UPDATE safepoint_runs
    SET status = %(status)s, result = %(result)s, result_ref = %(result_ref)s,
        error = %(error)s,
        recovery_record = CASE
            WHEN %(recovery_record)s::text IS NULL THEN NULL
            WHEN %(recovery_record)s::text = '{}'
                THEN '{"state_revision":' || (state_revision + 1) || '}'
            ELSE '{"state_revision":' || (state_revision + 1) || ','
                 || substr(%(recovery_record)s::text, 2)
            END,
        owner = NULL, lease_expires_at = NULL,
        state_revision = state_revision + 1, event_count = event_count + 1,
        updated_at = clock.now
    FROM clock
    WHERE run_id = %(run_id)s AND fence = %(fence)s AND status = 'running'
    RETURNING run_id, updated_at AS now
),
event AS (
    INSERT INTO safepoint_events (event_id, run_id, at, kind, fence, worker, detail)
    OVERRIDING SYSTEM VALUE
    SELECT coalesce(%(event_id)s::bigint, nextval('safepoint_events_event_id_seq')),
           run_id, now, %(event_kind)s, %(fence)s, %(worker)s, %(detail)s FROM finished
)
SELECT now FROM finished;

-- name: release_run
-- Give up ownership without changing the status (a graceful stop); only the holder can. The
-- run becomes claimable at once (claim_next takes running runs without a lease). The fence
-- moves on: a write the holder issued before letting go (a fan-out branch paused before its
-- statement) is refused as stale when it lands — a running run with no owner accepts none.
UPDATE safepoint_runs
SET owner = NULL, fence = fence + 1, lease_expires_at = NULL, state_revision = state_revision + 1,
    updated_at = safepoint_now_ms()
WHERE run_id = %(run_id)s AND fence = %(fence)s AND status = 'running'
RETURNING workflow;

-- name: load_ledger_steps
-- Every recorded step of a run, in the order they were first recorded.
SELECT * FROM safepoint_steps WHERE run_id = %(run_id)s ORDER BY seq;

-- name: load_ledger_operations
-- Every effect operation of a run.
SELECT * FROM safepoint_operations WHERE run_id = %(run_id)s
ORDER BY prepared_at, operation_id;

-- name: events
-- A run's history, oldest first.
SELECT * FROM safepoint_events WHERE run_id = %(run_id)s ORDER BY event_id;

-- name: insert_artifact
-- Content-addressed, kept with the run that stores it: the same bytes are stored once per run.
-- Every store of an artifact locks its row (an upsert that updates nothing), so that a prune
-- deleting it waits for the reference this transaction writes with it
-- (prune_lock_artifacts); the same is true of every artifact insert.
INSERT INTO safepoint_artifacts (run_id, digest, size, content, created_at)
VALUES (%(run_id)s, %(digest)s, %(size)s, %(content)s, safepoint_now_ms())
ON CONFLICT (run_id, digest) DO UPDATE SET size = EXCLUDED.size WHERE false;

-- name: get_artifact
-- The bytes stored under a digest, by whichever run stored them (the same bytes: the caller
-- checks them against the digest); a fork reads its source's this way.
SELECT content FROM safepoint_artifacts WHERE digest = %(digest)s LIMIT 1;

-- name: replan
-- Re-plan, fenced: renew the lease, take this code's version and fingerprint when given (the
-- old ones stay in the event), and append the run.replanned event. Re-planning is new work:
-- refused once a cancel is asked for or the deadline passed.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
owned AS (
    UPDATE safepoint_runs
    SET state_revision = state_revision + 1, lease_expires_at = clock.now + %(lease_ms)s,
        event_count = event_count + 1, updated_at = clock.now,
        workflow_version = COALESCE(%(workflow_version)s, workflow_version),
        workflow_fingerprint = CASE WHEN %(workflow_version)s::text IS NULL
                               THEN workflow_fingerprint ELSE %(workflow_fingerprint)s END,
        workflow_manifest = CASE WHEN %(workflow_version)s::text IS NULL
                            THEN workflow_manifest ELSE %(workflow_manifest)s END
    FROM clock
    WHERE run_id = %(run_id)s AND fence = %(fence)s AND status = 'running'
      AND cancel_requested_at IS NULL AND (deadline_at IS NULL OR deadline_at > clock.now)
    RETURNING run_id, updated_at AS now
),
event AS (
    INSERT INTO safepoint_events (run_id, at, kind, step_id, operation_id, fence, worker, detail)
    SELECT run_id, now, 'run.replanned', %(step_id)s, %(operation_id)s, %(fence)s, %(worker)s,
           %(detail)s
    FROM owned
)
SELECT now FROM owned;

-- name: replan_abandon_steps
-- Re-plan: the stale tail — the step at step_id and every non-effect step recorded after it,
-- up to through_seq, but those in keep (a fan-out sibling branch's) — moves into the history,
-- one step.abandoned event each, with what it had recorded (counted among the events, no longer
-- among the steps), each event's row returned (a sealed ledger binds the step's sealed values
-- to it). Runs after the fenced `replan` statement, in its transaction (which holds the run
-- row's lock).
WITH stale AS (
    DELETE FROM safepoint_steps
    WHERE run_id = %(run_id)s
      AND seq >= (SELECT seq FROM safepoint_steps
                  WHERE run_id = %(run_id)s AND step_id = %(step_id)s)
      AND seq <= %(through_seq)s AND (kind <> ALL(%(kept)s::text[]) OR step_id = %(step_id)s)
      AND NOT (step_id = ANY(%(keep)s::text[]))
    RETURNING *
),
moved AS (
    INSERT INTO safepoint_events (run_id, at, kind, step_id, operation_id, fence, worker, detail)
    SELECT run_id, safepoint_now_ms(), 'step.abandoned', step_id, operation_id, %(fence)s,
           %(worker)s,
           jsonb_build_object('kind', kind, 'name', name, 'seq', seq, 'input_hash', input_hash,
                              'status', status, 'result', result::jsonb,
                              'result_ref', result_ref, 'error', error::jsonb,
                              'next_step_id', next_step_id, 'attempt', attempt,
                              'recorded_at', recorded_at, 'recorded_fence', fence,
                              'reason', %(reason)s::text)::text
    FROM (SELECT * FROM stale ORDER BY seq) ordered
    RETURNING event_id, run_id, kind, step_id, detail
),
counted AS (
    UPDATE safepoint_runs SET event_count = event_count + (SELECT count(*) FROM moved),
                              step_count = step_count - (SELECT count(*) FROM stale)
    WHERE run_id = %(run_id)s
)
SELECT * FROM moved ORDER BY event_id;


-- name: record_attempt
-- Fence and record a failed attempt that will be tried again, durable before the back-off.
-- A retry is new work: refused once a cancel is asked for or the deadline passed.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
owned AS (
    UPDATE safepoint_runs
    SET state_revision = state_revision + 1, lease_expires_at = clock.now + %(lease_ms)s,
        updated_at = clock.now
    FROM clock
    WHERE run_id = %(run_id)s AND fence = %(fence)s AND status = 'running'
      AND cancel_requested_at IS NULL AND (deadline_at IS NULL OR deadline_at > clock.now)
    RETURNING run_id, updated_at AS now
),
attempt AS (
    INSERT INTO safepoint_attempts (run_id, step_id, attempt, kind, name, input_hash, error,
                                    retry_at, fence, recorded_at)
    SELECT run_id, %(step_id)s, %(attempt)s::integer, %(kind)s, %(name)s, %(input_hash)s,
           %(error)s, %(retry_at)s::bigint, %(fence)s::bigint, now
    FROM owned
)
SELECT now FROM owned;

-- name: load_ledger_attempts
-- Every failed attempt of a run's steps, by step and attempt.
SELECT * FROM safepoint_attempts WHERE run_id = %(run_id)s ORDER BY step_id, attempt;

-- name: await_approval
-- The approval gate (or prepare): the operation is dispatched only under an approval, and its
-- target's state was last seen as target_digest. Only an operation still to be dispatched.
-- (Run after a fenced statement of the same transaction, which holds the runs row lock.)
UPDATE safepoint_operations
SET approval_required = true, target_digest = %(target_digest)s,
    updated_at = safepoint_now_ms()
WHERE run_id = %(run_id)s AND operation_id = %(operation_id)s
  AND state IN ('prepared', 'dispatching', 'unknown')
RETURNING *;

-- name: await_approval_fence
-- The fence alone, for a write that starts something new and decides in several statements
-- (the approval gate): takes the runs row lock for the rest of the transaction, so an approval
-- given meanwhile queues behind it, or is seen by the statements that follow.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now)
UPDATE safepoint_runs
SET state_revision = state_revision + 1, lease_expires_at = clock.now + %(lease_ms)s,
    updated_at = clock.now
FROM clock
WHERE run_id = %(run_id)s AND fence = %(fence)s AND status = 'running'
  AND cancel_requested_at IS NULL AND (deadline_at IS NULL OR deadline_at > clock.now)
RETURNING run_id, updated_at AS now;

-- name: approvals_of_operation
-- Every approval given for one operation, in the order they were given.
SELECT * FROM safepoint_approvals
WHERE run_id = %(run_id)s AND operation_id = %(operation_id)s
ORDER BY seq;

-- name: approvals
-- Every approval given in a run, in the order they were given.
SELECT * FROM safepoint_approvals WHERE run_id = %(run_id)s ORDER BY seq;

-- name: wait_for_approval
-- No approval authorizes the dispatch: the run waits, released, with what it waits for, and
-- the event says so (on a sealed ledger each sealed for its own row: %(event_id)s, see
-- next_event_id).
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
waiting AS (
    UPDATE safepoint_runs
    SET status = 'waiting', owner = NULL, lease_expires_at = NULL,
        waiting_for = %(waiting_for)s, state_revision = state_revision + 1,
        event_count = event_count + 1, updated_at = clock.now
    FROM clock
    WHERE run_id = %(run_id)s AND fence = %(fence)s AND status = 'running'
    RETURNING run_id, updated_at AS now
),
event AS (
    INSERT INTO safepoint_events (event_id, run_id, at, kind, step_id, operation_id, fence,
                                  worker, detail)
    OVERRIDING SYSTEM VALUE
    SELECT coalesce(%(event_id)s::bigint, nextval('safepoint_events_event_id_seq')),
           run_id, now, 'run.waiting', %(step_id)s, %(operation_id)s, %(fence)s, %(worker)s,
           %(detail)s
    FROM waiting
)
SELECT now FROM waiting;

-- name: mark_dispatching_approved
-- Keep the approval that authorized this dispatch on the operation.
UPDATE safepoint_operations SET approval_id = %(approval_id)s
WHERE run_id = %(run_id)s AND operation_id = %(operation_id)s;

-- name: lock_run
-- One run, its row locked until the transaction ends: approvals queue behind the gate.
SELECT * FROM safepoint_runs WHERE run_id = %(run_id)s FOR UPDATE;

-- name: operation_of_step
-- The operation an effect step prepared.
SELECT * FROM safepoint_operations WHERE run_id = %(run_id)s AND step_id = %(step_id)s;

-- name: approve
-- A person's approval, bound to the payload and target digests it was given for.
INSERT INTO safepoint_approvals (approval_id, run_id, operation_id, step_id, payload_digest,
                                 target_digest, approved_by, evidence, approved_at, expires_at)
VALUES (%(approval_id)s, %(run_id)s, %(operation_id)s, %(step_id)s, %(payload_digest)s,
        %(target_digest)s, %(approved_by)s, %(evidence)s, %(approved_at)s, %(expires_at)s);

-- name: approve_run
-- An approval moves the run's revision and is appended as an event; a run waiting for that
-- very operation is released: pending, so a worker (or a resume) carries it on.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
run AS (
    UPDATE safepoint_runs
    SET status = CASE WHEN %(release)s THEN 'pending' ELSE status END,
        waiting_for = CASE WHEN %(release)s THEN NULL ELSE waiting_for END,
        state_revision = state_revision + 1, event_count = event_count + 1,
        updated_at = clock.now
    FROM clock
    WHERE run_id = %(run_id)s
    RETURNING run_id, workflow, updated_at AS now
),
event AS (
    INSERT INTO safepoint_events (event_id, run_id, at, kind, step_id, operation_id, worker,
                                  detail)
    OVERRIDING SYSTEM VALUE
    SELECT coalesce(%(event_id)s::bigint, nextval('safepoint_events_event_id_seq')),
           run_id, now, 'effect.approved', %(step_id)s, %(operation_id)s, %(by)s, %(detail)s
    FROM run
)
SELECT workflow FROM run;

-- name: revoke_approval
-- A person takes back every approval of one operation still in force (it authorizes nothing
-- from now on; the rows stay, as evidence); the run's revision moves and the event is
-- appended, its status stays (the gate decides whether the run waits). Run under the runs row
-- lock (lock_run), as the dispatch of the operation is: whichever commits first wins. The
-- reason is %(revoke_reason)s, or on a sealed ledger each row's own (%(sealed_reasons)s, a JSON
-- object by approval id: sealed for the row).
WITH revoked AS (
    UPDATE safepoint_approvals
    SET revoked_at = %(now)s, revoked_by = %(revoked_by)s,
        revoke_reason = coalesce(%(sealed_reasons)s::jsonb ->> approval_id, %(revoke_reason)s)
    WHERE run_id = %(run_id)s AND operation_id = %(operation_id)s AND revoked_at IS NULL
    RETURNING approval_id
),
run AS (
    UPDATE safepoint_runs
    SET state_revision = state_revision + 1, event_count = event_count + 1,
        updated_at = %(now)s
    WHERE run_id = %(run_id)s
    RETURNING run_id
)
INSERT INTO safepoint_events (event_id, run_id, at, kind, step_id, operation_id, worker,
                              detail)
OVERRIDING SYSTEM VALUE
SELECT coalesce(%(event_id)s::bigint, nextval('safepoint_events_event_id_seq')),
       run_id, %(now)s, 'effect.approval_revoked', %(step_id)s, %(operation_id)s,
       %(revoked_by)s, %(detail)s
FROM run;

-- name: reprepare_effect
-- Fence, then give an operation that never left (prepared) a new payload: same key (never
-- sent), new payload and target digests — to be approved anew where it needs approval (a
-- changed payload, or a re-plan). No operation row
-- (`operation_id` NULL) means it cannot take one. (The payload artifact is inserted just
-- before, in the same transaction.)
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
owned AS (
    UPDATE safepoint_runs
    SET state_revision = state_revision + 1, lease_expires_at = clock.now + %(lease_ms)s,
        event_count = event_count + 1, updated_at = clock.now
    FROM clock
    WHERE run_id = %(run_id)s AND fence = %(fence)s AND status = 'running'
      AND cancel_requested_at IS NULL AND (deadline_at IS NULL OR deadline_at > clock.now)
    RETURNING run_id, updated_at AS now
),
operation AS (
    UPDATE safepoint_operations AS o
    SET payload_ref = %(payload_ref)s, target_digest = %(target_digest)s, fence = %(fence)s,
        updated_at = owned.now
    FROM owned
    WHERE o.run_id = %(run_id)s AND o.operation_id = %(operation_id)s  -- a key probe
      AND o.state = 'prepared'
    RETURNING o.run_id, o.operation_id, owned.now
),
event AS (
    INSERT INTO safepoint_events (run_id, at, kind, step_id, operation_id, fence, worker, detail)
    SELECT run_id, now, 'effect.prepared', %(step_id)s, operation_id, %(fence)s, %(worker)s,
           %(detail)s
    FROM operation
)
SELECT operation.operation_id FROM owned LEFT JOIN operation ON true;
-- name: record_history_warning
-- The run's history crossed its soft limit: remember when (so it is recorded once), count and
-- append the run.history_warning event. Runs after the write that crossed it, in the same
-- transaction, which holds the runs row lock since that write; only the fence holder writes it.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
warned AS (
    UPDATE safepoint_runs
    SET history_warned_at = clock.now, event_count = event_count + 1
    FROM clock
    WHERE run_id = %(run_id)s AND fence = %(fence)s AND status = 'running'
      AND history_warned_at IS NULL
    RETURNING run_id, history_warned_at AS now, event_count + step_count AS history,
              history_soft_limit, history_hard_limit
),
event AS (
    INSERT INTO safepoint_events (run_id, at, kind, fence, worker, detail)
    SELECT run_id, now, 'run.history_warning', %(fence)s, %(worker)s,
           json_build_object('history', history, 'soft', history_soft_limit,
                             'hard', history_hard_limit)::text
    FROM warned
)
SELECT * FROM warned;

-- name: continue_as_new
-- Continue as new, in one statement: the run ends 'continued', pointing at its successor, and
-- gives up ownership (fenced like new work: refused once a cancel is asked for or the deadline
-- passed; never held to the history limit); the successor is created in the next place of the run's chain, claimed
-- by the continuing worker, with the carried state as its inputs; both get their event.
-- No row: the fence refused it. `successor` NULL: the successor's id is taken already.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
ended AS (
    UPDATE safepoint_runs
    SET status = 'continued', successor_run_id = %(successor_run_id)s, owner = NULL,
        lease_expires_at = NULL, state_revision = state_revision + 1,
        event_count = event_count + 1, updated_at = clock.now
    FROM clock
    WHERE run_id = %(run_id)s AND fence = %(fence)s AND status = 'running'
      AND cancel_requested_at IS NULL AND (deadline_at IS NULL OR deadline_at > clock.now)
    RETURNING run_id, chain_id, chain_index, updated_at AS now,
              COALESCE(family_id, run_id) AS family_id, family_generation
),
created AS (
    INSERT INTO safepoint_runs (run_id, workflow, workflow_version, status, input_hash, inputs,
                                inputs_ref, state_revision, owner, lease_expires_at, fence,
                                resume_count, event_count, resume_budget, history_soft_limit,
                                history_hard_limit, chain_id, chain_index, parent_run_id,
                                created_at, updated_at, workflow_fingerprint,
                                workflow_manifest, deadline_at, token_budget, cost_budget,
                                step_attempts, model_call_budget, step_attempt_limit,
                                family_id, family_generation)
    SELECT %(successor_run_id)s, %(workflow)s, %(workflow_version)s,
           CASE WHEN %(owner)s::text IS NULL THEN 'pending' ELSE 'running' END,
           %(input_hash)s, %(inputs)s, %(inputs_ref)s, 1, %(owner)s,
           CASE WHEN %(owner)s::text IS NULL THEN NULL
                ELSE ended.now + %(successor_lease_ms)s END,
           CASE WHEN %(owner)s::text IS NULL THEN 0 ELSE 1 END,
           0, 1, %(resume_budget)s, %(history_soft_limit)s, %(history_hard_limit)s,
           ended.chain_id, ended.chain_index + 1, ended.run_id, ended.now, ended.now,
           %(workflow_fingerprint)s, %(workflow_manifest)s,
           COALESCE(%(deadline_at)s::bigint, ended.now + %(deadline_ms)s::bigint),
           %(token_budget)s::bigint, %(cost_budget)s::double precision, %(step_attempts)s,
           %(model_call_budget)s, %(step_attempt_limit)s, ended.family_id,
           ended.family_generation + 1
    FROM ended
    ON CONFLICT (run_id) DO NOTHING
    RETURNING run_id, fence, owner, lease_expires_at, created_at
),
parent_event AS (
    INSERT INTO safepoint_events (run_id, at, kind, fence, worker, detail)
    SELECT run_id, now, 'run.continued', %(fence)s, %(worker)s, %(parent_detail)s FROM ended
),
successor_event AS (
    INSERT INTO safepoint_events (run_id, at, kind, fence, worker, detail)
    SELECT run_id, created_at,
           CASE WHEN owner IS NULL THEN 'run.submitted' ELSE 'run.started' END, fence, owner,
           %(detail)s
    FROM created
)
SELECT ended.run_id, created.run_id AS successor, created.lease_expires_at
FROM ended LEFT JOIN created ON true;

-- name: chain_operation
-- An operation as an earlier run of the chain settled it: a successor's effect ledger, found
-- in place (index safepoint_operations_chain), never copied.
SELECT * FROM safepoint_operations
WHERE chain_id = %(chain_id)s AND operation_id = %(operation_id)s
  AND state IN ('accepted', 'rejected')
ORDER BY prepared_at DESC
LIMIT 1;

-- name: record_step
-- record_steps for one step whose result is inline (the durable step: a read, a model call, a
-- decision, each written before the next): the same writes, from scalar parameters. Measured
-- executed alone on one prepared connection, it takes 0.6x the server CPU of record_steps with a
-- batch of one — no JSON to parse into a record set, no set to join, no artifacts part to start
-- (docs/benchmarks.md). A new step grows the history, held to the hard limit, as in a batch.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
growth AS (
    SELECT CASE WHEN (SELECT true FROM safepoint_steps s
                      WHERE s.run_id = %(run_id)s AND s.step_id = %(step_id)s) IS NULL
                THEN 1 ELSE 0 END AS steps
),
owned AS (
    UPDATE safepoint_runs
    SET state_revision = state_revision + 1, lease_expires_at = clock.now + %(lease_ms)s,
        step_count = step_count + growth.steps, updated_at = clock.now,
        tokens_spent = tokens_spent + COALESCE(%(tokens)s::bigint, 0),
        cost_spent = cost_spent + COALESCE(%(cost)s::double precision, 0),
        model_calls_spent = model_calls_spent + CASE WHEN %(model_call)s THEN 1 ELSE 0 END
    FROM clock, growth
    WHERE run_id = %(run_id)s AND fence = %(fence)s AND status = 'running'
      AND cancel_requested_at IS NULL AND (deadline_at IS NULL OR deadline_at > clock.now)
      AND (history_hard_limit IS NULL
           OR event_count + step_count + growth.steps <= history_hard_limit)
    RETURNING run_id, updated_at AS now, event_count + step_count AS history,
              history_soft_limit, history_hard_limit, history_warned_at
),
step AS (
    INSERT INTO safepoint_steps (run_id, step_id, seq, kind, name, input_hash, status, result,
                                 result_ref, error, next_step_id, attempt, model_id,
                                 prompt_hash, observed_at, operation_id, fence, recorded_at,
                                 tokens, cost)
    SELECT owned.run_id, %(step_id)s, %(seq)s, %(kind)s, %(name)s, %(input_hash)s, %(step_status)s,
           %(result)s, %(result_ref)s, %(step_error)s, %(next_step_id)s, %(attempt)s, %(model_id)s,
           %(prompt_hash)s, %(observed_at)s, %(step_operation_id)s, %(fence)s::bigint, owned.now,
           %(tokens)s, %(cost)s
    FROM owned
    ON CONFLICT (run_id, step_id) DO UPDATE SET
        kind = excluded.kind, name = excluded.name, input_hash = excluded.input_hash,
        status = excluded.status, result = excluded.result, result_ref = excluded.result_ref,
        error = excluded.error, next_step_id = excluded.next_step_id,
        attempt = excluded.attempt, model_id = excluded.model_id,
        prompt_hash = excluded.prompt_hash, observed_at = excluded.observed_at,
        operation_id = excluded.operation_id, fence = excluded.fence,
        recorded_at = excluded.recorded_at, tokens = excluded.tokens, cost = excluded.cost
)
SELECT * FROM owned;

-- name: record_steps
-- Fence, renew the lease and record a batch of steps (one, or pure steps written lazily with the
-- next step of the run), in one statement. Recording a step id again (a re-read of an expired
-- observation, a re-plan) replaces every recorded field and keeps the seq (the worker numbers
-- steps: it alone writes them while its fence holds). What model steps spent (tokens, cost, and
-- the model calls themselves: turns) is added to the run's totals in the same statement: a
-- restart never resets them. New steps grow the history,
-- and are refused when that would take it past the run's hard limit. The batch is JSON, one
-- object per step.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
batch AS (
    SELECT * FROM jsonb_to_recordset(%(steps)s::jsonb) AS b(
        step_id text, seq integer, kind text, model_call boolean, name text, input_hash text,
        step_status text,
        result text, result_ref text, step_error text, next_step_id text, attempt integer,
        model_id text, prompt_hash text, observed_at bigint, step_operation_id text,
        tokens bigint, cost double precision)
),
-- A scalar subquery, one primary-key probe per batch row: NOT EXISTS let the planner choose a
-- hash anti-join that read every step of the run on each write, quadratic over a run.
growth AS (
    SELECT count(*) AS steps FROM batch WHERE (
        SELECT true FROM safepoint_steps s
        WHERE s.run_id = %(run_id)s AND s.step_id = batch.step_id) IS NULL
),
owned AS (
    UPDATE safepoint_runs
    SET state_revision = state_revision + 1, lease_expires_at = clock.now + %(lease_ms)s,
        step_count = step_count + growth.steps, updated_at = clock.now,
        tokens_spent = tokens_spent + (SELECT COALESCE(sum(tokens), 0) FROM batch),
        cost_spent = cost_spent + (SELECT COALESCE(sum(cost), 0) FROM batch),
        model_calls_spent = model_calls_spent
                            + (SELECT count(*) FROM batch WHERE model_call)
    FROM clock, growth
    WHERE run_id = %(run_id)s AND fence = %(fence)s AND status = 'running'
      -- new work: none once a cancel is asked for, none past the deadline
      AND cancel_requested_at IS NULL AND (deadline_at IS NULL OR deadline_at > clock.now)
      AND (history_hard_limit IS NULL
           OR event_count + step_count + growth.steps <= history_hard_limit)
    RETURNING run_id, updated_at AS now, event_count + step_count AS history,
              history_soft_limit, history_hard_limit, history_warned_at
),
-- large step results, stored once whoever stores them; only past the fence (FROM owned), so
-- that a refused write leaves nothing behind
artifacts AS (
    INSERT INTO safepoint_artifacts (run_id, digest, size, content, created_at)
    SELECT DISTINCT ON (a.digest) owned.run_id, a.digest, octet_length(a.content), a.content,
           owned.now
    FROM owned, unnest(%(artifact_refs)s::text[], %(artifact_contents)s::bytea[])
        AS a(digest, content)
    ON CONFLICT (run_id, digest) DO UPDATE SET size = EXCLUDED.size WHERE false
),
step AS (
    INSERT INTO safepoint_steps (run_id, step_id, seq, kind, name, input_hash, status, result,
                                 result_ref, error, next_step_id, attempt, model_id,
                                 prompt_hash, observed_at, operation_id, fence, recorded_at,
                                 tokens, cost)
    SELECT owned.run_id, b.step_id, b.seq, b.kind, b.name, b.input_hash, b.step_status,
           b.result, b.result_ref, b.step_error, b.next_step_id, b.attempt, b.model_id,
           b.prompt_hash, b.observed_at, b.step_operation_id, %(fence)s::bigint, owned.now,
           b.tokens, b.cost
    FROM owned, batch AS b
    ON CONFLICT (run_id, step_id) DO UPDATE SET
        kind = excluded.kind, name = excluded.name, input_hash = excluded.input_hash,
        status = excluded.status, result = excluded.result, result_ref = excluded.result_ref,
        error = excluded.error, next_step_id = excluded.next_step_id,
        attempt = excluded.attempt, model_id = excluded.model_id,
        prompt_hash = excluded.prompt_hash, observed_at = excluded.observed_at,
        operation_id = excluded.operation_id, fence = excluded.fence,
        recorded_at = excluded.recorded_at, tokens = excluded.tokens, cost = excluded.cost
)
SELECT * FROM owned;

-- name: sealed_since
-- Whether the ledger holds values sealed by a codec (safepoint.storage.codec): the event a store
-- with one leaves on open, once, under run id '' (no run's), naming the key it first sealed with
-- (a rotation, safepoint keys reencrypt, names its new key there).
SELECT detail FROM safepoint_events WHERE run_id = '' AND kind = 'ledger.sealed' LIMIT 1;

-- name: mark_sealed
-- Mark the ledger as holding sealed values (see sealed_since), unless it is already.
INSERT INTO safepoint_events (run_id, at, kind, detail)
SELECT '', safepoint_now_ms(), 'ledger.sealed', %(detail)s
WHERE NOT EXISTS (SELECT 1 FROM safepoint_events WHERE run_id = '' AND kind = 'ledger.sealed');

-- name: ledger_identity
-- The ledger's id and since when effect keys include it (migration 1), read once on open.
SELECT ledger_id, keyed_since FROM safepoint_ledger WHERE singleton = 1;

-- == carrying a stopped run on: limits (stopped runs, extend_limits) ==========================

-- name: stop_run_limits
-- A worker stopping its run at a limit: whether its fence holds, and the limits as they stand,
-- to compare with those it last read (a person may have raised one since). The row lock is held
-- until the stop (finish_run, status 'stopped') commits in the same transaction, so a change of
-- limits waits for it, or it waits for the change and then sees it.
SELECT fence, status, token_budget, cost_budget, model_call_budget, deadline_at,
       step_attempt_limit, resume_budget
FROM safepoint_runs WHERE run_id = %(run_id)s FOR UPDATE;

-- name: extend_limits
-- A person's new limits, compare-and-set on the revision they were asked at (the row is locked
-- by lock_run in the same transaction), with the run.limits_extended event; what was spent
-- stays. A stopped run becomes pending (its error and recovery record cleared: workers take it
-- again); any other run keeps its status. SET reads the row as it was, so each CASE sees the
-- old status.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
run AS (
    UPDATE safepoint_runs
    SET token_budget = %(tokens)s::bigint, cost_budget = %(cost)s::double precision,
        model_call_budget = %(model_calls)s::integer, deadline_at = %(deadline)s::bigint,
        step_attempt_limit = %(step_attempts)s::integer,
        resume_budget = %(resume_budget)s::integer,
        status = CASE WHEN status = 'stopped' THEN 'pending' ELSE status END,
        error = CASE WHEN status = 'stopped' THEN NULL ELSE error END,
        recovery_record = CASE WHEN status = 'stopped' THEN NULL ELSE recovery_record END,
        state_revision = state_revision + 1, event_count = event_count + 1,
        updated_at = clock.now
    FROM clock
    WHERE run_id = %(run_id)s AND state_revision = %(expected_revision)s
      AND status IN ('pending', 'running', 'waiting', 'blocked', 'stopped')
    RETURNING run_id, updated_at AS now
),
event AS (
    INSERT INTO safepoint_events (event_id, run_id, at, kind, worker, detail)
    OVERRIDING SYSTEM VALUE
    SELECT coalesce(%(event_id)s::bigint, nextval('safepoint_events_event_id_seq')),
           run_id, now, 'run.limits_extended', %(by)s, %(detail)s FROM run
)
SELECT run_id FROM run;

-- == carrying a stopped run on: retry ===========================================================

-- name: retry_run_step
-- A retry: the failed record of a step it takes up (it runs again).
SELECT * FROM safepoint_steps
WHERE run_id = %(run_id)s AND step_id = %(step_id)s AND status = 'failed';

-- name: retry_run_attempts
-- A retry: the failed attempts of a step it takes up (its attempts start again from one).
SELECT * FROM safepoint_attempts
WHERE run_id = %(run_id)s AND step_id = %(step_id)s ORDER BY attempt;

-- name: retry_run_event
-- A retry's events: each step it takes up (step.retried, with what it had recorded) and the
-- retry itself (run.retried), by the person who asked (%(event_id)s: see next_event_id).
INSERT INTO safepoint_events (event_id, run_id, at, kind, step_id, operation_id, fence, worker,
                              detail)
OVERRIDING SYSTEM VALUE
VALUES (coalesce(%(event_id)s::bigint, nextval('safepoint_events_event_id_seq')), %(run_id)s,
        %(now)s, %(kind)s, %(step_id)s, %(operation_id)s, NULL, %(worker)s, %(detail)s);

-- name: retry_run_forget_step
-- The failed record retry_run_event just moved into the history.
DELETE FROM safepoint_steps
WHERE run_id = %(run_id)s AND step_id = %(step_id)s AND status = 'failed';

-- name: retry_run_forget_attempts
-- The failed attempts retry_run_event just moved into the history.
DELETE FROM safepoint_attempts WHERE run_id = %(run_id)s AND step_id = %(step_id)s;

-- name: retry_run_operation
-- A rejected operation a retry sends again, as its last attempt ended.
SELECT * FROM safepoint_operations
WHERE run_id = %(run_id)s AND operation_id = %(operation_id)s;

-- name: retry_run_resend
-- A rejected operation sent again as its next attempt: prepared, under the key derived for
-- that attempt, its outcome, dispatch count and retention window cleared (the derived key is
-- new to the owner) — only the rejected attempt the retry was planned on. last_dispatched_at
-- stays: the owner may still remember the key the rejected attempt was sent under.
UPDATE safepoint_operations
SET state = 'prepared', key_attempt = %(key_attempt)s, effect_key = %(effect_key)s,
    receipt = NULL, error = NULL, dispatch_count = 0, first_dispatched_at = NULL,
    approval_id = NULL, updated_at = %(now)s
WHERE run_id = %(run_id)s AND operation_id = %(operation_id)s AND state = 'rejected'
  AND key_attempt = %(key_attempt)s - 1
RETURNING operation_id;

-- name: retry_run
-- The retried run becomes pending for any worker: its error and recovery record cleared,
-- compare-and-set on the revision the retry was planned on; events appended, failed records
-- moved from the steps into them (both counted).
UPDATE safepoint_runs
SET status = 'pending', error = NULL, recovery_record = NULL, owner = NULL,
    lease_expires_at = NULL, waiting_for = NULL, state_revision = state_revision + 1,
    event_count = event_count + %(events)s, step_count = step_count - %(steps)s,
    updated_at = %(now)s
WHERE run_id = %(run_id)s AND state_revision = %(expected_revision)s
  AND status IN ('failed', 'stopped') AND cancel_requested_at IS NULL
RETURNING workflow;

-- == carrying a stopped run on: fork ============================================================

-- name: fork_run_source
-- The run a fork is made from, its row locked until the fork commits (a worker's fenced write,
-- a claim, waits for it), with the clock the fork is stamped with.
SELECT *, safepoint_now_ms() AS now FROM safepoint_runs WHERE run_id = %(run_id)s FOR UPDATE;

-- name: fork_run_steps
-- What a fork needs of each step of its source, in ledger order.
SELECT run_id, step_id, seq, kind, operation_id, tokens, cost, recorded_at
FROM safepoint_steps WHERE run_id = %(run_id)s ORDER BY seq;

-- name: fork_run
-- A fork: a pending run of the source's workflow, inputs and limits — under the source's code,
-- or this code's version, fingerprint and manifest — with what its copied steps spent, a chain
-- of its own (named by its own id) and the run and step it was forked from. Nothing if the id
-- exists.
INSERT INTO safepoint_runs (run_id, workflow, workflow_version, status, input_hash, inputs,
                            inputs_ref, state_revision, owner, lease_expires_at, fence,
                            resume_count, event_count, resume_budget, created_at, updated_at,
                            workflow_fingerprint, workflow_manifest, deadline_at, token_budget,
                            cost_budget, tokens_spent, cost_spent, step_attempts, step_count,
                            history_soft_limit, history_hard_limit, chain_id, chain_index,
                            model_call_budget, model_calls_spent, step_attempt_limit,
                            forked_from, family_id, family_generation)
SELECT %(run_id)s, workflow,
       CASE WHEN %(current_code)s THEN %(workflow_version)s::text ELSE workflow_version END,
       'pending', input_hash, inputs, inputs_ref, 1, NULL, NULL, 0, 0, 1, resume_budget,
       %(now)s, %(now)s,
       CASE WHEN %(current_code)s THEN %(workflow_fingerprint)s::text
            ELSE workflow_fingerprint END,
       CASE WHEN %(current_code)s THEN %(workflow_manifest)s::text ELSE workflow_manifest END,
       deadline_at, token_budget, cost_budget, %(tokens_spent)s, %(cost_spent)s, step_attempts,
       %(step_count)s, history_soft_limit, history_hard_limit, %(run_id)s, 0,
       model_call_budget, %(model_calls_spent)s, step_attempt_limit, %(forked_from)s,
       COALESCE(family_id, run_id), family_generation
FROM safepoint_runs WHERE run_id = %(source_run_id)s
ON CONFLICT (run_id) DO NOTHING
RETURNING run_id;

-- name: fork_run_copy_steps
-- A fork's prefix: the source's steps recorded before the step it was forked from, as they are.
INSERT INTO safepoint_steps (run_id, step_id, seq, kind, name, input_hash, status, result,
                             result_ref, error, next_step_id, attempt, model_id, prompt_hash,
                             observed_at, operation_id, fence, recorded_at, tokens, cost)
SELECT %(run_id)s, step_id, seq, kind, name, input_hash, status, result, result_ref, error,
       next_step_id, attempt, model_id, prompt_hash, observed_at, operation_id, fence,
       recorded_at, tokens, cost
FROM safepoint_steps WHERE run_id = %(source_run_id)s AND seq < %(from_seq)s;

-- name: fork_run_copy_operations
-- The operations of a fork's copied effect steps, as they are (settled, keys included), filed
-- under the fork's own chain.
INSERT INTO safepoint_operations (run_id, operation_id, step_id, effect, state, payload_ref,
                                  effect_key, dispatch_count, first_dispatched_at, receipt,
                                  error, fence, prepared_at, updated_at, approval_required,
                                  target_digest, approval_id, chain_id, key_attempt,
                                  dedup_retention_ms, family_key, last_dispatched_at)
SELECT %(run_id)s, operation_id, step_id, effect, state, payload_ref, effect_key,
       dispatch_count, first_dispatched_at, receipt, error, fence, prepared_at, updated_at,
       approval_required, target_digest, approval_id, %(run_id)s, key_attempt, dedup_retention_ms,
       family_key, last_dispatched_at
FROM safepoint_operations
WHERE run_id = %(source_run_id)s AND operation_id IN (
    SELECT operation_id FROM safepoint_steps
    WHERE run_id = %(source_run_id)s AND seq < %(from_seq)s
      AND kind IN (SELECT jsonb_array_elements_text(%(with_operation)s::jsonb)));

-- name: fork_run_event
-- The fork's first event (run.forked) or its source's (run.fork_made): who made it, and why
-- (%(event_id)s: see next_event_id).
INSERT INTO safepoint_events (event_id, run_id, at, kind, step_id, worker, detail)
OVERRIDING SYSTEM VALUE
VALUES (coalesce(%(event_id)s::bigint, nextval('safepoint_events_event_id_seq')), %(run_id)s,
        %(now)s, %(kind)s, %(from_step)s, %(by)s, %(detail)s);

-- name: fork_run_count_source_event
-- The source's history counts its run.fork_made event (nothing else of it changes).
UPDATE safepoint_runs SET event_count = event_count + 1 WHERE run_id = %(source_run_id)s;

-- == run families: each operation sent by one member ==========================================
-- A run's family is the run it grew from and every fork and successor of it; an operation is
-- named within the family by its family key (safepoint/_rules/family.py). Whoever of the family
-- dispatches an operation first holds its claim, taken in the dispatch's own statement
-- (prepare_effect, mark_dispatching: the `claimed` CTE): any other member's dispatch of it is
-- then refused. The holder keeps it whatever the outcome (found not applied, it alone sends it
-- again, under its own key); only a dispatch that provably never left gives it back (not sent:
-- record_outcome's `released` CTE), and the next member to send takes it.

-- name: family_of
-- The family a run belongs to: the id of its first member (its own, for a run never forked).
-- (Each family look-up reads this first, then the claims by family: a database sharded by run
-- keeps a family's claims with its first member, and sends each statement to one shard.)
SELECT COALESCE(family_id, run_id) AS family_id FROM safepoint_runs WHERE run_id = %(run_id)s;

-- name: family_holding
-- The member of a family that holds the claim on one of its operations (by its family key).
SELECT run_id, operation_id, sent FROM safepoint_family_claims
WHERE family_id = %(family_id)s AND claim_key = %(claim_key)s;

-- name: family_operation
-- The operation the member holding a family's claim holds, as it holds it.
SELECT * FROM safepoint_operations WHERE run_id = %(run_id)s AND operation_id = %(operation_id)s;

-- name: family_names
-- Whether any member of a family holds a claim on an operation of this id.
SELECT 1 AS held FROM safepoint_family_claims
WHERE family_id = %(family_id)s AND operation_id = %(operation_id)s
LIMIT 1;

-- == carrying a stopped run on: waits (messages, sleeps) =======================================
-- A wait takes the oldest message of its name not yet taken, or the run waits for one (or for
-- its timer), released; a message sent finds it waiting and makes it pending. Both sides take
-- the runs row lock FIRST, in a statement of its own — the gate with `wait_fence`, a send with
-- `lock_run` — and look at messages and the run's status only in LATER statements of that
-- transaction: under READ COMMITTED each statement reads a snapshot of its own, so whichever
-- comes second sees what the first committed. A send racing a worker about to wait is found by
-- the wait, or finds the run waiting — never neither (safepoint/_rules/waits.py).

-- name: send_message_existing
-- The message this run already keeps under the sender's message id (a re-delivery).
SELECT * FROM safepoint_messages WHERE run_id = %(run_id)s AND message_id = %(message_id)s;

-- name: send_message
-- Keep a message for the run, whether it waits yet or not: queued by name (for_wait NULL), or
-- an answer addressed to one wait. sent_at: the database clock — for an answer, as read when it
-- was decided whether its wait had timed out (now); seq: the one next_message_seq took for a
-- sealed payload, or the next.
INSERT INTO safepoint_messages (seq, run_id, name, message_id, payload, payload_ref, sent_by,
                                sent_at, for_wait)
OVERRIDING SYSTEM VALUE
VALUES (coalesce(%(seq)s::bigint, nextval('safepoint_messages_seq_seq')), %(run_id)s, %(name)s,
        %(message_id)s, %(payload)s, %(payload_ref)s, %(sent_by)s,
        COALESCE(%(now)s::bigint, safepoint_now_ms()), %(for_wait)s)
RETURNING *;

-- name: send_message_wake
-- A message moves the run's revision and is appended as an event; a run waiting for a message
-- of its name is released: pending, for a worker (or a resume) to carry on. Runs after
-- lock_run, in its transaction.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
run AS (
    UPDATE safepoint_runs
    SET status = CASE WHEN %(wake)s THEN 'pending' ELSE status END,
        waiting_for = CASE WHEN %(wake)s THEN NULL ELSE waiting_for END,
        wake_at = CASE WHEN %(wake)s THEN NULL ELSE wake_at END,
        state_revision = state_revision + 1, event_count = event_count + 1,
        updated_at = clock.now
    FROM clock
    WHERE run_id = %(run_id)s
    RETURNING run_id, workflow, updated_at AS now
),
event AS (
    INSERT INTO safepoint_events (run_id, at, kind, worker, detail)
    SELECT run_id, now, 'message.sent', %(by)s, %(detail)s FROM run
)
SELECT workflow FROM run;

-- name: messages
-- Every message sent to a run, in the order they were sent.
SELECT * FROM safepoint_messages WHERE run_id = %(run_id)s ORDER BY seq;

-- name: answer_wait_step
-- The wait an answer is addressed to, as recorded (nothing: not recorded yet). Runs after
-- lock_run, in its transaction.
SELECT kind, name, status FROM safepoint_steps
WHERE run_id = %(run_id)s AND step_id = %(step_id)s;

-- name: answer_wait_answered
-- What answered that wait already: the answer kept for it, or the message it took.
SELECT * FROM safepoint_messages
WHERE run_id = %(run_id)s AND (for_wait = %(step_id)s OR taken_by = %(step_id)s)
ORDER BY seq LIMIT 1;

-- name: wait_fence
-- The fence of a wait's gate (await_message, await_timer), alone: new work (refused once a
-- cancel is asked for or past the deadline). It takes the runs row lock for the rest of the
-- transaction, before the statements that look for messages.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now)
UPDATE safepoint_runs
SET state_revision = state_revision + 1, lease_expires_at = clock.now + %(lease_ms)s,
    updated_at = clock.now
FROM clock
WHERE run_id = %(run_id)s AND fence = %(fence)s AND status = 'running'
  AND cancel_requested_at IS NULL AND (deadline_at IS NULL OR deadline_at > clock.now)
RETURNING run_id, updated_at AS now;

-- name: await_message_timeout
-- When a wait that has waited before times out: the instant recorded as its attempt then.
SELECT retry_at FROM safepoint_attempts
WHERE run_id = %(run_id)s AND step_id = %(step_id)s AND input_hash = %(input_hash)s
ORDER BY attempt LIMIT 1;

-- name: await_message_oldest
-- What the wait takes, sent before its timeout instant: the answer addressed to it, else the
-- oldest message of its name not yet taken and addressed to no other wait.
SELECT * FROM safepoint_messages
WHERE run_id = %(run_id)s AND name = %(name)s AND taken_by IS NULL
  AND (for_wait IS NULL OR for_wait = %(step_id)s)
  AND (%(timeout_at)s::bigint IS NULL OR sent_at < %(timeout_at)s::bigint)
ORDER BY for_wait IS NULL, seq LIMIT 1;

-- name: await_message_take
-- The wait step takes the message: it is its result from now on, never another step's.
UPDATE safepoint_messages SET taken_by = %(step_id)s, taken_at = %(now)s
WHERE run_id = %(run_id)s AND seq = %(seq)s AND taken_by IS NULL;

-- name: await_message_started
-- A wait with a timeout waits for the first time: its timeout instant is recorded, as the
-- wait step's attempt (retry_at), so that no restart shortens or restarts it.
INSERT INTO safepoint_attempts (run_id, step_id, attempt, kind, name, input_hash, error,
                                retry_at, fence, recorded_at)
VALUES (%(run_id)s, %(step_id)s, 1, 'wait', %(name)s, %(input_hash)s, %(error)s, %(retry_at)s,
        %(fence)s, %(now)s);

-- name: await_timer_step
-- A sleep recorded already: its result holds when it is due.
SELECT result FROM safepoint_steps WHERE run_id = %(run_id)s AND step_id = %(step_id)s;

-- name: wait_step
-- Record a wait step: the message it received, its timeout (failed), or a sleep's due instant.
INSERT INTO safepoint_steps (run_id, step_id, seq, kind, name, input_hash, status, result,
                             result_ref, error, fence, recorded_at)
VALUES (%(run_id)s, %(step_id)s, %(seq)s, 'wait', %(name)s, %(input_hash)s, %(status)s,
        %(result)s, %(result_ref)s, %(error)s, %(fence)s, %(now)s);

-- name: wait_event
-- Append what a wait's gate did to the run's history (counted by wait_count).
INSERT INTO safepoint_events (run_id, at, kind, step_id, fence, worker, detail)
VALUES (%(run_id)s, %(now)s, %(kind)s, %(step_id)s, %(fence)s, %(worker)s, %(detail)s);

-- name: wait_count
-- The history a wait's gate added: its event, and its step when it recorded one. Runs after
-- wait_fence, in its transaction (the runs row lock held).
UPDATE safepoint_runs
SET event_count = event_count + %(events)s, step_count = step_count + %(steps)s
WHERE run_id = %(run_id)s AND fence = %(fence)s AND status = 'running'
RETURNING event_count + step_count AS history, history_soft_limit, history_hard_limit,
          history_warned_at;

-- name: wait_until_woken
-- The run waits, released, for a message or its timer (waiting_for); due at wake_at, when
-- workers take it (NULL: only a message wakes it). The event says so.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
waiting AS (
    UPDATE safepoint_runs
    SET status = 'waiting', owner = NULL, lease_expires_at = NULL,
        waiting_for = %(waiting_for)s, wake_at = %(wake_at)s::bigint,
        state_revision = state_revision + 1, event_count = event_count + 1,
        updated_at = clock.now
    FROM clock
    WHERE run_id = %(run_id)s AND fence = %(fence)s AND status = 'running'
    RETURNING run_id, workflow, updated_at AS now
),
event AS (
    INSERT INTO safepoint_events (run_id, at, kind, step_id, fence, worker, detail)
    SELECT run_id, now, 'run.waiting', %(step_id)s, %(fence)s, %(worker)s, %(waiting_for)s
    FROM waiting
)
SELECT workflow, now FROM waiting;

-- name: wait_for_work_due
-- How long until the next waiting run falls due (a worker waiting for work wakes then at the
-- latest), in milliseconds on the database clock.
SELECT MIN(wake_at) - safepoint_now_ms() AS due_ms FROM safepoint_runs
WHERE status = 'waiting' AND wake_at > safepoint_now_ms();


-- == carrying a run on in slices ================================================================

-- name: end_slice
-- Release the run at the end of a slice and log it (run.slice_ended): no owner, no lease, the
-- status kept (running: the next claim takes it at once, and the caller NOTIFYs the workers).
-- Only the holder of the fence can; a stale one matches nothing (fence_state tells why).
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
owned AS (
    UPDATE safepoint_runs
    SET owner = NULL, fence = fence + 1, lease_expires_at = NULL, state_revision = state_revision + 1,
        event_count = event_count + 1, updated_at = clock.now
    FROM clock
    WHERE run_id = %(run_id)s AND fence = %(fence)s AND status = 'running'
    RETURNING run_id, workflow, updated_at AS now
),
event AS (
    INSERT INTO safepoint_events (run_id, at, kind, step_id, fence, worker, detail)
    SELECT run_id, now, 'run.slice_ended', %(step_id)s, %(fence)s, %(worker)s, %(detail)s
    FROM owned
)
SELECT workflow FROM owned;


-- == retention: prune ===========================================================================
-- One batch of a prune (safepoint/storage/prune.py) runs every statement below in one
-- transaction: a chain's runs locked and read again, then what goes deleted whole. RUN_IDS and
-- DIGESTS are JSON arrays of text, one parameter each, read as a set.

-- name: prune_candidates
-- The next last runs of their chains that ended at one of the statuses asked for before the
-- cut-off (of one workflow, when one is named), oldest first, after the cursor (index
-- safepoint_runs_finished).
SELECT run_id, chain_id, updated_at FROM safepoint_runs
WHERE successor_run_id IS NULL AND status IN ('completed', 'failed', 'cancelled')
  AND status IN (SELECT jsonb_array_elements_text(%(statuses)s::jsonb)) AND updated_at < %(before)s
  AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
  AND (updated_at, run_id) > (%(after_at)s::bigint, %(after_id)s::text)
ORDER BY updated_at, run_id
LIMIT %(limit)s;

-- name: prune_chain_runs
-- Every run of these chains, without a lock: each is then locked by its id (lock_run), where
-- the store locks run by run.
SELECT run_id FROM safepoint_runs
WHERE run_id IN (SELECT jsonb_array_elements_text(%(chain_ids)s::jsonb))
   OR chain_id IN (SELECT jsonb_array_elements_text(%(chain_ids)s::jsonb))
ORDER BY chain_index, run_id;

-- name: prune_lock_chains
-- Every run of these chains (each named by its first run's id), read again and locked: a
-- retry, a fork or a message waits for the batch.
SELECT run_id, chain_id, status, updated_at, successor_run_id FROM safepoint_runs
WHERE run_id IN (SELECT jsonb_array_elements_text(%(chain_ids)s::jsonb))
   OR chain_id IN (SELECT jsonb_array_elements_text(%(chain_ids)s::jsonb))
ORDER BY chain_index, run_id
FOR UPDATE;

-- name: prune_forks
-- The runs forked from one of these runs, and which (index safepoint_runs_fork_source).
SELECT run_id, (forked_from::jsonb ->> 'run_id') AS source FROM safepoint_runs
WHERE forked_from IS NOT NULL AND (forked_from::jsonb ->> 'run_id') IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb));

-- name: prune_operations
-- What the retention rule reads of these runs' operations: ever sent or not, when last sent and
-- written, and how long the owner remembers a key.
SELECT run_id, operation_id, effect, dispatch_count, first_dispatched_at, last_dispatched_at,
       updated_at, dedup_retention_ms
FROM safepoint_operations WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb));

-- name: prune_artifact_refs
-- Every artifact these runs reference: their inputs and results, their steps' results, their
-- operations' payloads, their messages' payloads; and every copy they stored (by the key).
SELECT digest FROM safepoint_artifacts
WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb))
UNION SELECT inputs_ref FROM safepoint_runs
WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb)) AND inputs_ref IS NOT NULL
UNION SELECT result_ref FROM safepoint_runs
WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb)) AND result_ref IS NOT NULL
UNION SELECT result_ref FROM safepoint_steps
WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb)) AND result_ref IS NOT NULL
UNION SELECT payload_ref FROM safepoint_operations WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb))
UNION SELECT payload_ref FROM safepoint_messages
WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb)) AND payload_ref IS NOT NULL;

-- name: prune_delete_approvals
-- The approvals given for these runs' operations.
DELETE FROM safepoint_approvals WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb)) RETURNING 1 AS n;

-- name: prune_delete_messages
-- The messages sent to these runs.
DELETE FROM safepoint_messages WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb)) RETURNING 1 AS n;

-- name: prune_delete_attempts
-- These runs' failed attempts.
DELETE FROM safepoint_attempts WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb)) RETURNING 1 AS n;

-- name: prune_delete_steps
-- These runs' steps.
DELETE FROM safepoint_steps WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb)) RETURNING 1 AS n;

-- name: prune_delete_operations
-- These runs' operations.
DELETE FROM safepoint_operations WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb)) RETURNING 1 AS n;

-- name: prune_delete_events
-- These runs' history.
DELETE FROM safepoint_events WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb)) RETURNING 1 AS n;

-- name: prune_families
-- The families of the runs a prune deletes.
SELECT DISTINCT family_id FROM safepoint_runs WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb));

-- name: prune_families_left
-- Of those families, the ones with a run left (their claims stay: a member that carries on
-- must not send what a pruned one sent).
SELECT DISTINCT family_id FROM safepoint_runs WHERE family_id IN (SELECT jsonb_array_elements_text(%(family_ids)s::jsonb));

-- name: prune_delete_family_claims
-- The claims of the families none of whose runs is left.
DELETE FROM safepoint_family_claims WHERE family_id IN (SELECT jsonb_array_elements_text(%(family_ids)s::jsonb))
RETURNING 1 AS n;

-- name: prune_delete_runs
-- The runs themselves, last: nothing references them any more.
DELETE FROM safepoint_runs WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb)) RETURNING 1 AS n;

-- name: prune_artifact_copies
-- Every copy of those artifacts, each by its run, to be locked one by one (prune_lock_artifact)
-- where the store locks rows only in a statement about one run.
SELECT run_id, digest FROM safepoint_artifacts WHERE digest IN (SELECT jsonb_array_elements_text(%(digests)s::jsonb))
ORDER BY run_id, digest;

-- name: prune_lock_artifact
-- One copy of an artifact, locked (as prune_lock_artifacts locks them all).
SELECT 1 AS locked FROM safepoint_artifacts WHERE run_id = %(run_id)s AND digest = %(digest)s
FOR UPDATE;

-- name: prune_artifacts_referenced
-- Of those artifacts, the ones a row still references (read by digest, no join).
SELECT inputs_ref AS digest FROM safepoint_runs WHERE inputs_ref IN (SELECT jsonb_array_elements_text(%(digests)s::jsonb))
UNION SELECT result_ref FROM safepoint_runs WHERE result_ref IN (SELECT jsonb_array_elements_text(%(digests)s::jsonb))
UNION SELECT result_ref FROM safepoint_steps WHERE result_ref IN (SELECT jsonb_array_elements_text(%(digests)s::jsonb))
UNION SELECT payload_ref FROM safepoint_operations WHERE payload_ref IN (SELECT jsonb_array_elements_text(%(digests)s::jsonb))
UNION SELECT payload_ref FROM safepoint_messages WHERE payload_ref IN (SELECT jsonb_array_elements_text(%(digests)s::jsonb));

-- name: prune_delete_artifact
-- One copy of an artifact, deleted.
DELETE FROM safepoint_artifacts WHERE run_id = %(run_id)s AND digest = %(digest)s RETURNING size;

-- name: prune_lock_artifacts
-- The artifacts the deleted runs referenced, locked: a writer storing one of them again (its upsert locks the row) either
-- commits first, and its reference keeps the artifact, or waits and stores it anew.
SELECT digest FROM safepoint_artifacts WHERE digest IN (SELECT jsonb_array_elements_text(%(digests)s::jsonb))
FOR UPDATE;

-- name: prune_delete_artifacts
-- Of those, every copy of an artifact no row references any more (one index probe per
-- reference column); and the deleted runs' own copies of the others, which other runs hold
-- copies of their own of: a pruned run's data goes, whoever else stored the same bytes. (A copy
-- that would be the last one of an artifact a remaining row references stays; no write path
-- leaves one so: each stores its own, and a fork reads its source's, which outlives it.)
DELETE FROM safepoint_artifacts AS a
WHERE a.digest IN (SELECT jsonb_array_elements_text(%(digests)s::jsonb))
  AND ((NOT EXISTS (SELECT 1 FROM safepoint_runs WHERE inputs_ref = a.digest)
        AND NOT EXISTS (SELECT 1 FROM safepoint_runs WHERE result_ref = a.digest)
        AND NOT EXISTS (SELECT 1 FROM safepoint_steps WHERE result_ref = a.digest)
        AND NOT EXISTS (SELECT 1 FROM safepoint_operations WHERE payload_ref = a.digest)
        AND NOT EXISTS (SELECT 1 FROM safepoint_messages WHERE payload_ref = a.digest))
       OR (a.run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb))
           AND EXISTS (SELECT 1 FROM safepoint_artifacts AS kept
                       WHERE kept.digest = a.digest
                         AND kept.run_id NOT IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb)))))
RETURNING size;
-- == encryption at rest: values sealed again (safepoint.storage.resealing) =====================
-- A fork's copied rows, sealed for the source's, are sealed again for the fork's; a rotation
-- seals every value again with the active key, a page of rows at a time, in key order (:after_*
-- the last key of the page before; :run_id NULL: every run's rows). Each page is read FOR
-- UPDATE: a row a worker writes meanwhile is read as it committed it, never written back older.

-- name: reseal_runs_page
-- A page of the runs' rows with their sealed columns (and the recovery record, whose reason and
-- evidence are sealed inside it), after the given key.
SELECT run_id, inputs, result, error, recovery_record, waiting_for FROM safepoint_runs
WHERE (%(run_id)s::text IS NULL OR run_id = %(run_id)s::text) AND run_id > %(after_run_id)s::text
ORDER BY run_id LIMIT %(limit)s FOR UPDATE;

-- name: reseal_runs_update
-- One row's sealed columns, sealed again.
UPDATE safepoint_runs SET inputs = %(inputs)s, result = %(result)s, error = %(error)s,
  recovery_record = %(recovery_record)s, waiting_for = %(waiting_for)s
WHERE run_id = %(run_id)s;

-- name: reseal_steps_page
-- A page of the steps' rows with their sealed columns, after the given key.
SELECT run_id, step_id, result, error FROM safepoint_steps
WHERE (%(run_id)s::text IS NULL OR run_id = %(run_id)s::text)
  AND (run_id, step_id) > (%(after_run_id)s::text, %(after_step_id)s::text)
ORDER BY run_id, step_id LIMIT %(limit)s FOR UPDATE;

-- name: reseal_steps_update
-- One row's sealed columns, sealed again.
UPDATE safepoint_steps SET result = %(result)s, error = %(error)s
WHERE run_id = %(run_id)s AND step_id = %(step_id)s;

-- name: reseal_attempts_page
-- A page of the failed attempts' rows with their sealed columns, after the given key.
SELECT run_id, step_id, attempt, error FROM safepoint_attempts
WHERE (%(run_id)s::text IS NULL OR run_id = %(run_id)s::text)
  AND (run_id, step_id, attempt)
      > (%(after_run_id)s::text, %(after_step_id)s::text, %(after_attempt)s::integer)
ORDER BY run_id, step_id, attempt LIMIT %(limit)s FOR UPDATE;

-- name: reseal_attempts_update
-- One row's sealed columns, sealed again.
UPDATE safepoint_attempts SET error = %(error)s
WHERE run_id = %(run_id)s AND step_id = %(step_id)s AND attempt = %(attempt)s;

-- name: reseal_operations_page
-- A page of the operations' rows with their sealed columns, after the given key.
SELECT run_id, operation_id, receipt, error FROM safepoint_operations
WHERE (%(run_id)s::text IS NULL OR run_id = %(run_id)s::text)
  AND (run_id, operation_id) > (%(after_run_id)s::text, %(after_operation_id)s::text)
ORDER BY run_id, operation_id LIMIT %(limit)s FOR UPDATE;

-- name: reseal_operations_update
-- One row's sealed columns, sealed again.
UPDATE safepoint_operations SET receipt = %(receipt)s, error = %(error)s
WHERE run_id = %(run_id)s AND operation_id = %(operation_id)s;

-- name: reseal_messages_page
-- A page of the messages' rows with their sealed columns, after the given key.
SELECT seq, run_id, name, payload FROM safepoint_messages
WHERE (%(run_id)s::text IS NULL OR run_id = %(run_id)s::text) AND seq > %(after_seq)s::bigint
ORDER BY seq LIMIT %(limit)s FOR UPDATE;

-- name: reseal_messages_update
-- One row's sealed columns, sealed again.
UPDATE safepoint_messages SET payload = %(payload)s
WHERE seq = %(seq)s;

-- name: reseal_events_page
-- A page of the events with a detail (sealed whole, or holding a step's sealed values), after
-- the given key; of the ledger's own (run id ''), only the mark that names its key (sealed_since).
SELECT event_id, run_id, kind, step_id, detail FROM safepoint_events
WHERE (%(run_id)s::text IS NULL OR run_id = %(run_id)s::text) AND (run_id <> '' OR kind = 'ledger.sealed')
  AND detail IS NOT NULL
  AND event_id > %(after_event_id)s::bigint
ORDER BY event_id LIMIT %(limit)s FOR UPDATE;

-- name: reseal_events_update
-- One event's detail, sealed again.
UPDATE safepoint_events SET detail = %(detail)s WHERE event_id = %(event_id)s;

-- name: reseal_approvals_page
-- A page of the approvals with a person's words (evidence, a revocation's reason), after the
-- given key.
SELECT approval_id, run_id, evidence, revoke_reason FROM safepoint_approvals
WHERE (%(run_id)s::text IS NULL OR run_id = %(run_id)s::text)
  AND approval_id > %(after_approval_id)s::text
  AND (evidence IS NOT NULL OR revoke_reason IS NOT NULL)
ORDER BY approval_id LIMIT %(limit)s FOR UPDATE;

-- name: reseal_approvals_update
-- One approval's sealed columns, sealed again.
UPDATE safepoint_approvals SET evidence = %(evidence)s, revoke_reason = %(revoke_reason)s
WHERE approval_id = %(approval_id)s;

-- name: reseal_artifacts_page
-- A page of artifacts, after the given digest.
SELECT digest, content FROM safepoint_artifacts WHERE digest > %(after_digest)s
ORDER BY digest LIMIT %(limit)s FOR UPDATE;

-- name: reseal_artifacts_update
-- One artifact's content, sealed again.
UPDATE safepoint_artifacts SET content = %(content)s WHERE digest = %(digest)s;

-- == transaction steps: the user's writes committed with their step record ===================

-- name: record_transaction
-- The first statement of a transaction step's transaction (BEGIN … COMMIT, the user's
-- statements between): the fence of new work, which takes the runs row lock and holds it to
-- the commit — so no claim, cancel or other write of the run lands before the step does, and
-- a stale worker's transaction writes nothing. It counts the step (a new one grows the
-- history; refused past the hard limit) and renews the lease. And it records the step as
-- uncertain (its error says so), so that a commit the function makes (or a library it calls)
-- commits this record too; the step's own record (record_transaction_step) overwrites it before
-- the COMMIT. marked is false when the step is recorded already — a commit whose answer this
-- worker never got, found even while that commit is still in flight: the insert waits on its
-- row.
WITH clock AS MATERIALIZED (SELECT safepoint_now_ms() AS now),
growth AS (
    SELECT CASE WHEN (SELECT true FROM safepoint_steps s
                      WHERE s.run_id = %(run_id)s AND s.step_id = %(step_id)s) IS NULL
           THEN 1 ELSE 0 END AS steps
),
-- the run family's claim on the step (family_key; none: no claim), taken first under fenced's
-- conditions: another run of the family holding it — it committed the step there, or may
-- have — refuses the whole statement (family_refusal tells), and it commits with the step
claimed AS (
    INSERT INTO safepoint_family_claims (family_id, claim_key, run_id, operation_id, sent)
    SELECT COALESCE(r.family_id, r.run_id), %(family_key)s, r.run_id, %(step_id)s, true
    FROM safepoint_runs AS r, clock, growth
    WHERE r.run_id = %(run_id)s AND r.fence = %(fence)s AND r.status = 'running'
      AND r.cancel_requested_at IS NULL AND (r.deadline_at IS NULL OR r.deadline_at > clock.now)
      AND (r.history_hard_limit IS NULL
           OR r.event_count + r.step_count + growth.steps <= r.history_hard_limit)
      AND %(family_key)s::text IS NOT NULL
    ON CONFLICT (family_id, claim_key) DO UPDATE
    SET run_id = EXCLUDED.run_id, operation_id = EXCLUDED.operation_id, sent = true
    WHERE NOT safepoint_family_claims.sent
       OR (safepoint_family_claims.run_id = EXCLUDED.run_id
           AND safepoint_family_claims.operation_id = EXCLUDED.operation_id)
    RETURNING run_id
),
fenced AS (
    UPDATE safepoint_runs
    SET state_revision = state_revision + 1, lease_expires_at = clock.now + %(lease_ms)s,
        step_count = step_count + growth.steps, updated_at = clock.now
    FROM clock, growth
    WHERE run_id = %(run_id)s AND fence = %(fence)s AND status = 'running'
      AND cancel_requested_at IS NULL AND (deadline_at IS NULL OR deadline_at > clock.now)
      AND (history_hard_limit IS NULL OR event_count + step_count + growth.steps <= history_hard_limit)
      AND (%(family_key)s::text IS NULL OR EXISTS (SELECT 1 FROM claimed))
    RETURNING run_id, updated_at AS now, event_count + step_count AS history, history_soft_limit,
              history_hard_limit, history_warned_at
),
marked AS (
    INSERT INTO safepoint_steps (run_id, step_id, seq, kind, name, input_hash, status, error,
                                 attempt, fence, recorded_at)
    SELECT %(run_id)s, %(step_id)s, %(seq)s, 'transaction', %(name)s, %(input_hash)s, 'failed',
           %(uncertain)s, %(attempt)s, %(fence)s, now
    FROM fenced
    ON CONFLICT (run_id, step_id) DO NOTHING
    RETURNING step_id
)
SELECT run_id, now, history, history_soft_limit, history_hard_limit, history_warned_at,
       EXISTS (SELECT 1 FROM marked) AS marked
FROM fenced;

-- name: record_transaction_step
-- The step of a transaction step, recorded with the function's value over its uncertain record
-- (record_transaction), sent with the COMMIT — and the check that the transaction open is still
-- the one that wrote that record: its row version's xmin is this transaction's id (the low 32
-- bits of txid_current(), the high ones counting wraparounds). When the function ended it (a
-- commit or rollback of its own, or a library's), the transaction open is another one, or has no
-- id yet, or the record is gone: the check divides by zero (SQLSTATE 22012), nothing is written,
-- the COMMIT after it does not run, and the store rolls back what the function began since and
-- says the step may have committed. Nothing else in the statement can divide by zero. (A check
-- inside the statement that writes costs no statement more per step.)
WITH still_open AS (
    SELECT 1 / coalesce((SELECT s.xmin::text::bigint = txid_current_if_assigned() %% 4294967296
                         FROM safepoint_steps s
                         WHERE s.run_id = %(run_id)s AND s.step_id = %(step_id)s), false)::int AS one
)
INSERT INTO safepoint_steps (run_id, step_id, seq, kind, name, input_hash, status, result,
                             result_ref, error, next_step_id, attempt, model_id, prompt_hash,
                             observed_at, operation_id, fence, recorded_at, tokens, cost)
VALUES (%(run_id)s, %(step_id)s, %(seq)s, %(kind)s, %(name)s, %(input_hash)s, %(step_status)s,
        %(result)s, %(result_ref)s, %(step_error)s, %(next_step_id)s,
        %(attempt)s * (SELECT one FROM still_open), %(model_id)s, %(prompt_hash)s,
        %(observed_at)s, %(step_operation_id)s, %(fence)s, %(now)s, %(tokens)s, %(cost)s)
ON CONFLICT (run_id, step_id) DO UPDATE SET
    kind = excluded.kind, name = excluded.name, input_hash = excluded.input_hash,
    status = excluded.status, result = excluded.result, result_ref = excluded.result_ref,
    error = excluded.error, next_step_id = excluded.next_step_id, attempt = excluded.attempt,
    model_id = excluded.model_id, prompt_hash = excluded.prompt_hash,
    observed_at = excluded.observed_at, operation_id = excluded.operation_id,
    fence = excluded.fence, recorded_at = excluded.recorded_at, tokens = excluded.tokens,
    cost = excluded.cost;


-- name: record_transaction_step_open
-- A distributed ledger's form of record_transaction_step's check (Citus: sent on its own, to the
-- run's node, where the record was written in this transaction): the same division by zero.
SELECT 1 / coalesce((SELECT s.xmin::text::bigint = txid_current_if_assigned() %% 4294967296
                     FROM safepoint_steps s
                     WHERE s.run_id = %(run_id)s AND s.step_id = %(step_id)s), false)::int AS one;

-- name: record_transaction_step_routed
-- A distributed ledger's form of record_transaction_step's write, after its check: no subquery
-- in the INSERT (Citus refuses one there).
INSERT INTO safepoint_steps (run_id, step_id, seq, kind, name, input_hash, status, result,
                             result_ref, error, next_step_id, attempt, model_id, prompt_hash,
                             observed_at, operation_id, fence, recorded_at, tokens, cost)
VALUES (%(run_id)s, %(step_id)s, %(seq)s, %(kind)s, %(name)s, %(input_hash)s, %(step_status)s,
        %(result)s, %(result_ref)s, %(step_error)s, %(next_step_id)s,
        %(attempt)s, %(model_id)s, %(prompt_hash)s,
        %(observed_at)s, %(step_operation_id)s, %(fence)s, %(now)s, %(tokens)s, %(cost)s)
ON CONFLICT (run_id, step_id) DO UPDATE SET
    kind = excluded.kind, name = excluded.name, input_hash = excluded.input_hash,
    status = excluded.status, result = excluded.result, result_ref = excluded.result_ref,
    error = excluded.error, next_step_id = excluded.next_step_id, attempt = excluded.attempt,
    model_id = excluded.model_id, prompt_hash = excluded.prompt_hash,
    observed_at = excluded.observed_at, operation_id = excluded.operation_id,
    fence = excluded.fence, recorded_at = excluded.recorded_at, tokens = excluded.tokens,
    cost = excluded.cost;

-- name: transaction_open
-- record_transaction_step's check as a question (after a function that raised): whether the
-- transaction open is the one that wrote the step's uncertain record.
SELECT coalesce((SELECT s.xmin::text::bigint = txid_current_if_assigned() %% 4294967296
                 FROM safepoint_steps s
                 WHERE s.run_id = %(run_id)s AND s.step_id = %(step_id)s), false) AS open;

-- name: transaction_committed
-- After the step's transaction was found aborted and rolled back: whether its uncertain record
-- is there all the same — committed by the function before — so the step may have committed.
SELECT 1 FROM safepoint_steps WHERE run_id = %(run_id)s AND step_id = %(step_id)s;
