-- Named queries of the SQLite store. Each starts with `-- name: <name>` and a one-line purpose.
-- Parameters are named (:run_id); nothing is ever formatted into the SQL text.
--
-- A query is named after the store method that runs it (`claim_next`), or after that method
-- and its part (`load_ledger_steps`, `replan_abandon_steps`); a statement several methods
-- share is named after what it does (`fence_check`, `insert_event`, `insert_artifact`). The
-- reading queries (`get_run`, `list_runs`, `load_ledger_*`, `events`, `approvals` …) have the
-- same names and columns as PostgreSQL's: both stores read through one set of plans
-- (safepoint/storage/ledger.py).
--
-- Every write a worker makes goes through `fence_check` in the same BEGIN IMMEDIATE
-- transaction: SQLite serialises writers, so the check and the write cannot interleave with
-- another worker's claim (safepoint/_rules/fencing.py tells fencing end to end).

-- name: create_version_table
-- The ledger of applied migrations.
CREATE TABLE IF NOT EXISTS safepoint_schema_version (
    version     INTEGER PRIMARY KEY,
    name        TEXT    NOT NULL,
    checksum    TEXT    NOT NULL,
    applied_at  INTEGER NOT NULL
);

-- name: applied_migrations
-- Every applied migration with the checksum of its SQL text.
SELECT version, name, checksum FROM safepoint_schema_version ORDER BY version;

-- name: record_migration
-- Remember one applied migration, in the transaction that applied it.
INSERT INTO safepoint_schema_version (version, name, checksum, applied_at)
VALUES (:version, :name, :checksum, :applied_at);

-- name: schema_version
-- The highest migration applied.
SELECT COALESCE(MAX(version), 0) AS version FROM safepoint_schema_version;

-- name: create_run
-- Create a run, claimed by its starter (running, fence 1) or pending for a worker (fence 0);
-- does nothing if the run id exists. A relative deadline counts from its creation. A first run
-- starts its own chain; a successor (continue as new) names its parent and takes the next place
-- in the parent's chain.
INSERT INTO safepoint_runs (run_id, workflow, workflow_version, status, input_hash, inputs,
                            inputs_ref, state_revision, owner, lease_expires_at, fence,
                            resume_count, event_count, resume_budget, created_at, updated_at,
                            workflow_fingerprint, workflow_manifest, deadline_at, token_budget,
                            cost_budget, step_attempts, history_soft_limit, history_hard_limit,
                            chain_id, chain_index, parent_run_id, model_call_budget,
                            step_attempt_limit, family_id, family_generation)
VALUES (:run_id, :workflow, :workflow_version, :status, :input_hash, :inputs, :inputs_ref, 1,
        :owner, :lease_expires_at, :fence, 0, 1, :resume_budget, :now, :now,
        :workflow_fingerprint, :workflow_manifest,
        COALESCE(:deadline_at, :now + :deadline_ms), :token_budget, :cost_budget,
        :step_attempts, :history_soft_limit, :history_hard_limit, COALESCE(:chain_id, :run_id),
        :chain_index, :parent_run_id, :model_call_budget, :step_attempt_limit,
        COALESCE(:family_id, :run_id), :family_generation)
ON CONFLICT (run_id) DO NOTHING;

-- name: claim_next
-- The oldest run of these workflows ("name", any version, or "name@version") a worker may
-- take: pending, released, abandoned by a worker whose lease expired, or waiting and due (its
-- sleep ended, its wait timed out: wake_at passed).
-- (SQLite serialises writers, so selecting inside BEGIN IMMEDIATE is already exclusive.)
-- A lease that is not an integer (none, or a damaged value no clock compares with) is expired.
SELECT run_id, state_revision, status FROM safepoint_runs
WHERE (status = 'pending'
       OR (status = 'running'
           AND (typeof(lease_expires_at) <> 'integer' OR lease_expires_at <= :now))
       OR (status = 'waiting' AND wake_at <= :now))
  AND (workflow IN (SELECT value FROM json_each(:workflows))
       OR workflow || '@' || workflow_version IN (SELECT value FROM json_each(:workflows)))
ORDER BY created_at, run_id
LIMIT 1;

-- name: resolve_operation
-- A person settled an uncertain operation: it moves to accepted (with the receipt they found)
-- or back to prepared (it never happened: dispatch again, a fresh retention window).
-- Only an uncertain operation (dispatching, unknown) can be "not applied": an applied one has
-- the owner's receipt, and sending it again would apply it twice.
UPDATE safepoint_operations
SET state = :to_state, error = NULL,
    receipt = CASE WHEN :to_state = 'prepared' THEN NULL ELSE COALESCE(:receipt, receipt) END,
    first_dispatched_at = CASE WHEN :to_state = 'prepared' THEN NULL ELSE first_dispatched_at END,
    updated_at = :now
WHERE run_id = :run_id AND operation_id = :operation_id
  AND (state IN ('dispatching', 'unknown') OR (state = 'applied' AND :to_state = 'accepted'));

-- name: resolve_transaction_applied
-- A person found the writes of a transaction step recorded as uncertain (its function ended
-- the step's transaction: it may have committed) in the database: the step is recorded
-- completed, with the value they gave as what it returns, and the run carries on from it.
UPDATE safepoint_steps
SET status = 'completed', result = :result, result_ref = :result_ref, error = NULL,
    recorded_at = :now
WHERE run_id = :run_id AND step_id = :step_id AND kind = 'transaction' AND status = 'failed';

-- name: resolve_transaction_not_applied
-- A person found none of them there: the step's uncertain record goes (and leaves the run's
-- history count), and the step runs again from nothing.
DELETE FROM safepoint_steps
WHERE run_id = :run_id AND step_id = :step_id AND kind = 'transaction' AND status = 'failed';

-- name: resolve_transaction_uncounted
-- The step count of a run whose uncertain transaction step was resolved not applied.
UPDATE safepoint_runs SET step_count = step_count - 1 WHERE run_id = :run_id;

-- name: resolve
-- The resolved run leaves "blocked": released for any worker (running, no owner), or ended
-- (cancelled, when abandoned). Compare-and-set on the revision the person looked at. The fence
-- moves on, as at every release: no write of the worker that blocked it lands after this.
UPDATE safepoint_runs
SET status = :status, error = :error, recovery_record = NULL, owner = NULL, fence = fence + 1,
    lease_expires_at = NULL, state_revision = state_revision + 1,
    event_count = event_count + 1, updated_at = :now
WHERE run_id = :run_id AND state_revision = :expected_revision AND status = 'blocked';

-- name: resolve_last_event
-- The newest event of a run (a repeated resolution finds its own there).
SELECT event_id, kind, detail FROM safepoint_events WHERE run_id = :run_id
ORDER BY event_id DESC LIMIT 1;

-- name: get_run
-- One run by id.
SELECT * FROM safepoint_runs WHERE run_id = :run_id;

-- name: list_runs
-- Most recently changed runs first, optionally of one status.
SELECT * FROM safepoint_runs
WHERE (:status IS NULL OR status = :status)
ORDER BY updated_at DESC, run_id
LIMIT :limit;

-- name: query_runs
-- One page of the runs a console asks for: every filter given narrows it (NULL: not asked);
-- newest created first, after the keyset (created_at, run_id) of the page before. The store
-- asks for one row more than the page, to know whether another page follows.
SELECT * FROM safepoint_runs
WHERE (:workflow IS NULL OR workflow = :workflow)
  AND (:workflow_version IS NULL OR workflow_version = :workflow_version)
  AND (:search IS NULL OR instr(lower(run_id), lower(:search)) > 0)
  AND (:created_from IS NULL OR created_at >= :created_from)
  AND (:created_to IS NULL OR created_at < :created_to)
  AND (:updated_from IS NULL OR updated_at >= :updated_from)
  AND (:updated_to IS NULL OR updated_at < :updated_to)
  AND (:status IS NULL OR status = :status)
  AND (:after_created IS NULL OR created_at < :after_created
       OR (created_at = :after_created AND run_id < :after_run_id))
