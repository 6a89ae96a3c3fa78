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
-- A routed form appends no event: the events' ids come from an identity Citus hands out in a
-- range of each node's own, so an event appended on the run's node would sort after every
-- event appended through the coordinator, whenever it was written.

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
