-- safepoint ledger, PostgreSQL dialect, migration 1.
--
-- The data model in one paragraph: a RUN is one execution of a workflow with fixed inputs. It is
-- owned by at most one worker at a time; the owner holds a LEASE (lease_expires_at, database
-- clock) and a FENCE token that grows on every claim, and every ledger write names the fence it
-- believes in, so a stale worker's write matches no row. A run's STEPS are its recorded
-- observations (pure results, reads, model responses, decisions, recorded clock and random
-- values), keyed by a stable step id. An effect step is also an OPERATION: the row that walks
-- the dispatch protocol prepared -> dispatching -> applied/rejected/unknown -> accepted, with
-- its idempotency key (effect_key) minted once and its payload stored as an ARTIFACT
-- (content-addressed bytes whose sha256 is checked on every read). EVENTS is the append-only
-- log of transitions: what happened, when, by which worker under which fence.
--
-- Many workers on many machines share these tables, so two rules hold everywhere:
-- * "now" is the database's clock, read by safepoint_now_ms() inside the statements that take
--   or check a lease; the workers' own clocks never decide who owns a run.
-- * the runs row is the lock of its run: every claim and every fenced write updates it first,
--   so under READ COMMITTED a write racing a claim queues on that row lock and then re-checks
--   the fence against the committed row: it either committed before the claim or matches no row.
--
-- Times are BIGINT epoch milliseconds. JSON values are stored as TEXT, not JSONB, because the
-- ledger must give back exactly what it was given: JSONB would turn 1e300 into an integer,
-- reorder keys and refuse "\u0000"; nothing queries inside the JSON. Values larger than the
-- inline limit are stored as artifacts and referenced by digest (*_ref columns).

-- The one definition of "now" (epoch ms) used by every statement. clock_timestamp() rather than
-- now(): a long transaction must not hand out leases that started in the past.
CREATE FUNCTION safepoint_now_ms() RETURNS BIGINT
    LANGUAGE sql VOLATILE
    AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;

CREATE TABLE safepoint_runs (
    run_id            TEXT    PRIMARY KEY,
    workflow          TEXT    NOT NULL,
    workflow_version  TEXT    NOT NULL,
    status            TEXT    NOT NULL
                      CHECK (status IN ('pending', 'running', 'completed', 'failed',
                                        'blocked', 'cancelled')),
    input_hash        TEXT    NOT NULL,
    inputs            TEXT,
    inputs_ref        TEXT,
    state_revision    BIGINT  NOT NULL DEFAULT 0,
    owner             TEXT,
    lease_expires_at  BIGINT,
    fence             BIGINT  NOT NULL DEFAULT 0,
    resume_count      INTEGER NOT NULL DEFAULT 0,
    event_count       INTEGER NOT NULL DEFAULT 0,
    result            TEXT,
    result_ref        TEXT,
    error             TEXT,
    recovery_record   TEXT,
    created_at        BIGINT  NOT NULL,
    updated_at        BIGINT  NOT NULL
);

CREATE INDEX safepoint_runs_status ON safepoint_runs (status, updated_at);

-- What claim_next scans: runs a worker may take, oldest first.
CREATE INDEX safepoint_runs_runnable ON safepoint_runs (created_at, run_id)
    WHERE status IN ('pending', 'running');

CREATE TABLE safepoint_steps (
    run_id        TEXT    NOT NULL REFERENCES safepoint_runs (run_id),
    step_id       TEXT    NOT NULL,
    seq           INTEGER NOT NULL,         -- order of first record within the run
    kind          TEXT    NOT NULL
                  CHECK (kind IN ('pure', 'read', 'model', 'decision', 'effect', 'value')),
    name          TEXT    NOT NULL,
    input_hash    TEXT    NOT NULL,
    status        TEXT    NOT NULL DEFAULT 'completed'
                  CHECK (status IN ('completed', 'failed')),
    result        TEXT,
    result_ref    TEXT,
    error         TEXT,                     -- a failed step: its error type and message
    next_step_id  TEXT,                     -- decision steps: the planner's choice
    attempt       INTEGER NOT NULL DEFAULT 1,
    model_id      TEXT,                     -- model steps
    prompt_hash   TEXT,                     -- model steps
    observed_at   BIGINT,                   -- read steps: when the observation was made
    operation_id  TEXT,                     -- effect steps
    fence         BIGINT  NOT NULL,
    recorded_at   BIGINT  NOT NULL,
    PRIMARY KEY (run_id, step_id)
);

CREATE TABLE safepoint_operations (
    run_id               TEXT    NOT NULL REFERENCES safepoint_runs (run_id),
    operation_id         TEXT    NOT NULL,
    step_id              TEXT    NOT NULL,
    effect               TEXT    NOT NULL,
    state                TEXT    NOT NULL
                         CHECK (state IN ('prepared', 'dispatching', 'applied', 'rejected',
                                          'unknown', 'accepted')),
    payload_ref          TEXT    NOT NULL,  -- artifact digest of the canonical payload
    effect_key           TEXT    NOT NULL,  -- minted once at prepare, never again
    dispatch_count       INTEGER NOT NULL DEFAULT 0,
    first_dispatched_at  BIGINT,            -- bounds re-dispatch by the owner's dedup retention
    receipt              TEXT,
    error                TEXT,              -- evidence of a rejection or an unknown outcome
    fence                BIGINT  NOT NULL,
    prepared_at          BIGINT  NOT NULL,
    updated_at           BIGINT  NOT NULL,
    PRIMARY KEY (run_id, operation_id)
);

-- Every event of a run is written while its runs row is locked, so within a run event_id
-- order is commit order.
CREATE TABLE safepoint_events (
    event_id      BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id        TEXT    NOT NULL,
    at            BIGINT  NOT NULL,
    kind          TEXT    NOT NULL,
    step_id       TEXT,
    operation_id  TEXT,
    fence         BIGINT,
    worker        TEXT,
    detail        TEXT
);

CREATE INDEX safepoint_events_run ON safepoint_events (run_id, event_id);

CREATE TABLE safepoint_artifacts (
    digest      TEXT    PRIMARY KEY,        -- 'sha256:<hex>' of content
    size        BIGINT  NOT NULL,
    content     BYTEA   NOT NULL,
    created_at  BIGINT  NOT NULL
);