ORDER BY created_at DESC, run_id DESC
LIMIT :limit;

-- name: count_runs
-- How many runs of each status match a console's filters (its status filter aside).
SELECT status, count(*) AS runs FROM safepoint_runs
WHERE (:workflow IS NULL OR workflow = :workflow)
  AND (:workflow_version IS NULL OR workflow_version = :workflow_version)
  AND (:search IS NULL OR instr(lower(run_id), lower(:search)) > 0)
  AND (:created_from IS NULL OR created_at >= :created_from)
  AND (:created_to IS NULL OR created_at < :created_to)
  AND (:updated_from IS NULL OR updated_at >= :updated_from)
  AND (:updated_to IS NULL OR updated_at < :updated_to)
GROUP BY status;

-- name: claim_run
-- Compare-and-set on state_revision: take a run whose lease expired, that has no owner, or
-- whose owner is known to be dead (or whose lease is not an integer: damaged, it never
-- expires otherwise); bump the fence and the resume count. A waiting run is claimed by name
-- (a resume looks at its gate again: an approval, a message, its timer), and by claim_next
-- only once it is due (wake_at).
UPDATE safepoint_runs
SET status = 'running', owner = :owner, lease_expires_at = :lease_expires_at,
    fence = fence + 1, state_revision = state_revision + 1,
    resume_count = resume_count + CASE WHEN status = 'running' AND owner IS NOT NULL
                                       THEN 1 ELSE 0 END,  -- only a takeover is a resume
    event_count = event_count + 1, waiting_for = NULL, wake_at = NULL,
    updated_at = :now
WHERE run_id = :run_id AND state_revision = :expected_revision
  AND status IN ('pending', 'running', 'blocked', 'waiting')
  AND (owner IS NULL OR typeof(lease_expires_at) <> 'integer' OR lease_expires_at <= :now
       OR owner = :dead_owner)
RETURNING fence, state_revision, lease_expires_at;

-- name: fence_check
-- The guard of every worker write: matches only while this worker's fence is current and the
-- run is running; renews the lease, bumps the revision and counts the history the write adds
-- as it goes: :events events, and the step :step_id when it is new (recording a step id again
-- replaces its row). A write that starts something new (:new_work = 1: a step, a retry, a
-- prepared or dispatched effect) is refused once a cancel is asked for or the deadline passed;
-- one held to the history limit (:limited = 1: a step or a prepared effect) also when the
-- history would grow past the run's hard limit. With :dispatching = 1 the write also commits
-- the first dispatch of the operation it prepares (prepare_and_mark_dispatching): the revision
-- moves as a second write would, and of its :events the dispatching event is never held to the
-- hard limit.
-- Returns nothing, and matches nothing either when the write brings the history to the run's
-- soft limit for the first time: then fence_check_counted runs instead, which returns the
-- history for the warning to be recorded. (SQLite builds a table for a write's RETURNING each
-- time it runs one: nearly every write needs none.)
UPDATE safepoint_runs
SET state_revision = state_revision + 1 + :dispatching, lease_expires_at = :lease_expires_at,
    event_count = event_count + :events,
    step_count = step_count + (SELECT :step_id IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM safepoint_steps WHERE run_id = :run_id AND step_id = :step_id)),
    updated_at = :now
WHERE run_id = :run_id AND fence = :fence AND status = 'running'
  AND (:new_work = 0
       OR (cancel_requested_at IS NULL AND (deadline_at IS NULL OR deadline_at > :now)))
  AND (:limited = 0 OR history_hard_limit IS NULL
       OR event_count + step_count + :events - :dispatching + (SELECT :step_id IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM safepoint_steps WHERE run_id = :run_id AND step_id = :step_id))
          <= history_hard_limit)
  AND (history_soft_limit IS NULL OR history_warned_at IS NOT NULL
       OR event_count + step_count + :events + (SELECT :step_id IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM safepoint_steps WHERE run_id = :run_id AND step_id = :step_id))
          < history_soft_limit);

-- name: fence_check_counted
-- fence_check, where it matched nothing: the same guard of the same write, matching also when
-- the write brings the history to the soft limit; returns the history as it now stands. Matches
-- nothing only for a write the guard refuses (fence_state then tells why).
UPDATE safepoint_runs
SET state_revision = state_revision + 1 + :dispatching, lease_expires_at = :lease_expires_at,
    event_count = event_count + :events,
    step_count = step_count + (SELECT :step_id IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM safepoint_steps WHERE run_id = :run_id AND step_id = :step_id)),
    updated_at = :now
WHERE run_id = :run_id AND fence = :fence AND status = 'running'
  AND (:new_work = 0
       OR (cancel_requested_at IS NULL AND (deadline_at IS NULL OR deadline_at > :now)))
  AND (:limited = 0 OR history_hard_limit IS NULL
       OR event_count + step_count + :events - :dispatching + (SELECT :step_id IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM safepoint_steps WHERE run_id = :run_id AND step_id = :step_id))
          <= history_hard_limit)
RETURNING event_count + step_count AS history, history_soft_limit, history_hard_limit,
          history_warned_at;

-- name: fence_state
-- Why a fenced statement matched nothing: a stale fence, a cancel request, the deadline, the
-- history limit.
SELECT fence, status, cancel_requested_at, deadline_at, event_count + step_count AS history,
       history_hard_limit
FROM safepoint_runs WHERE run_id = :run_id;

-- name: request_cancel
-- Ask a run to stop. A run nobody holds (pending, blocked, waiting, stopped) ends cancelled at once; a
-- running one is marked, and its worker stops before its next step or dispatch. An ended run is
-- left. A blocked run whose effect is still uncertain stays blocked, marked: a person settles the
-- effect first (resolve), never a cancel that would forget it. A waiting run whose effect is
-- uncertain (approval lapsed before a re-dispatch) becomes pending, marked: a worker settles
-- the effect with its owner and ends the run, dispatching nothing.
UPDATE safepoint_runs
SET status = CASE WHEN status IN ('pending', 'stopped')
                    OR (status IN ('blocked', 'waiting') AND NOT EXISTS (
                 SELECT 1 FROM safepoint_operations o WHERE o.run_id = safepoint_runs.run_id
                   AND o.state IN ('dispatching', 'unknown', 'applied')))
             THEN 'cancelled'
             WHEN status = 'waiting' THEN 'pending'
             ELSE status END,
    error = CASE WHEN status IN ('pending', 'blocked', 'waiting', 'stopped') THEN :error
            ELSE error END,
    owner = CASE WHEN status IN ('pending', 'blocked') THEN NULL ELSE owner END,
    waiting_for = NULL,
    cancel_requested_at = COALESCE(cancel_requested_at, :now),
    state_revision = state_revision + 1, event_count = event_count + 1, updated_at = :now
WHERE run_id = :run_id AND status IN ('pending', 'blocked', 'running', 'waiting', 'stopped')
RETURNING status;

-- name: finish_run
-- End the run (completed, failed, blocked, or stopped at a limit) and release ownership. A recovery record gets
-- the revision this very statement creates.
UPDATE safepoint_runs
SET status = :status, result = :result, result_ref = :result_ref, error = :error,
    recovery_record = CASE WHEN :recovery_record IS NULL THEN NULL
                      ELSE json_set(:recovery_record, '$.state_revision', state_revision + 1)
                      END,
    owner = NULL, lease_expires_at = NULL,
    state_revision = state_revision + 1, event_count = event_count + 1, updated_at = :now
WHERE run_id = :run_id AND fence = :fence AND status = 'running';

-- name: release_run
-- Give up ownership without changing the status (a graceful stop); only the holder can. The
-- fence moves on: a write the holder issued before letting go (a fan-out branch paused before
-- its statement) is refused as stale when it lands — a running run with no owner accepts none.
UPDATE safepoint_runs
SET owner = NULL, fence = fence + 1, lease_expires_at = NULL, state_revision = state_revision + 1,
    updated_at = :now
WHERE run_id = :run_id AND fence = :fence AND status = 'running';

