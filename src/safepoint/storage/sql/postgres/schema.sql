-- safepoint ledger, PostgreSQL dialect: the whole schema, which is also migration 1.
--
-- Read this file to learn the ledger. While no later migration ships, this text is migration 1
-- (0001_initial.sql): every ledger is created by it and records its checksum, so it is not
-- edited in place once a ledger may hold it. A change to the schema first copies this file as
-- it is, byte for byte, to migrations/0001_initial.sql, then adds migrations/0002_<what>.sql
-- and makes the same change here: from then on this file is the schema the migrations leave,
-- and tests/conformance/test_schema.py applies every migration to an empty schema and compares
-- the result with it (the table of applied migrations, safepoint_schema_version, belongs to the
-- migration machinery and is left out). safepoint/storage/migrations.py says why, and how the
-- schema may be squashed again before a release.
--
-- The data model: a RUN is one execution of a workflow with fixed inputs. It is owned by at most
-- one worker at a time; the owner holds a LEASE (lease_expires_at, database clock) and a FENCE
-- token that grows on every claim, and every ledger write names the fence it believes in, so a
-- stale worker's write matches no row (safepoint/_rules/fencing.py tells the whole story). A
-- run's STEPS are its recorded observations (pure results, reads, model responses, decisions,
-- recorded clock and random values), keyed by a stable step id. An effect step is also an
-- OPERATION: the row that walks the dispatch protocol prepared -> dispatching ->
-- applied/rejected/unknown -> accepted, with its idempotency key (effect_key) minted once and its
-- payload stored as an ARTIFACT (content-addressed bytes whose sha256 is checked on every read).
-- EVENTS is the append-only log of transitions: what happened, when, by which worker under which
-- fence. ATTEMPTS are the failed tries of a step that is tried again; APPROVALS are a person's
-- word that an effect may be dispatched; the LEDGER row is this ledger's identity.
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
-- inline limit are stored as artifacts and referenced by digest (*_ref columns). NULL in an
-- optional column means "none" (no limit, no deadline, not revoked …). A status, kind or state
-- is text, and no CHECK lists its values: the enums of safepoint/types.py are the one list, and
-- a value this safepoint does not know (a newer one's, a hand edit's) makes its row unreadable
-- (CorruptRecord; a listing shows an UnreadableRun: safepoint/storage/_rows.py), never
-- something it is not.

-- The one definition of "now" (epoch ms) used by every statement. clock_timestamp() rather than
-- now(): a long transaction must not hand out leases that started in the past. STABLE, not
-- VOLATILE: a distributed PostgreSQL (Citus) refuses volatile functions in the UPDATEs that take
-- and check leases, and evaluates a stable one once, on the node that plans the statement, so
-- every shard sees one clock. Each statement reads it once, in a MATERIALIZED `clock` CTE
-- (docs/scaling.md). PL/pgSQL, not SQL: a stable SQL function that calls a volatile one is not
-- inlined, and is parsed and planned again on every call; PL/pgSQL keeps its plan.
CREATE FUNCTION safepoint_now_ms() RETURNS BIGINT
    LANGUAGE plpgsql STABLE
    AS $$ BEGIN RETURN (extract(epoch FROM clock_timestamp()) * 1000)::bigint; END $$;

