-- The fenced writes of a ledger Citus distributes by run (?distributed=citus), as functions of
-- the ledger (storage/postgres/routed.py). A statement of queries.sql that writes several
-- tables with data-modifying CTEs is not one Citus can send whole to the run's shard: it plans
-- each CTE apart, copies their results to every node and commits on all of them in two phases
-- (12-13x a step's cost on plain PostgreSQL, docs/scaling.md). So such a statement has here,
-- under its name, the body of a PL/pgSQL function taking the statement's parameters (params:,
-- each `p_<name>`) and returning its row (returns:); the function is made in the ledger's
-- schema when the ledger is distributed, distributed with the runs on its first parameter, the
-- run's id, and the store calls it instead of the statement: Citus carries the call out on the
-- run's node, whose statements are about that run alone, planned once per connection. The
-- fence comes first; what follows it runs only when it matched, as in the one statement.
-- (#variable_conflict use_column: a name that is a column and a returned field is the column.)

-- name: record_step
-- params: run_id text, fence bigint, lease_ms bigint, tokens bigint, cost double precision,
--   model_call boolean, step_id text, seq integer, kind text, name text, input_hash text,
--   step_status text, result text, result_ref text, step_error text, next_step_id text,
--   attempt integer, model_id text, prompt_hash text, observed_at bigint,
--   step_operation_id text
-- returns: run_id text, now bigint, history bigint, history_soft_limit integer,
--   history_hard_limit integer, history_warned_at bigint
DECLARE
    at bigint := safepoint_now_ms();
    grows integer := CASE WHEN EXISTS (SELECT 1 FROM safepoint_steps AS s
                                       WHERE s.run_id = p_run_id AND s.step_id = p_step_id)
                          THEN 0 ELSE 1 END;
BEGIN
    UPDATE safepoint_runs
    SET state_revision = state_revision + 1, lease_expires_at = at + p_lease_ms,
        step_count = step_count + grows, updated_at = at,
        tokens_spent = tokens_spent + COALESCE(p_tokens, 0),
        cost_spent = cost_spent + COALESCE(p_cost, 0),
        model_calls_spent = model_calls_spent + CASE WHEN p_model_call THEN 1 ELSE 0 END
    WHERE run_id = p_run_id AND fence = p_fence AND status = 'running'
      AND cancel_requested_at IS NULL AND (deadline_at IS NULL OR deadline_at > at)
      AND (history_hard_limit IS NULL OR event_count + step_count + grows <= history_hard_limit)
    RETURNING run_id, updated_at, event_count + step_count, history_soft_limit,
              history_hard_limit, history_warned_at
    INTO run_id, now, history, history_soft_limit, history_hard_limit, history_warned_at;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    INSERT INTO safepoint_steps (run_id, step_id, seq, kind, name, input_hash, status, result,
                                 result_ref, error, next_step_id, attempt, model_id,
                                 prompt_hash, observed_at, operation_id, fence, recorded_at,
                                 tokens, cost)
    VALUES (p_run_id, p_step_id, p_seq, p_kind, p_name, p_input_hash, p_step_status, p_result,
            p_result_ref, p_step_error, p_next_step_id, p_attempt, p_model_id, p_prompt_hash,
            p_observed_at, p_step_operation_id, p_fence, at, p_tokens, p_cost)
    ON CONFLICT (run_id, step_id) DO UPDATE SET
        kind = excluded.kind, name = excluded.name, input_hash = excluded.input_hash,
        status = excluded.status, result = excluded.result, result_ref = excluded.result_ref,
        error = excluded.error, next_step_id = excluded.next_step_id,
        attempt = excluded.attempt, model_id = excluded.model_id,
        prompt_hash = excluded.prompt_hash, observed_at = excluded.observed_at,
        operation_id = excluded.operation_id, fence = excluded.fence,
        recorded_at = excluded.recorded_at, tokens = excluded.tokens, cost = excluded.cost;
    RETURN NEXT;
END

-- name: claim_run
-- params: run_id text, expected_revision bigint, owner text, lease_ms bigint, dead_owner text,
--   detail text
-- returns: run_id text, fence bigint, state_revision bigint, lease_expires_at bigint
DECLARE
    at bigint := safepoint_now_ms();
    took bigint;
BEGIN
    UPDATE safepoint_runs
    SET status = 'running', owner = p_owner, lease_expires_at = at + p_lease_ms,
        fence = fence + 1, state_revision = state_revision + 1,
        resume_count = resume_count + CASE WHEN status = 'running' AND owner IS NOT NULL
                                           THEN 1 ELSE 0 END,
        event_count = event_count + 1, waiting_for = NULL, wake_at = NULL, updated_at = at
    WHERE run_id = p_run_id AND state_revision = p_expected_revision
      AND status IN ('pending', 'running', 'blocked', 'waiting')
      AND (owner IS NULL OR lease_expires_at <= at OR owner = p_dead_owner)
    RETURNING run_id, fence, state_revision, lease_expires_at
    INTO run_id, took, state_revision, lease_expires_at;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    fence := took;
    INSERT INTO safepoint_events (run_id, at, kind, fence, worker, detail)
    VALUES (p_run_id, at, 'run.claimed', took, p_owner, p_detail);
    RETURN NEXT;
END

-- name: claim_candidate
-- params: run_id text, owner text, lease_ms bigint, workflows text[]
-- returns: run_id text, fence bigint, state_revision bigint, lease_expires_at bigint
DECLARE
    at bigint := safepoint_now_ms();
    runnable text;
    took bigint;
BEGIN
    -- still runnable, and not held by another transaction (passed over, as SKIP LOCKED does)
    SELECT r.run_id INTO runnable FROM safepoint_runs AS r
    WHERE r.run_id = p_run_id
      AND (r.status = 'pending'
           OR (r.status = 'running' AND (r.lease_expires_at IS NULL OR r.lease_expires_at <= at))
           OR (r.status = 'waiting' AND r.wake_at <= at))
      AND (r.workflow = ANY(p_workflows) OR r.workflow || '@' || r.workflow_version = ANY(p_workflows))
    FOR UPDATE SKIP LOCKED;
    IF runnable IS NULL THEN
        RETURN;
    END IF;
    UPDATE safepoint_runs
    SET status = 'running', owner = p_owner, lease_expires_at = at + p_lease_ms,
        fence = fence + 1, state_revision = state_revision + 1,
        resume_count = resume_count + CASE WHEN status = 'running' AND owner IS NOT NULL
                                           THEN 1 ELSE 0 END,
        event_count = event_count + 1, waiting_for = NULL, wake_at = NULL, updated_at = at
    WHERE run_id = p_run_id
    RETURNING run_id, fence, state_revision, lease_expires_at
    INTO run_id, took, state_revision, lease_expires_at;
    fence := took;
    INSERT INTO safepoint_events (run_id, at, kind, fence, worker)
    VALUES (p_run_id, at, 'run.claimed', took, p_owner);
    RETURN NEXT;
END