-- name: record_step
-- Record a step; a re-read of an expired observation replaces the row and keeps its seq
-- (the worker numbers steps: it alone writes them while its fence holds).
INSERT INTO safepoint_steps (run_id, step_id, seq, kind, name, input_hash, status, result,
                             result_ref, error, next_step_id, attempt, model_id, prompt_hash,
                             observed_at, operation_id, fence, recorded_at, tokens, cost)
VALUES (:run_id, :step_id, :seq, :kind, :name, :input_hash, :status, :result, :result_ref,
        :error, :next_step_id, :attempt, :model_id, :prompt_hash, :observed_at, :operation_id,
        :fence, :now, :tokens, :cost)
ON CONFLICT (run_id, step_id) DO UPDATE SET
    kind = excluded.kind, name = excluded.name, model_id = excluded.model_id,
    prompt_hash = excluded.prompt_hash, operation_id = excluded.operation_id,
    input_hash = excluded.input_hash, status = excluded.status, result = excluded.result,
    result_ref = excluded.result_ref, error = excluded.error,
    next_step_id = excluded.next_step_id, attempt = excluded.attempt,
    observed_at = excluded.observed_at, fence = excluded.fence,
    recorded_at = excluded.recorded_at, tokens = excluded.tokens, cost = excluded.cost;

-- name: mark_transaction_step
-- A transaction step's record as uncertain (its error says so), written right after the fence
-- in the step's own transaction: a commit its function makes (or a library it calls) commits
-- it too, and the step's own record (record_step) overwrites it before safepoint commits. No
-- row when the step is recorded already: the store returns that record instead of calling the
-- function again.
INSERT INTO safepoint_steps (run_id, step_id, seq, kind, name, input_hash, status, result,
                             result_ref, error, next_step_id, attempt, model_id, prompt_hash,
                             observed_at, operation_id, fence, recorded_at, tokens, cost)
VALUES (:run_id, :step_id, :seq, :kind, :name, :input_hash, 'failed', NULL, NULL, :error,
        NULL, :attempt, NULL, NULL, NULL, NULL, :fence, :now, NULL, NULL)
ON CONFLICT (run_id, step_id) DO NOTHING;

-- name: renew_lease
-- The heartbeat: push the lease out while this worker's fence is current. Not progress, so
-- the state revision stays.
UPDATE safepoint_runs
SET lease_expires_at = :lease_expires_at, heartbeat_at = :now
WHERE run_id = :run_id AND fence = :fence AND status = 'running';

-- name: load_ledger_steps
-- Every recorded step of a run, in the order they were first recorded.
SELECT * FROM safepoint_steps WHERE run_id = :run_id ORDER BY seq;

-- name: prepare_effect
-- Prepared intent: payload reference, operation id and effect key become durable together.
-- With :dispatching = 1 (no gate stands between the two, DESIGN §3) the operation is committed
-- "dispatching" at once, its first dispatch counted and timed: the row mark_dispatching would
-- leave.
-- (chain_id: the run's chain, where a successor looks settled operations up)
INSERT INTO safepoint_operations (run_id, operation_id, step_id, effect, state, payload_ref,
                                  effect_key, dispatch_count, first_dispatched_at, fence,
                                  prepared_at, updated_at, chain_id, dedup_retention_ms,
                                  family_key, last_dispatched_at)
VALUES (:run_id, :operation_id, :step_id, :effect,
        CASE WHEN :dispatching THEN 'dispatching' ELSE 'prepared' END, :payload_ref, :effect_key,
        :dispatching, CASE WHEN :dispatching THEN :now END, :fence, :now, :now,
        (SELECT chain_id FROM safepoint_runs WHERE run_id = :run_id), :dedup_retention_ms,
        :family_key, CASE WHEN :dispatching THEN :now END);

-- name: prepare_and_mark_dispatching_events
-- effect.prepared, then effect.dispatching, of an operation prepared and dispatched in one
-- commit: one statement, whose rows take their event ids in that order.
INSERT INTO safepoint_events (run_id, at, kind, step_id, operation_id, fence, worker, detail)
VALUES (:run_id, :now, 'effect.prepared', :step_id, :operation_id, :fence, :worker, :detail),
       (:run_id, :now, 'effect.dispatching', :step_id, :operation_id, :fence, :worker,
        :dispatching_detail);

-- name: mark_dispatching
-- "Dispatch may have happened", committed before the call; remembers the first dispatch time
-- and the last (which nothing clears: a prune keeps what an owner may remember).
UPDATE safepoint_operations
SET state = 'dispatching', dispatch_count = dispatch_count + 1,
    first_dispatched_at = COALESCE(first_dispatched_at, :now), last_dispatched_at = :now,
    fence = :fence, updated_at = :now
WHERE run_id = :run_id AND operation_id = :operation_id
  AND state IN ('prepared', 'dispatching', 'unknown')
RETURNING *;

-- name: record_outcome
-- The evidence of one dispatch: applied (receipt), rejected or unknown (error), or accepted.
UPDATE safepoint_operations
SET state = :state, receipt = COALESCE(:receipt, receipt), error = :error, fence = :fence,
    updated_at = :now
WHERE run_id = :run_id AND operation_id = :operation_id;

-- name: load_ledger_operations
-- Every effect operation of a run.
SELECT * FROM safepoint_operations WHERE run_id = :run_id ORDER BY prepared_at, operation_id;

-- name: insert_event
-- Append one transition to the run's history; :event_id NULL takes the next id, one taken by
-- next_event_id is the id a sealed detail was sealed for.
INSERT INTO safepoint_events (event_id, run_id, at, kind, step_id, operation_id, fence, worker,
                              detail)
VALUES (:event_id, :run_id, :now, :kind, :step_id, :operation_id, :fence, :worker, :detail);

-- name: next_event_id
-- The id the next event gets, taken before the event is inserted so that its detail can be
-- sealed for its row (storage/codec.py). Run in the write transaction that inserts the event,
-- right before it: the file's write lock keeps any other event out in between. AUTOINCREMENT
-- never gives an id twice, so the larger of the last id given and the largest id there.
SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'safepoint_events'), 0),
           coalesce((SELECT max(event_id) FROM safepoint_events), 0)) + 1 AS event_id;

-- name: next_message_seq
-- The seq the next message gets (as next_event_id, for a payload sealed for its row).
SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'safepoint_messages'), 0),
           coalesce((SELECT max(seq) FROM safepoint_messages), 0)) + 1 AS seq;

-- name: events
-- A run's history, oldest first.
SELECT * FROM safepoint_events WHERE run_id = :run_id ORDER BY event_id;

-- name: insert_artifact
-- Content-addressed: the same bytes are stored once.
INSERT INTO safepoint_artifacts (digest, size, content, created_at)
VALUES (:digest, :size, :content, :now)
ON CONFLICT (digest) DO NOTHING;

-- name: get_artifact
-- The bytes stored under a digest (checked against it by the caller).
SELECT content FROM safepoint_artifacts WHERE digest = :digest;

-- name: replan_adopt_workflow
-- Re-plan: the run goes on under this code's version and fingerprint (the old ones stay in the
-- run.replanned event). Runs after fence_check in the same transaction.
UPDATE safepoint_runs
SET workflow_version = :workflow_version, workflow_fingerprint = :workflow_fingerprint,
    workflow_manifest = :workflow_manifest
WHERE run_id = :run_id AND fence = :fence;