CREATE TABLE safepoint_runs (
    run_id               TEXT    PRIMARY KEY,
    workflow             TEXT    NOT NULL,
    workflow_version     TEXT    NOT NULL,
    -- waiting: for a person's approval, a message or a timer (released; workers take it once
    -- wake_at is due); stopped: a limit was reached, resumable once a person raises it;
    -- continued: ended by continue-as-new, pointing at its successor
    status               TEXT    NOT NULL,
    input_hash           TEXT    NOT NULL,
    inputs               TEXT,
    inputs_ref           TEXT,
    state_revision       BIGINT  NOT NULL DEFAULT 0,
    owner                TEXT,
    lease_expires_at     BIGINT,
    fence                BIGINT  NOT NULL DEFAULT 0,
    resume_count         INTEGER NOT NULL DEFAULT 0,
    event_count          INTEGER NOT NULL DEFAULT 0,
    result               TEXT,
    result_ref           TEXT,
    error                TEXT,
    recovery_record      TEXT,
    created_at           BIGINT  NOT NULL,
    updated_at           BIGINT  NOT NULL,
    -- takeovers allowed before the run fails with BudgetExhausted
    resume_budget        INTEGER,
    -- when someone asked the run to stop: from then on its worker settles what is in flight
    -- (outcomes, reconciliation) but starts nothing new
    cancel_requested_at  BIGINT,
    -- what the code that started the run was built from, beyond its version: a digest over
    -- its tool schemas, model ids and prompt hashes, and those parts (JSON), so that a
    -- refusal can say which part changed
    workflow_fingerprint TEXT,
    workflow_manifest    TEXT,
    -- limits that survive restarts: past deadline_at (database clock) no new step or dispatch
    -- starts; what the model steps spent is added up in the statement that records each;
    -- step_attempts is the run's default Retry policy (JSON)
    deadline_at          BIGINT,
    token_budget         BIGINT,
    cost_budget          DOUBLE PRECISION,
    tokens_spent         BIGINT  NOT NULL DEFAULT 0,
    cost_spent           DOUBLE PRECISION NOT NULL DEFAULT 0,
    step_attempts        TEXT,
    -- what a waiting run waits for (JSON text)
    waiting_for          TEXT,
    -- HISTORY: the run's events plus its steps, counted exactly by the statements that append
    -- them. Crossing the soft limit records one run.history_warning (at history_warned_at); a
    -- write that would start something new past the hard limit is refused
    step_count           INTEGER NOT NULL DEFAULT 0,
    history_soft_limit   INTEGER,
    history_hard_limit   INTEGER,
    history_warned_at    BIGINT,
    -- CHAIN: every run of a continue-as-new chain names the chain's first run and its place in
    -- it (0 for the first); a successor names its parent, a continued run its successor.
    -- Nothing of a parent's history is copied
    chain_id             TEXT    NOT NULL,
    chain_index          INTEGER NOT NULL DEFAULT 0,
    parent_run_id        TEXT,
    successor_run_id     TEXT,
    -- TURNS: the model steps the run may make (NULL: no limit) and has made; a person may
    -- raise every read and model step's attempts to at least step_attempt_limit
    model_call_budget    INTEGER,
    model_calls_spent    INTEGER NOT NULL DEFAULT 0,
    step_attempt_limit   INTEGER,
    -- a waiting run is due at wake_at (its sleep ends, its wait times out): workers take it then
    wake_at              BIGINT,
    -- a fork: the run and step it was forked from (JSON); it holds copies of the steps before it
    forked_from          TEXT,
    -- when its worker last renewed the lease (the heartbeat); NULL: not since the claim
    heartbeat_at         BIGINT,
    -- FAMILY: the run its family grew from (its forks, their successors, …: an operation is
    -- applied at most once across them) and its generation there (its place in a chain; a fork
    -- stands where its source stands)
    family_id            TEXT,
    family_generation    INTEGER NOT NULL DEFAULT 0
);

CREATE INDEX safepoint_runs_status ON safepoint_runs (status, updated_at);

-- What a console lists: newest created first, one page after another (keyset paging).
CREATE INDEX safepoint_runs_created ON safepoint_runs (created_at, run_id);

-- What claim_next scans: runs a worker may take, oldest first.
CREATE INDEX safepoint_runs_runnable ON safepoint_runs (created_at, run_id)
    WHERE status IN ('pending', 'running');

-- What claim_next looks at for waiting runs: those due (a sleep ended, a wait timed out).
CREATE INDEX safepoint_runs_due ON safepoint_runs (wake_at) WHERE status = 'waiting';

-- The runs of a chain, in order: following a chain, and its next run's place.
CREATE INDEX safepoint_runs_chain ON safepoint_runs (chain_id, chain_index);

-- What a prune looks for: the last runs of their chains that finished, oldest first.
CREATE INDEX safepoint_runs_finished ON safepoint_runs (updated_at, run_id)
    WHERE successor_run_id IS NULL AND status IN ('completed', 'failed', 'cancelled');

-- The forks of a run (a prune keeps a fork's source while the fork stays).
CREATE INDEX safepoint_runs_fork_source ON safepoint_runs ((forked_from::jsonb ->> 'run_id'))
    WHERE forked_from IS NOT NULL;

-- Whether anything still references an artifact (a prune deletes those nothing references).
CREATE INDEX safepoint_runs_inputs_ref ON safepoint_runs (inputs_ref) WHERE inputs_ref IS NOT NULL;

CREATE INDEX safepoint_runs_result_ref ON safepoint_runs (result_ref) WHERE result_ref IS NOT NULL;

-- A family's runs: whether any is left (a prune keeps the family's claims while one is).
CREATE INDEX safepoint_runs_family ON safepoint_runs (family_id);

CREATE TABLE safepoint_steps (
    run_id        TEXT    NOT NULL REFERENCES safepoint_runs (run_id),
    step_id       TEXT    NOT NULL,
    seq           INTEGER NOT NULL,         -- order of first record within the run
    kind          TEXT    NOT NULL,
    name          TEXT    NOT NULL,
    input_hash    TEXT    NOT NULL,
    status        TEXT    NOT NULL DEFAULT 'completed',
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
    tokens        BIGINT,                   -- model steps: the usage they reported
    cost          DOUBLE PRECISION,
    PRIMARY KEY (run_id, step_id)
);

