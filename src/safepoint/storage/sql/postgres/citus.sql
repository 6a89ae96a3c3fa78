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
--
-- On the run's node, the statements write the run's shards themselves, named by
-- safepoint_local_tables (below): a statement about a distributed table, even one Citus runs
-- on the node it was sent to, first goes through Citus's planner and executor, which cost
-- about as much again as the statement; a shard is a table PostgreSQL writes as it is. The
-- statements are formatted with the shards' names, which come from Citus's catalog; every
-- value is a parameter (USING).

-- function: local_tables
-- The names under which this call writes `tables` for the run: where this node holds the
-- run's shards, the shards, and the lock Citus's own writes take on them held to the end of
-- the transaction, so that a shard move or split waits for it (and one finished before it is
-- seen here); anywhere else (the call was not carried out on the run's node, or a move took
-- the shards away), the distributed tables themselves, for Citus to route. The lock is Citus's
-- to give only to the tables' owner: any other role writes through the distributed tables.
-- params: run_id text, tables VARIADIC text[]
-- returns: text[]
DECLARE
    shard bigint := get_shard_id_for_distribution_column('safepoint_runs', p_run_id);
BEGIN
    IF NOT pg_has_role((SELECT relowner FROM pg_class WHERE oid = 'safepoint_runs'::regclass), 'USAGE') THEN
        RETURN p_tables;
    END IF;
    PERFORM lock_shard_metadata(5, ARRAY[shard]);  -- ShareLock, as Citus's executor takes
    IF NOT EXISTS (SELECT 1 FROM pg_dist_placement AS p JOIN pg_dist_local_group AS g USING (groupid)
                   WHERE p.shardid = shard) THEN
        RETURN p_tables;
    END IF;
    RETURN ARRAY(SELECT shard_name(t::regclass, get_shard_id_for_distribution_column(t::regclass, p_run_id))
                 FROM unnest(p_tables) AS t);
END

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
    runs text;
    steps text;
    grows integer;
BEGIN
    SELECT t[1], t[2] INTO runs, steps
    FROM safepoint_local_tables(p_run_id, 'safepoint_runs', 'safepoint_steps') AS t;
    EXECUTE format($q$SELECT CASE WHEN EXISTS (SELECT 1 FROM %s WHERE run_id = $1 AND step_id = $2)
                                 THEN 0 ELSE 1 END$q$, steps)
        USING p_run_id, p_step_id INTO grows;
    EXECUTE format($q$UPDATE %s
        SET state_revision = state_revision + 1, lease_expires_at = $2 + $3,
            step_count = step_count + $4, updated_at = $2,
            tokens_spent = tokens_spent + COALESCE($5, 0),
            cost_spent = cost_spent + COALESCE($6, 0),
            model_calls_spent = model_calls_spent + CASE WHEN $7 THEN 1 ELSE 0 END
        WHERE run_id = $1 AND fence = $8 AND status = 'running'
          AND cancel_requested_at IS NULL AND (deadline_at IS NULL OR deadline_at > $2)
          AND (history_hard_limit IS NULL OR event_count + step_count + $4 <= history_hard_limit)
        RETURNING run_id, updated_at, event_count + step_count, history_soft_limit,
                  history_hard_limit, history_warned_at$q$, runs)
        USING p_run_id, at, p_lease_ms, grows, p_tokens, p_cost, p_model_call, p_fence
        INTO run_id, now, history, history_soft_limit, history_hard_limit, history_warned_at;
    IF run_id IS NULL THEN  -- the fence missed (EXECUTE leaves FOUND as it was)
        RETURN;
    END IF;
    EXECUTE format($q$INSERT INTO %s (run_id, step_id, seq, kind, name, input_hash, status, result,
                                      result_ref, error, next_step_id, attempt, model_id,
                                      prompt_hash, observed_at, operation_id, fence, recorded_at,
                                      tokens, cost)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
                $19, $20)
        ON CONFLICT (run_id, step_id) DO UPDATE SET
            kind = excluded.kind, name = excluded.name, input_hash = excluded.input_hash,
            status = excluded.status, result = excluded.result, result_ref = excluded.result_ref,
            error = excluded.error, next_step_id = excluded.next_step_id,
            attempt = excluded.attempt, model_id = excluded.model_id,
            prompt_hash = excluded.prompt_hash, observed_at = excluded.observed_at,
            operation_id = excluded.operation_id, fence = excluded.fence,
            recorded_at = excluded.recorded_at, tokens = excluded.tokens, cost = excluded.cost$q$,
        steps)
        USING p_run_id, p_step_id, p_seq, p_kind, p_name, p_input_hash, p_step_status, p_result,
              p_result_ref, p_step_error, p_next_step_id, p_attempt, p_model_id, p_prompt_hash,
              p_observed_at, p_step_operation_id, p_fence, at, p_tokens, p_cost;
    RETURN NEXT;
END