-- name: replan_abandon_steps
-- Re-plan: the stale tail — the step at :step_id and every non-effect step recorded after it,
-- up to :through_seq, but those in :keep (JSON list: a fan-out sibling branch's) — moves into
-- the history, one step.abandoned event each, with what it had recorded (each event's row, so
-- that a sealed ledger binds the step's sealed values to it).
INSERT INTO safepoint_events (run_id, at, kind, step_id, operation_id, fence, worker, detail)
SELECT run_id, :now, 'step.abandoned', step_id, operation_id, :fence, :worker,
       json_object('kind', kind, 'name', name, 'seq', seq, 'input_hash', input_hash,
                   'status', status, 'result', json(result), 'result_ref', result_ref,
                   'error', json(error), 'next_step_id', next_step_id, 'attempt', attempt,
                   'recorded_at', recorded_at, 'recorded_fence', fence, 'reason', :reason)
FROM safepoint_steps
WHERE run_id = :run_id
  AND seq >= (SELECT seq FROM safepoint_steps WHERE run_id = :run_id AND step_id = :step_id)
  AND seq <= :through_seq
  AND (kind NOT IN (SELECT value FROM json_each(:kept)) OR step_id = :step_id)
  AND step_id NOT IN (SELECT value FROM json_each(:keep))
ORDER BY seq
RETURNING event_id, run_id, kind, step_id, detail;

-- name: replan_delete_abandoned_steps
-- The rows abandon_steps just moved into the history.
DELETE FROM safepoint_steps
WHERE run_id = :run_id
  AND seq >= (SELECT seq FROM safepoint_steps WHERE run_id = :run_id AND step_id = :step_id)
  AND seq <= :through_seq
  AND (kind NOT IN (SELECT value FROM json_each(:kept)) OR step_id = :step_id)
  AND step_id NOT IN (SELECT value FROM json_each(:keep));

-- name: replan_count_events
-- Events appended in this transaction beyond the one fence_check counted; a re-plan's abandoned
-- steps moved from the steps into them (:steps rows deleted).
UPDATE safepoint_runs SET event_count = event_count + :events, step_count = step_count - :steps
WHERE run_id = :run_id;


-- name: record_step_usage
-- What model steps spent — tokens, cost, and the model calls (turns) themselves — added to the
-- run's totals in the commit that records the steps (after its fence_check): a restart never
-- resets them, and what was spent stays spent.
UPDATE safepoint_runs
SET tokens_spent = tokens_spent + COALESCE(:tokens, 0),
    cost_spent = cost_spent + COALESCE(:cost, 0),
    model_calls_spent = model_calls_spent + :model_calls
WHERE run_id = :run_id;

-- name: record_attempt
-- A failed attempt that will be tried again, durable before the back-off (after the
-- fence_check of its transaction).
INSERT INTO safepoint_attempts (run_id, step_id, attempt, kind, name, input_hash, error,
                                retry_at, fence, recorded_at)
VALUES (:run_id, :step_id, :attempt, :kind, :name, :input_hash, :error, :retry_at, :fence,
        :now);

-- name: load_ledger_attempts
-- Every failed attempt of a run's steps, by step and attempt.
SELECT * FROM safepoint_attempts WHERE run_id = :run_id ORDER BY step_id, attempt;

-- name: await_approval
-- The approval gate (or prepare): the operation is dispatched only under an approval, and its
-- target's state was last seen as target_digest. Only an operation still to be dispatched.
UPDATE safepoint_operations
SET approval_required = 1, target_digest = :target_digest, updated_at = :now
WHERE run_id = :run_id AND operation_id = :operation_id
  AND state IN ('prepared', 'dispatching', 'unknown')
RETURNING *;

-- name: approvals_of_operation
-- Every approval given for one operation, in the order they were given (rowid: SQLite
-- serialises writers, so insertion order is commit order).
SELECT * FROM safepoint_approvals WHERE run_id = :run_id AND operation_id = :operation_id
ORDER BY rowid;

-- name: approvals
-- Every approval given in a run, in the order they were given.
SELECT * FROM safepoint_approvals WHERE run_id = :run_id ORDER BY rowid;

-- name: wait_for_approval
-- No approval authorizes the dispatch: the run waits, released, with what it waits for.
UPDATE safepoint_runs
SET status = 'waiting', owner = NULL, lease_expires_at = NULL, waiting_for = :waiting_for,
    state_revision = state_revision + 1, event_count = event_count + 1, updated_at = :now
WHERE run_id = :run_id AND fence = :fence AND status = 'running';

-- name: mark_dispatching_approved
-- Keep the approval that authorized this dispatch on the operation.
UPDATE safepoint_operations SET approval_id = :approval_id
WHERE run_id = :run_id AND operation_id = :operation_id;

-- name: operation_of_step
-- The operation an effect step prepared.
SELECT * FROM safepoint_operations WHERE run_id = :run_id AND step_id = :step_id;

-- name: approve
-- A person's approval, bound to the payload and target digests it was given for.
INSERT INTO safepoint_approvals (approval_id, run_id, operation_id, step_id, payload_digest,
                                 target_digest, approved_by, evidence, approved_at, expires_at)
VALUES (:approval_id, :run_id, :operation_id, :step_id, :payload_digest, :target_digest,
        :approved_by, :evidence, :approved_at, :expires_at);

-- name: approve_run
-- An approval moves the run's revision; a run waiting for that very operation is released:
-- pending, so a worker (or a resume) carries it on.
UPDATE safepoint_runs
SET status = CASE WHEN :release THEN 'pending' ELSE status END,
    waiting_for = CASE WHEN :release THEN NULL ELSE waiting_for END,
    state_revision = state_revision + 1, event_count = event_count + 1, updated_at = :now
WHERE run_id = :run_id;

-- name: revoke_approval
-- A person takes back every approval of one operation still in force: it authorizes nothing
-- from now on. The rows stay, as evidence of what was authorized and withdrawn. The reason is
-- :revoke_reason, or on a sealed ledger each row's own (:sealed_reasons, a JSON object by
-- approval id: sealed for the row).
UPDATE safepoint_approvals
SET revoked_at = :now, revoked_by = :revoked_by,
    revoke_reason = coalesce((SELECT value FROM json_each(:sealed_reasons) WHERE key = approval_id),
                             :revoke_reason)
WHERE run_id = :run_id AND operation_id = :operation_id AND revoked_at IS NULL;

-- name: revoke_approval_run
-- A revocation moves the run's revision and counts its event; the status stays (the gate
-- decides whether the run waits).
UPDATE safepoint_runs
SET state_revision = state_revision + 1, event_count = event_count + 1, updated_at = :now
WHERE run_id = :run_id;

-- name: reprepare_effect
-- A new payload for an operation that never left (prepared: nothing was ever sent, or what was
-- tried provably never left): same key, new payload and target digests — to be approved anew
-- where it needs approval. Matches nothing once the operation may have been dispatched.
UPDATE safepoint_operations
SET payload_ref = :payload_ref, target_digest = :target_digest, fence = :fence,
    updated_at = :now
WHERE run_id = :run_id AND operation_id = :operation_id AND state = 'prepared';
-- name: record_history_warning
-- The run's history crossed its soft limit: remember when (so it is recorded once) and count
-- the run.history_warning event about to be appended. Only the fence holder writes it.
UPDATE safepoint_runs
SET history_warned_at = :now, event_count = event_count + 1
WHERE run_id = :run_id AND fence = :fence AND status = 'running'
  AND history_warned_at IS NULL;

-- name: continue_as_new
-- Continue as new: the run ends 'continued', pointing at its successor, and gives up
-- ownership. Fenced like new work (refused once a cancel is asked for or the deadline passed),
-- never held to the history limit. Returns the chain the successor joins.
UPDATE safepoint_runs
SET status = 'continued', successor_run_id = :successor_run_id, owner = NULL,
    lease_expires_at = NULL, state_revision = state_revision + 1,
    event_count = event_count + 1, updated_at = :now
WHERE run_id = :run_id AND fence = :fence AND status = 'running'
  AND cancel_requested_at IS NULL AND (deadline_at IS NULL OR deadline_at > :now)
RETURNING run_id, chain_id, chain_index, COALESCE(family_id, run_id) AS family_id, family_generation;

-- name: chain_operation
-- An operation as an earlier run of the chain settled it: a successor's effect ledger, found
-- in place (index safepoint_operations_chain), never copied.
SELECT * FROM safepoint_operations
WHERE chain_id = :chain_id AND operation_id = :operation_id
  AND state IN ('accepted', 'rejected')
ORDER BY prepared_at DESC
LIMIT 1;