CREATE INDEX safepoint_steps_result_ref ON safepoint_steps (result_ref) WHERE result_ref IS NOT NULL;

CREATE TABLE safepoint_operations (
    run_id               TEXT    NOT NULL REFERENCES safepoint_runs (run_id),
    operation_id         TEXT    NOT NULL,
    step_id              TEXT    NOT NULL,
    effect               TEXT    NOT NULL,
    state                TEXT    NOT NULL,
    payload_ref          TEXT    NOT NULL,  -- artifact digest of the canonical payload
    effect_key           TEXT    NOT NULL,  -- minted once at prepare, never again
    dispatch_count       INTEGER NOT NULL DEFAULT 0,
    first_dispatched_at  BIGINT,            -- bounds re-dispatch by the owner's dedup retention
    receipt              TEXT,
    error                TEXT,              -- evidence of a rejection or an unknown outcome
    fence                BIGINT  NOT NULL,
    prepared_at          BIGINT  NOT NULL,
    updated_at           BIGINT  NOT NULL,
    -- dispatched only under an approval; the target's state as last read at the gate; the
    -- approval that authorized the latest dispatch
    approval_required    BOOLEAN NOT NULL DEFAULT false,
    target_digest        TEXT,
    approval_id          TEXT,
    -- the run's chain: a successor finds an operation an earlier run settled by
    -- (chain_id, operation_id)
    chain_id             TEXT    NOT NULL,
    -- which attempt of the operation its effect_key was minted for: 1, unless a person had an
    -- operation the owner rejected sent again (retry), under a key derived from the attempt
    key_attempt          INTEGER NOT NULL DEFAULT 1,
    -- how long the effect's owner remembers a key, as the effect declared it (dedup_retention);
    -- NULL: none declared. A prune keeps an operation its owner may still remember
    dedup_retention_ms   BIGINT,
    -- what the operation is within the run's family (safepoint/_rules/family.py)
    family_key           TEXT,
    -- the last time a dispatch of it (under any of its keys) was committed; never cleared, as
    -- dispatch_count and first_dispatched_at are for a resend: it was sent, and a prune keeps
    -- it while its owner may remember the key
    last_dispatched_at   BIGINT,
    PRIMARY KEY (run_id, operation_id)
);

-- An effect step of a successor looks its operation id up in the runs before it: one probe.
CREATE INDEX safepoint_operations_chain ON safepoint_operations (chain_id, operation_id);

CREATE INDEX safepoint_operations_payload ON safepoint_operations (payload_ref);

-- Every event of a run is written while its runs row is locked, so within a run event_id
-- order is commit order. Like every key here, the primary key starts with run_id: a database
-- that shards the tables by run_id enforces each key on one shard (docs/scaling.md).
CREATE TABLE safepoint_events (
    event_id      BIGINT  GENERATED ALWAYS AS IDENTITY,
    run_id        TEXT    NOT NULL,
    at            BIGINT  NOT NULL,
    kind          TEXT    NOT NULL,
    step_id       TEXT,
    operation_id  TEXT,
    fence         BIGINT,
    worker        TEXT,
    detail        TEXT,
    PRIMARY KEY (run_id, event_id)
);

