-- Statements about one run, for a ledger Citus distributes by run (?distributed=citus): the
-- routed form of a statement of queries.sql, under its name (storage/postgres/routed.py). The
-- first statement is the fence, and what the statement returns; the ones after it run only
-- when it matched, in its transaction, each given its row's columns as parameters too. Every
-- statement names the run's id in every table it touches, so Citus sends it to the run's shard.

-- name: record_step
UPDATE safepoint_runs
SET state_revision = state_revision + 1, lease_expires_at = clock.now + %(lease_ms)s,
    step_count = step_count + growth.steps, updated_at = clock.now,
    tokens_spent = tokens_spent + COALESCE(%(tokens)s::bigint, 0),
    cost_spent = cost_spent + COALESCE(%(cost)s::double precision, 0),
    model_calls_spent = model_calls_spent + CASE WHEN %(model_call)s THEN 1 ELSE 0 END
FROM (SELECT safepoint_now_ms() AS now) AS clock,
     (SELECT CASE WHEN EXISTS (SELECT 1 FROM safepoint_steps AS s
                               WHERE s.run_id = %(run_id)s AND s.step_id = %(step_id)s)
                  THEN 0 ELSE 1 END AS steps) AS growth
WHERE run_id = %(run_id)s AND fence = %(fence)s AND status = 'running'
  AND cancel_requested_at IS NULL AND (deadline_at IS NULL OR deadline_at > clock.now)
  AND (history_hard_limit IS NULL OR event_count + step_count + growth.steps <= history_hard_limit)
RETURNING run_id, updated_at AS now, event_count + step_count AS history,
          history_soft_limit, history_hard_limit, history_warned_at;
INSERT INTO safepoint_steps (run_id, step_id, seq, kind, name, input_hash, status, result,
                             result_ref, error, next_step_id, attempt, model_id, prompt_hash,
                             observed_at, operation_id, fence, recorded_at, tokens, cost)
VALUES (%(run_id)s, %(step_id)s, %(seq)s, %(kind)s, %(name)s, %(input_hash)s, %(step_status)s,
        %(result)s, %(result_ref)s, %(step_error)s, %(next_step_id)s, %(attempt)s, %(model_id)s,
        %(prompt_hash)s, %(observed_at)s, %(step_operation_id)s, %(fence)s::bigint, %(now)s,
        %(tokens)s, %(cost)s)
ON CONFLICT (run_id, step_id) DO UPDATE SET
    kind = excluded.kind, name = excluded.name, input_hash = excluded.input_hash,
    status = excluded.status, result = excluded.result, result_ref = excluded.result_ref,
    error = excluded.error, next_step_id = excluded.next_step_id,
    attempt = excluded.attempt, model_id = excluded.model_id,
    prompt_hash = excluded.prompt_hash, observed_at = excluded.observed_at,
    operation_id = excluded.operation_id, fence = excluded.fence,
    recorded_at = excluded.recorded_at, tokens = excluded.tokens, cost = excluded.cost;