-- name: record_steps
-- The guard of a batch of steps (pure steps written lazily, with the next step of the run): as
-- fence_check (new work) for each step of :step_ids (JSON) that is new, in one statement.
UPDATE safepoint_runs
SET state_revision = state_revision + 1, lease_expires_at = :lease_expires_at,
    step_count = step_count + (
        SELECT count(*) FROM json_each(:step_ids) AS j WHERE NOT EXISTS (
            SELECT 1 FROM safepoint_steps s WHERE s.run_id = :run_id AND s.step_id = j.value)),
    updated_at = :now
WHERE run_id = :run_id AND fence = :fence AND status = 'running'
  AND cancel_requested_at IS NULL AND (deadline_at IS NULL OR deadline_at > :now)
  AND (history_hard_limit IS NULL
       OR event_count + step_count + (
           SELECT count(*) FROM json_each(:step_ids) AS j WHERE NOT EXISTS (
               SELECT 1 FROM safepoint_steps s
               WHERE s.run_id = :run_id AND s.step_id = j.value)) <= history_hard_limit)
RETURNING event_count + step_count AS history, history_soft_limit, history_hard_limit,
          history_warned_at;

-- name: sealed_since
-- Whether the ledger holds values sealed by a codec (safepoint.storage.codec): the event a store
-- with one leaves on open, once, under run id '' (no run's), naming the key it first sealed with
-- (a rotation, safepoint keys reencrypt, names its new key there).
SELECT detail FROM safepoint_events WHERE run_id = '' AND kind = 'ledger.sealed' LIMIT 1;

-- name: mark_sealed
-- Mark the ledger as holding sealed values (see sealed_since), unless it is already.
INSERT INTO safepoint_events (run_id, at, kind, detail)
SELECT '', :now, 'ledger.sealed', :detail
WHERE NOT EXISTS (SELECT 1 FROM safepoint_events WHERE run_id = '' AND kind = 'ledger.sealed');

-- name: ledger_identity
-- The ledger's id and since when effect keys include it (migration 1), read once on open.
SELECT ledger_id, keyed_since FROM safepoint_ledger WHERE singleton = 1;

-- name: lock_run
-- One run, for a person's decision about it (an approval, a revocation): BEGIN IMMEDIATE has
-- locked the whole ledger already, so that it is serialised with the gate and the dispatch.
SELECT * FROM safepoint_runs WHERE run_id = :run_id;

-- == carrying a stopped run on: limits (stopped runs, extend_limits) ==========================

-- name: stop_run_limits
-- A worker stopping its run at a limit: whether its fence holds, and the limits as they stand,
-- to compare with those it last read (a person may have raised one since). BEGIN IMMEDIATE has
-- locked the ledger, so nothing changes them before the stop (finish_run, status 'stopped')
-- commits in the same transaction.
SELECT fence, status, token_budget, cost_budget, model_call_budget, deadline_at,
       step_attempt_limit, resume_budget
FROM safepoint_runs WHERE run_id = :run_id;

-- name: extend_limits
-- A person's new limits, compare-and-set on the revision they were asked at; what was spent
-- stays. A stopped run becomes pending (its error and recovery record cleared: workers take it
-- again); any other run keeps its status. SET reads the row as it was, so each CASE sees the
-- old status.
UPDATE safepoint_runs
SET token_budget = :tokens, cost_budget = :cost, model_call_budget = :model_calls,
    deadline_at = :deadline, step_attempt_limit = :step_attempts, resume_budget = :resume_budget,
    status = CASE WHEN status = 'stopped' THEN 'pending' ELSE status END,
    error = CASE WHEN status = 'stopped' THEN NULL ELSE error END,
    recovery_record = CASE WHEN status = 'stopped' THEN NULL ELSE recovery_record END,
    state_revision = state_revision + 1, event_count = event_count + 1, updated_at = :now
WHERE run_id = :run_id AND state_revision = :expected_revision
  AND status IN ('pending', 'running', 'waiting', 'blocked', 'stopped');

-- == carrying a stopped run on: retry ===========================================================

-- name: retry_run_step
-- A retry: the failed record of a step it takes up (it runs again).
SELECT * FROM safepoint_steps WHERE run_id = :run_id AND step_id = :step_id AND status = 'failed';

-- name: retry_run_attempts
-- A retry: the failed attempts of a step it takes up (its attempts start again from one).
SELECT * FROM safepoint_attempts WHERE run_id = :run_id AND step_id = :step_id ORDER BY attempt;

-- name: retry_run_event
-- A retry's events: each step it takes up (step.retried, with what it had recorded) and the
-- retry itself (run.retried), by the person who asked (:event_id: as insert_event's).
INSERT INTO safepoint_events (event_id, run_id, at, kind, step_id, operation_id, fence, worker,
                              detail)
VALUES (:event_id, :run_id, :now, :kind, :step_id, :operation_id, NULL, :worker, :detail);

-- name: retry_run_forget_step
-- The failed record retry_run_event just moved into the history.
DELETE FROM safepoint_steps WHERE run_id = :run_id AND step_id = :step_id AND status = 'failed';

-- name: retry_run_forget_attempts
-- The failed attempts retry_run_event just moved into the history.
DELETE FROM safepoint_attempts WHERE run_id = :run_id AND step_id = :step_id;

-- name: retry_run_operation
-- A rejected operation a retry sends again, as its last attempt ended.
SELECT * FROM safepoint_operations WHERE run_id = :run_id AND operation_id = :operation_id;

-- name: retry_run_resend
-- A rejected operation sent again as its next attempt: prepared, under the key derived for
-- that attempt, its outcome, dispatch count and retention window cleared (the derived key is
-- new to the owner) — only the rejected attempt the retry was planned on. last_dispatched_at
-- stays: the owner may still remember the key the rejected attempt was sent under.
UPDATE safepoint_operations
SET state = 'prepared', key_attempt = :key_attempt, effect_key = :effect_key, receipt = NULL,
    error = NULL, dispatch_count = 0, first_dispatched_at = NULL, approval_id = NULL,
    updated_at = :now
WHERE run_id = :run_id AND operation_id = :operation_id AND state = 'rejected'
  AND key_attempt = :key_attempt - 1
RETURNING operation_id;

-- name: retry_run
-- The retried run becomes pending for any worker: its error and recovery record cleared,
-- compare-and-set on the revision the retry was planned on; :events events appended, :steps
-- failed records moved from the steps into them.
UPDATE safepoint_runs
SET status = 'pending', error = NULL, recovery_record = NULL, owner = NULL,
    lease_expires_at = NULL, waiting_for = NULL, state_revision = state_revision + 1,
    event_count = event_count + :events, step_count = step_count - :steps, updated_at = :now
WHERE run_id = :run_id AND state_revision = :expected_revision
  AND status IN ('failed', 'stopped') AND cancel_requested_at IS NULL
RETURNING workflow;

-- == carrying a stopped run on: fork ============================================================

-- name: fork_run_source
-- The run a fork is made from, with the clock the fork is stamped with (BEGIN IMMEDIATE holds
-- the ledger until the fork commits: nothing of the source moves meanwhile).
SELECT *, :now AS now FROM safepoint_runs WHERE run_id = :run_id;

-- name: fork_run_steps
-- What a fork needs of each step of its source, in ledger order.
SELECT run_id, step_id, seq, kind, operation_id, tokens, cost, recorded_at
FROM safepoint_steps WHERE run_id = :run_id ORDER BY seq;

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
SELECT :run_id, workflow,
       CASE WHEN :current_code THEN :workflow_version ELSE workflow_version END,
       'pending', input_hash, inputs, inputs_ref, 1, NULL, NULL, 0, 0, 1, resume_budget, :now,
       :now, CASE WHEN :current_code THEN :workflow_fingerprint ELSE workflow_fingerprint END,
       CASE WHEN :current_code THEN :workflow_manifest ELSE workflow_manifest END, deadline_at,
       token_budget, cost_budget, :tokens_spent, :cost_spent, step_attempts, :step_count,
       history_soft_limit, history_hard_limit, :run_id, 0, model_call_budget,
       :model_calls_spent, step_attempt_limit, :forked_from, COALESCE(family_id, run_id),
       family_generation
FROM safepoint_runs WHERE run_id = :source_run_id
ON CONFLICT (run_id) DO NOTHING
RETURNING run_id;

-- name: fork_run_copy_steps
-- A fork's prefix: the source's steps recorded before the step it was forked from, as they are.
INSERT INTO safepoint_steps (run_id, step_id, seq, kind, name, input_hash, status, result,
                             result_ref, error, next_step_id, attempt, model_id, prompt_hash,
                             observed_at, operation_id, fence, recorded_at, tokens, cost)
SELECT :run_id, step_id, seq, kind, name, input_hash, status, result, result_ref, error,
       next_step_id, attempt, model_id, prompt_hash, observed_at, operation_id, fence,
       recorded_at, tokens, cost
FROM safepoint_steps WHERE run_id = :source_run_id AND seq < :from_seq;

-- name: fork_run_copy_operations
-- The operations of a fork's copied effect steps, as they are (settled, keys included), filed
-- under the fork's own chain.
INSERT INTO safepoint_operations (run_id, operation_id, step_id, effect, state, payload_ref,
                                  effect_key, dispatch_count, first_dispatched_at, receipt,
                                  error, fence, prepared_at, updated_at, approval_required,
                                  target_digest, approval_id, chain_id, key_attempt,
                                  dedup_retention_ms, family_key, last_dispatched_at)
SELECT :run_id, operation_id, step_id, effect, state, payload_ref, effect_key, dispatch_count,
       first_dispatched_at, receipt, error, fence, prepared_at, updated_at, approval_required,
       target_digest, approval_id, :run_id, key_attempt, dedup_retention_ms, family_key,
       last_dispatched_at
FROM safepoint_operations
WHERE run_id = :source_run_id AND operation_id IN (
    SELECT operation_id FROM safepoint_steps
    WHERE run_id = :source_run_id AND seq < :from_seq
      AND kind IN (SELECT value FROM json_each(:with_operation)));

-- name: fork_run_event
-- The fork's first event (run.forked) or its source's (run.fork_made): who made it, and why
-- (:event_id: as insert_event's).
INSERT INTO safepoint_events (event_id, run_id, at, kind, step_id, worker, detail)
VALUES (:event_id, :run_id, :now, :kind, :from_step, :by, :detail);

-- name: fork_run_count_source_event
-- The source's history counts its run.fork_made event (nothing else of it changes).
UPDATE safepoint_runs SET event_count = event_count + 1 WHERE run_id = :source_run_id;

-- == run families: each operation sent by one member ==========================================
-- A run's family is the run it grew from and every fork and successor of it; an operation is
-- named within the family by its family key (safepoint/_rules/family.py). Whoever of the family
-- dispatches an operation first holds its claim, taken in the dispatch's own transaction (or a
-- transaction step's): any other member's dispatch of it is then refused. The holder keeps it
-- whatever the outcome (found not applied, it alone sends it again, under its own key); only a
-- dispatch that provably never left gives it back (not sent): the next member to send takes it.

-- name: family_claim
-- Take (or keep) the claim on an operation for this run, as sent; no row: another member holds
-- it, and it may have happened there. A claim given back (sent = 0: its dispatch provably never
-- left, family_release) is taken by whoever sends next. Under READ COMMITTED a racing claim waits for the row and
-- then re-checks the condition against the row as committed: never two holders.
INSERT INTO safepoint_family_claims (family_id, claim_key, run_id, operation_id, sent)
SELECT COALESCE(family_id, run_id), :claim_key, run_id, :operation_id, 1
FROM safepoint_runs WHERE run_id = :run_id
ON CONFLICT (family_id, claim_key) DO UPDATE
SET run_id = excluded.run_id, operation_id = excluded.operation_id, sent = 1
WHERE safepoint_family_claims.sent = 0
   OR (safepoint_family_claims.run_id = excluded.run_id
       AND safepoint_family_claims.operation_id = excluded.operation_id)
RETURNING run_id;

-- name: family_holder
-- Who of the run's family holds the claim on an operation (and whether it may have happened).
SELECT c.run_id, c.operation_id, c.sent FROM safepoint_family_claims AS c
JOIN safepoint_runs AS r ON c.family_id = COALESCE(r.family_id, r.run_id)
WHERE r.run_id = :run_id AND c.claim_key = :claim_key;

-- name: family_of
-- The family a run belongs to: the id of its first member (its own, for a run never forked).
-- (Each family look-up reads this first, then the claims by family: a database sharded by run
-- keeps a family's claims with its first member, and sends each statement to one shard.)
SELECT COALESCE(family_id, run_id) AS family_id FROM safepoint_runs WHERE run_id = :run_id;

-- name: family_holding
-- The member of a family that holds the claim on one of its operations (by its family key).
SELECT run_id, operation_id, sent FROM safepoint_family_claims
WHERE family_id = :family_id AND claim_key = :claim_key;

-- name: family_operation
-- The operation the member holding a family's claim holds, as it holds it.
SELECT * FROM safepoint_operations WHERE run_id = :run_id AND operation_id = :operation_id;

-- name: family_names
-- Whether any member of a family holds a claim on an operation of this id.
SELECT 1 AS held FROM safepoint_family_claims
WHERE family_id = :family_id AND operation_id = :operation_id
LIMIT 1;

-- name: family_release
-- The operation's dispatch provably never left (NotSent): its claim is given back.
UPDATE safepoint_family_claims SET sent = 0
WHERE run_id = :run_id AND operation_id = :operation_id;

-- == carrying a stopped run on: waits (messages, sleeps) =======================================
-- A wait takes the oldest message of its name not yet taken, or the run waits for one (or for
-- its timer), released; a message sent finds it waiting and makes it pending. Every statement
-- below runs in one BEGIN IMMEDIATE transaction with the others of its operation, so a send
-- and a worker about to wait are serialised: the wait finds the message, or the send finds
-- the run waiting (safepoint/_rules/waits.py).

-- name: send_message_existing
-- The message this run already keeps under the sender's message id (a re-delivery).
SELECT * FROM safepoint_messages WHERE run_id = :run_id AND message_id = :message_id;

-- name: send_message
-- Keep a message for the run, whether it waits yet or not: queued by name (for_wait NULL), or
-- an answer addressed to one wait (:seq NULL takes the next; one next_message_seq took is the
-- one a sealed payload was sealed for).
INSERT INTO safepoint_messages (seq, run_id, name, message_id, payload, payload_ref, sent_by,
                                sent_at, for_wait)
VALUES (:seq, :run_id, :name, :message_id, :payload, :payload_ref, :sent_by, :now, :for_wait)
RETURNING *;

-- name: send_message_wake
-- A message moves the run's revision and counts its event; a run waiting for a message of
-- its name is released: pending, for a worker (or a resume) to carry on.
UPDATE safepoint_runs
SET status = CASE WHEN :wake THEN 'pending' ELSE status END,
    waiting_for = CASE WHEN :wake THEN NULL ELSE waiting_for END,
    wake_at = CASE WHEN :wake THEN NULL ELSE wake_at END,
    state_revision = state_revision + 1, event_count = event_count + 1, updated_at = :now
WHERE run_id = :run_id;

-- name: messages
-- Every message sent to a run, in the order they were sent.
SELECT * FROM safepoint_messages WHERE run_id = :run_id ORDER BY seq;

-- name: answer_wait_step
-- The wait an answer is addressed to, as recorded (nothing: not recorded yet).
SELECT kind, name, status FROM safepoint_steps WHERE run_id = :run_id AND step_id = :step_id;

-- name: answer_wait_answered
-- What answered that wait already: the answer kept for it, or the message it took.
SELECT * FROM safepoint_messages
WHERE run_id = :run_id AND (for_wait = :step_id OR taken_by = :step_id)
ORDER BY seq LIMIT 1;

-- name: await_message_timeout
-- When a wait that has waited before times out: the instant recorded as its attempt then.
SELECT retry_at FROM safepoint_attempts
WHERE run_id = :run_id AND step_id = :step_id AND input_hash = :input_hash
ORDER BY attempt LIMIT 1;

-- name: await_message_oldest
-- What the wait takes, sent before its timeout instant: the answer addressed to it, else the
-- oldest message of its name not yet taken and addressed to no other wait.
SELECT * FROM safepoint_messages
WHERE run_id = :run_id AND name = :name AND taken_by IS NULL
  AND (for_wait IS NULL OR for_wait = :step_id)
  AND (:timeout_at IS NULL OR sent_at < :timeout_at)
ORDER BY for_wait IS NULL, seq LIMIT 1;

-- name: await_message_take
-- The wait step takes the message: it is its result from now on, never another step's.
UPDATE safepoint_messages SET taken_by = :step_id, taken_at = :now
WHERE seq = :seq AND taken_by IS NULL;

-- name: await_message_started
-- A wait with a timeout waits for the first time: its timeout instant is recorded, as the
-- wait step's attempt (retry_at), so that no restart shortens or restarts it.
INSERT INTO safepoint_attempts (run_id, step_id, attempt, kind, name, input_hash, error,
                                retry_at, fence, recorded_at)
VALUES (:run_id, :step_id, 1, 'wait', :name, :input_hash, :error, :retry_at, :fence, :now);

-- name: await_timer_step
-- A sleep recorded already: its result holds when it is due.
SELECT result FROM safepoint_steps WHERE run_id = :run_id AND step_id = :step_id;

-- name: wait_step
-- Record a wait step: the message it received, its timeout (failed), or a sleep's due instant.
INSERT INTO safepoint_steps (run_id, step_id, seq, kind, name, input_hash, status, result,
                             result_ref, error, fence, recorded_at)
VALUES (:run_id, :step_id, :seq, 'wait', :name, :input_hash, :status, :result, :result_ref,
        :error, :fence, :now);

-- name: wait_until_woken
-- The run waits, released, for a message or its timer (waiting_for); due at wake_at, when
-- workers take it (NULL: only a message wakes it).
UPDATE safepoint_runs
SET status = 'waiting', owner = NULL, lease_expires_at = NULL, waiting_for = :waiting_for,
    wake_at = :wake_at, state_revision = state_revision + 1, event_count = event_count + 1,
    updated_at = :now
WHERE run_id = :run_id AND fence = :fence AND status = 'running';

-- name: wait_for_work_due
-- When the next waiting run falls due (a worker waiting for work wakes then at the latest).
SELECT MIN(wake_at) AS wake_at FROM safepoint_runs
WHERE status = 'waiting' AND wake_at > :now;


-- == carrying a run on in slices ================================================================

-- name: end_slice
-- Release the run at the end of a slice: no owner, no lease, the status kept (running: the
-- next claim takes it at once); counts the run.slice_ended event written with it. Only the
-- holder of the fence can; the fence moves on, as at every release (release_run).
UPDATE safepoint_runs
SET owner = NULL, fence = fence + 1, lease_expires_at = NULL, state_revision = state_revision + 1,
    event_count = event_count + 1, updated_at = :now
WHERE run_id = :run_id AND fence = :fence AND status = 'running'
RETURNING run_id;


-- == retention: prune ===========================================================================
-- One batch of a prune (safepoint/storage/prune.py) runs every statement below in one
-- transaction: a chain's runs locked and read again, then what goes deleted whole. RUN_IDS and
-- DIGESTS are JSON arrays of text, one parameter each, read as a set.

-- name: prune_candidates
-- The next last runs of their chains that ended at one of the statuses asked for before the
-- cut-off (of one workflow, when one is named), oldest first, after the cursor (index
-- safepoint_runs_finished).
SELECT run_id, chain_id, updated_at FROM safepoint_runs
WHERE successor_run_id IS NULL
  AND (status = 'completed' OR status = 'failed' OR status = 'cancelled')  -- as the index has it
  AND status IN (SELECT value FROM json_each(:statuses)) AND updated_at < :before
  AND (:workflow IS NULL OR workflow = :workflow)
  AND (updated_at, run_id) > (:after_at, :after_id)
ORDER BY updated_at, run_id
LIMIT :limit;

-- name: prune_chain_runs
-- Every run of these chains, without a lock: each is then locked by its id (lock_run), where
-- the store locks run by run.
SELECT run_id FROM safepoint_runs
WHERE run_id IN (SELECT value FROM json_each(:chain_ids))
   OR chain_id IN (SELECT value FROM json_each(:chain_ids))
ORDER BY chain_index, run_id;

-- name: prune_lock_chains
-- Every run of these chains (each named by its first run's id), read again (BEGIN IMMEDIATE
-- already holds every other writer off).
SELECT run_id, chain_id, status, updated_at, successor_run_id FROM safepoint_runs
WHERE run_id IN (SELECT value FROM json_each(:chain_ids))
   OR chain_id IN (SELECT value FROM json_each(:chain_ids))
ORDER BY chain_index, run_id;

-- name: prune_forks
-- The runs forked from one of these runs, and which (index safepoint_runs_fork_source).
SELECT run_id, json_extract(forked_from, '$.run_id') AS source FROM safepoint_runs
WHERE forked_from IS NOT NULL AND json_extract(forked_from, '$.run_id') IN (SELECT value FROM json_each(:run_ids));

-- name: prune_operations
-- What the retention rule reads of these runs' operations: ever sent or not, when last sent and
-- written, and how long the owner remembers a key.
SELECT run_id, operation_id, effect, dispatch_count, first_dispatched_at, last_dispatched_at,
       updated_at, dedup_retention_ms
FROM safepoint_operations WHERE run_id IN (SELECT value FROM json_each(:run_ids));

-- name: prune_artifact_refs
-- Every artifact these runs reference: their inputs and results, their steps' results, their
-- operations' payloads, their messages' payloads.
SELECT inputs_ref AS digest FROM safepoint_runs
WHERE run_id IN (SELECT value FROM json_each(:run_ids)) AND inputs_ref IS NOT NULL
UNION SELECT result_ref FROM safepoint_runs
WHERE run_id IN (SELECT value FROM json_each(:run_ids)) AND result_ref IS NOT NULL
UNION SELECT result_ref FROM safepoint_steps
WHERE run_id IN (SELECT value FROM json_each(:run_ids)) AND result_ref IS NOT NULL
UNION SELECT payload_ref FROM safepoint_operations WHERE run_id IN (SELECT value FROM json_each(:run_ids))
UNION SELECT payload_ref FROM safepoint_messages
WHERE run_id IN (SELECT value FROM json_each(:run_ids)) AND payload_ref IS NOT NULL;

-- name: prune_delete_approvals
-- The approvals given for these runs' operations.
DELETE FROM safepoint_approvals WHERE run_id IN (SELECT value FROM json_each(:run_ids)) RETURNING 1 AS n;

-- name: prune_delete_messages
-- The messages sent to these runs.
DELETE FROM safepoint_messages WHERE run_id IN (SELECT value FROM json_each(:run_ids)) RETURNING 1 AS n;

-- name: prune_delete_attempts
-- These runs' failed attempts.
DELETE FROM safepoint_attempts WHERE run_id IN (SELECT value FROM json_each(:run_ids)) RETURNING 1 AS n;

-- name: prune_delete_steps
-- These runs' steps.
DELETE FROM safepoint_steps WHERE run_id IN (SELECT value FROM json_each(:run_ids)) RETURNING 1 AS n;

-- name: prune_delete_operations
-- These runs' operations.
DELETE FROM safepoint_operations WHERE run_id IN (SELECT value FROM json_each(:run_ids)) RETURNING 1 AS n;

-- name: prune_delete_events
-- These runs' history.
DELETE FROM safepoint_events WHERE run_id IN (SELECT value FROM json_each(:run_ids)) RETURNING 1 AS n;

-- name: prune_families
-- The families of the runs a prune deletes.
SELECT DISTINCT family_id FROM safepoint_runs WHERE run_id IN (SELECT value FROM json_each(:run_ids));

-- name: prune_families_left
-- Of those families, the ones with a run left (their claims stay: a member that carries on
-- must not send what a pruned one sent).
SELECT DISTINCT family_id FROM safepoint_runs WHERE family_id IN (SELECT value FROM json_each(:family_ids));

-- name: prune_delete_family_claims
-- The claims of the families none of whose runs is left.
DELETE FROM safepoint_family_claims WHERE family_id IN (SELECT value FROM json_each(:family_ids))
RETURNING 1 AS n;

-- name: prune_delete_runs
-- The runs themselves, last: nothing references them any more.
DELETE FROM safepoint_runs WHERE run_id IN (SELECT value FROM json_each(:run_ids)) RETURNING 1 AS n;

-- name: prune_artifact_copies
-- Every copy of those artifacts, each by its run, to be locked one by one (prune_lock_artifact)
-- where the store locks rows only in a statement about one run.
SELECT run_id, digest FROM safepoint_artifacts WHERE digest IN (SELECT value FROM json_each(:digests))
ORDER BY run_id, digest;

-- name: prune_lock_artifact
-- One copy of an artifact, locked (as prune_lock_artifacts locks them all).
SELECT 1 AS locked FROM safepoint_artifacts WHERE run_id = :run_id AND digest = :digest;

-- name: prune_artifacts_referenced
-- Of those artifacts, the ones a row still references (read by digest, no join).
SELECT inputs_ref AS digest FROM safepoint_runs WHERE inputs_ref IN (SELECT value FROM json_each(:digests))
UNION SELECT result_ref FROM safepoint_runs WHERE result_ref IN (SELECT value FROM json_each(:digests))
UNION SELECT result_ref FROM safepoint_steps WHERE result_ref IN (SELECT value FROM json_each(:digests))
UNION SELECT payload_ref FROM safepoint_operations WHERE payload_ref IN (SELECT value FROM json_each(:digests))
UNION SELECT payload_ref FROM safepoint_messages WHERE payload_ref IN (SELECT value FROM json_each(:digests));

-- name: prune_delete_artifact
-- One copy of an artifact, deleted.
DELETE FROM safepoint_artifacts WHERE run_id = :run_id AND digest = :digest RETURNING size;

-- name: prune_lock_artifacts
-- The artifacts the deleted runs referenced (BEGIN IMMEDIATE already holds every writer that might reference one off).
SELECT digest FROM safepoint_artifacts WHERE digest IN (SELECT value FROM json_each(:digests));

-- name: prune_delete_artifacts
-- Of those, the artifacts no row references any more (one index probe per reference column).
DELETE FROM safepoint_artifacts AS a
WHERE a.digest IN (SELECT value FROM json_each(:digests))
  AND NOT EXISTS (SELECT 1 FROM safepoint_runs WHERE inputs_ref = a.digest)
  AND NOT EXISTS (SELECT 1 FROM safepoint_runs WHERE result_ref = a.digest)
  AND NOT EXISTS (SELECT 1 FROM safepoint_steps WHERE result_ref = a.digest)
  AND NOT EXISTS (SELECT 1 FROM safepoint_operations WHERE payload_ref = a.digest)
  AND NOT EXISTS (SELECT 1 FROM safepoint_messages WHERE payload_ref = a.digest)
RETURNING size;
-- == encryption at rest: values sealed again (safepoint.storage.resealing) =====================
-- A fork's copied rows, sealed for the source's, are sealed again for the fork's; a rotation
-- seals every value again with the active key, a page of rows at a time, in key order (:after_*
-- the last key of the page before; :run_id NULL: every run's rows).

-- name: reseal_runs_page
-- A page of the runs' rows with their sealed columns (and the recovery record, whose reason and
-- evidence are sealed inside it), after the given key.
SELECT run_id, inputs, result, error, recovery_record, waiting_for FROM safepoint_runs
WHERE (:run_id IS NULL OR run_id = :run_id) AND run_id > :after_run_id
ORDER BY run_id LIMIT :limit;

-- name: reseal_runs_update
-- One row's sealed columns, sealed again.
UPDATE safepoint_runs SET inputs = :inputs, result = :result, error = :error,
  recovery_record = :recovery_record, waiting_for = :waiting_for
WHERE run_id = :run_id;

-- name: reseal_steps_page
-- A page of the steps' rows with their sealed columns, after the given key.
SELECT run_id, step_id, result, error FROM safepoint_steps
WHERE (:run_id IS NULL OR run_id = :run_id) AND (run_id, step_id) > (:after_run_id, :after_step_id)
ORDER BY run_id, step_id LIMIT :limit;

-- name: reseal_steps_update
-- One row's sealed columns, sealed again.
UPDATE safepoint_steps SET result = :result, error = :error
WHERE run_id = :run_id AND step_id = :step_id;

-- name: reseal_attempts_page
-- A page of the failed attempts' rows with their sealed columns, after the given key.
SELECT run_id, step_id, attempt, error FROM safepoint_attempts
WHERE (:run_id IS NULL OR run_id = :run_id)
  AND (run_id, step_id, attempt) > (:after_run_id, :after_step_id, :after_attempt)
ORDER BY run_id, step_id, attempt LIMIT :limit;

-- name: reseal_attempts_update
-- One row's sealed columns, sealed again.
UPDATE safepoint_attempts SET error = :error
WHERE run_id = :run_id AND step_id = :step_id AND attempt = :attempt;

-- name: reseal_operations_page
-- A page of the operations' rows with their sealed columns, after the given key.
SELECT run_id, operation_id, receipt, error FROM safepoint_operations
WHERE (:run_id IS NULL OR run_id = :run_id)
  AND (run_id, operation_id) > (:after_run_id, :after_operation_id)
ORDER BY run_id, operation_id LIMIT :limit;

-- name: reseal_operations_update
-- One row's sealed columns, sealed again.
UPDATE safepoint_operations SET receipt = :receipt, error = :error
WHERE run_id = :run_id AND operation_id = :operation_id;

-- name: reseal_messages_page
-- A page of the messages' rows with their sealed columns, after the given key.
SELECT seq, run_id, name, payload FROM safepoint_messages
WHERE (:run_id IS NULL OR run_id = :run_id) AND seq > :after_seq
ORDER BY seq LIMIT :limit;

-- name: reseal_messages_update
-- One row's sealed columns, sealed again.
UPDATE safepoint_messages SET payload = :payload
WHERE seq = :seq;

-- name: reseal_events_page
-- A page of the events with a detail (sealed whole, or holding a step's sealed values), after
-- the given key; of the ledger's own (run id ''), only the mark that names its key (sealed_since).
SELECT event_id, run_id, kind, step_id, detail FROM safepoint_events
WHERE (:run_id IS NULL OR run_id = :run_id) AND (run_id <> '' OR kind = 'ledger.sealed')
  AND detail IS NOT NULL
  AND event_id > :after_event_id
ORDER BY event_id LIMIT :limit;

-- name: reseal_events_update
-- One event's detail, sealed again.
UPDATE safepoint_events SET detail = :detail WHERE event_id = :event_id;

-- name: reseal_approvals_page
-- A page of the approvals with a person's words (evidence, a revocation's reason), after the
-- given key.
SELECT approval_id, run_id, evidence, revoke_reason FROM safepoint_approvals
WHERE (:run_id IS NULL OR run_id = :run_id) AND approval_id > :after_approval_id
  AND (evidence IS NOT NULL OR revoke_reason IS NOT NULL)
ORDER BY approval_id LIMIT :limit;

-- name: reseal_approvals_update
-- One approval's sealed columns, sealed again.
UPDATE safepoint_approvals SET evidence = :evidence, revoke_reason = :revoke_reason
WHERE approval_id = :approval_id;

-- name: reseal_artifacts_page
-- A page of artifacts, after the given digest.
SELECT digest, content FROM safepoint_artifacts WHERE digest > :after_digest
ORDER BY digest LIMIT :limit;

-- name: reseal_artifacts_update
-- One artifact's content, sealed again.
UPDATE safepoint_artifacts SET content = :content WHERE digest = :digest;