-- Kept with the run that stored them (the same bytes once per run: a database sharded by
-- run_id keeps them on the run's shard); read by digest alone, from whichever run stored them.
CREATE TABLE safepoint_artifacts (
    digest      TEXT    NOT NULL,           -- 'sha256:<hex>' of content
    size        BIGINT  NOT NULL,
    content     BYTEA   NOT NULL,
    created_at  BIGINT  NOT NULL,
    run_id      TEXT    NOT NULL,
    PRIMARY KEY (run_id, digest)
);

CREATE INDEX safepoint_artifacts_digest ON safepoint_artifacts (digest);

-- Each failed attempt of a read or model step that is tried again, recorded before the back-off
-- (with the instant the next attempt may start), so that a restart continues the count and
-- waits out the rest. Kept after the step succeeds or fails for good: its history.
CREATE TABLE safepoint_attempts (
    run_id      TEXT    NOT NULL REFERENCES safepoint_runs (run_id),
    step_id     TEXT    NOT NULL,
    attempt     INTEGER NOT NULL,           -- counts every call of the step's function
    kind        TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    input_hash  TEXT    NOT NULL,
    error       TEXT    NOT NULL,           -- the failure's type and message
    retry_at    BIGINT  NOT NULL,           -- the next attempt starts no earlier
    fence       BIGINT  NOT NULL,
    recorded_at BIGINT  NOT NULL,
    PRIMARY KEY (run_id, step_id, attempt)
);

-- An APPROVAL is bound to its operation's payload digest and target digest, may expire
-- (database clock), and authorizes a dispatch only while all three still hold. A person may
-- revoke it before the dispatch: the row stays (evidence of what was authorized, by whom),
-- marked revoked (when, by whom, why), and authorizes nothing.
CREATE TABLE safepoint_approvals (
    approval_id     TEXT    NOT NULL,
    run_id          TEXT    NOT NULL,
    operation_id    TEXT    NOT NULL,
    step_id         TEXT    NOT NULL,
    payload_digest  TEXT    NOT NULL,   -- the payload approved ('sha256:<hex>')
    target_digest   TEXT,               -- the target's state approved; NULL: no target state
    approved_by     TEXT    NOT NULL,
    evidence        TEXT,
    approved_at     BIGINT  NOT NULL,
    expires_at      BIGINT,             -- NULL: does not expire
    -- the order approvals were given in (a run's approvals are serialised on its row lock)
    seq             BIGINT  GENERATED ALWAYS AS IDENTITY,
    revoked_at      BIGINT,
    revoked_by      TEXT,
    revoke_reason   TEXT,
    PRIMARY KEY (run_id, approval_id),
    FOREIGN KEY (run_id, operation_id) REFERENCES safepoint_operations (run_id, operation_id)
);

CREATE INDEX safepoint_approvals_operation ON safepoint_approvals (run_id, operation_id);

-- A MESSAGE is a JSON payload sent to a run from outside (a person's answer, a webhook's body)
-- under a name its workflow waits for (run.wait_for). Kept from the moment it is sent, whether
-- the run waits yet or not; each wait takes the oldest message of its name not yet taken, and
-- records it as the wait step's result (taken_by), so a second message of the name is there for
-- the next wait. A message_id the sender gives is kept once per run: a webhook delivered twice
-- is one message. An ANSWER is a message addressed to one wait step (for_wait, its step id;
-- safepoint.answer): that wait takes it before anything queued by name, no other wait takes it,
-- and a wait takes one answer (the unique index below; the store refuses a second one).
CREATE TABLE safepoint_messages (
    seq          BIGINT  GENERATED ALWAYS AS IDENTITY,  -- the order sent in
    run_id       TEXT    NOT NULL REFERENCES safepoint_runs (run_id),
    name         TEXT    NOT NULL,
    message_id   TEXT,               -- the sender's id for it; NULL: none given
    payload      TEXT,
    payload_ref  TEXT,
    sent_by      TEXT,
    sent_at      BIGINT  NOT NULL,
    taken_by     TEXT,               -- the wait step that received it; NULL: not yet taken
    taken_at     BIGINT,
    for_wait     TEXT,               -- an answer: the wait step it is addressed to; NULL: queued by name
    PRIMARY KEY (run_id, seq)
);

CREATE UNIQUE INDEX safepoint_messages_id ON safepoint_messages (run_id, message_id);

-- A wait looks for the oldest message of its name not yet taken.
CREATE INDEX safepoint_messages_name ON safepoint_messages (run_id, name, seq);

CREATE INDEX safepoint_messages_payload_ref ON safepoint_messages (payload_ref)
    WHERE payload_ref IS NOT NULL;

-- One answer per wait.
CREATE UNIQUE INDEX safepoint_messages_answer ON safepoint_messages (run_id, for_wait)
    WHERE for_wait IS NOT NULL;

-- Which member of a run family holds each operation of the family (by its family key): taken
-- in the dispatch's own transaction (sent), so no two members send one operation; only a
-- dispatch that provably never left gives it back (not sent), for the next member to take.
CREATE TABLE safepoint_family_claims (
    family_id     TEXT    NOT NULL,
    claim_key     TEXT    NOT NULL,
    run_id        TEXT    NOT NULL,
    operation_id  TEXT    NOT NULL,  -- a transaction step's: its step id
    sent          BOOLEAN NOT NULL,
    PRIMARY KEY (family_id, claim_key)
);

CREATE INDEX safepoint_family_claims_holder ON safepoint_family_claims (run_id, operation_id);

-- The ledger's own id, minted once, here, and never changed: part of every effect key minted in
-- it, so that two ledgers (dev and prod, two tenants, a schema dropped and created again) never
-- send one key to one owner even for the same run ids. KEYED_SINCE is when it was minted
-- (database clock). One row, and no other (the ledger's one CHECK): a ledger has one identity.
CREATE TABLE safepoint_ledger (
    singleton    INTEGER PRIMARY KEY CHECK (singleton = 1),
    ledger_id    TEXT    NOT NULL,
    keyed_since  BIGINT  NOT NULL
);
INSERT INTO safepoint_ledger (singleton, ledger_id, keyed_since)
VALUES (1, replace(gen_random_uuid()::text, '-', ''),
        (extract(epoch FROM clock_timestamp()) * 1000)::bigint);
