-- safepoint ledger, SQLite dialect, migration 2: carrying a stopped run on.
--
-- A run may stop at a limit and be carried on (status 'stopped'; a turn limit, a raised
-- step-attempt limit), wait for a message or a timer (a wait step, kind 'wait'; wake_at; the
-- messages table), be forked from a step (forked_from), and have a rejected operation sent again
-- under a key derived from its attempt (key_attempt). ../schema.sql is what this leaves.
--
-- SQLite cannot change a CHECK constraint in place, so the runs and steps tables are rebuilt the
-- way SQLite documents (create, copy, drop, rename). The store runs migrations with foreign keys
-- off and checks them before it commits.

CREATE TABLE safepoint_runs_next (
    run_id               TEXT    PRIMARY KEY,
    workflow             TEXT    NOT NULL,
    workflow_version     TEXT    NOT NULL,
    -- waiting: for a person's approval, a message or a timer (released; workers take it once
    -- wake_at is due); stopped: a limit was reached, resumable once a person raises it;
    -- continued: ended by continue-as-new, pointing at its successor
    status               TEXT    NOT NULL
                         CHECK (status IN ('pending', 'running', 'completed', 'failed',
                                           'blocked', 'cancelled', 'waiting', 'continued',
                                           'stopped')),
    input_hash           TEXT    NOT NULL,
    inputs               TEXT,
    inputs_ref           TEXT,
    state_revision       INTEGER NOT NULL DEFAULT 0,
    owner                TEXT,
    lease_expires_at     INTEGER,
    fence                INTEGER NOT NULL DEFAULT 0,
    resume_count         INTEGER NOT NULL DEFAULT 0,
    event_count          INTEGER NOT NULL DEFAULT 0,
    result               TEXT,
    result_ref           TEXT,
    error                TEXT,
    recovery_record      TEXT,
    created_at           INTEGER NOT NULL,
    updated_at           INTEGER NOT NULL,
    -- takeovers allowed before the run fails with BudgetExhausted
    resume_budget        INTEGER,
    -- when someone asked the run to stop: from then on its worker settles what is in flight
    -- (outcomes, reconciliation) but starts nothing new
    cancel_requested_at  INTEGER,
    -- what the code that started the run was built from, beyond its version: a digest over
    -- its tool schemas, model ids and prompt hashes, and those parts (JSON), so that a
    -- refusal can say which part changed
    workflow_fingerprint TEXT,
    workflow_manifest    TEXT,
    -- limits that survive restarts: past deadline_at no new step or dispatch starts; what the
    -- model steps spent is added up in the commit that records each; step_attempts is the
    -- run's default Retry policy (JSON)
    deadline_at          INTEGER,
    token_budget         INTEGER,
    cost_budget          REAL,
    tokens_spent         INTEGER NOT NULL DEFAULT 0,
    cost_spent           REAL    NOT NULL DEFAULT 0,
    step_attempts        TEXT,
    -- what a waiting run waits for (JSON)
    waiting_for          TEXT,
    -- HISTORY: the run's events plus its steps, counted exactly by the statements that append
    -- them. Crossing the soft limit records one run.history_warning (at history_warned_at); a
    -- write that would start something new past the hard limit is refused
    step_count           INTEGER NOT NULL DEFAULT 0,
    history_soft_limit   INTEGER,
    history_hard_limit   INTEGER,
    history_warned_at    INTEGER,
    -- CHAIN: every run of a continue-as-new chain names the chain's first run and its place in
    -- it (0 for the first); a successor names its parent, a continued run its successor.
    -- Nothing of a parent's history is copied
    chain_id             TEXT,
    chain_index          INTEGER NOT NULL DEFAULT 0,
    parent_run_id        TEXT,
    successor_run_id     TEXT,
    -- TURNS: the model steps the run may make (NULL: no limit) and has made; a person may
    -- raise every read and model step's attempts to at least step_attempt_limit
    model_call_budget    INTEGER,
    model_calls_spent    INTEGER NOT NULL DEFAULT 0,
    step_attempt_limit   INTEGER,
    -- a waiting run is due at wake_at (its sleep ends, its wait times out): workers take it then
    wake_at              INTEGER,
    -- a fork: the run and step it was forked from (JSON); it holds copies of the steps before it
    forked_from          TEXT
);

INSERT INTO safepoint_runs_next (
    run_id, workflow, workflow_version, status, input_hash, inputs, inputs_ref, state_revision,
    owner, lease_expires_at, fence, resume_count, event_count, result, result_ref, error,
    recovery_record, created_at, updated_at, resume_budget, cancel_requested_at,
    workflow_fingerprint, workflow_manifest, deadline_at, token_budget, cost_budget,
    tokens_spent, cost_spent, step_attempts, waiting_for, step_count, history_soft_limit,
    history_hard_limit, history_warned_at, chain_id, chain_index, parent_run_id,
    successor_run_id)
SELECT
    run_id, workflow, workflow_version, status, input_hash, inputs, inputs_ref, state_revision,
    owner, lease_expires_at, fence, resume_count, event_count, result, result_ref, error,
    recovery_record, created_at, updated_at, resume_budget, cancel_requested_at,
    workflow_fingerprint, workflow_manifest, deadline_at, token_budget, cost_budget,
    tokens_spent, cost_spent, step_attempts, waiting_for, step_count, history_soft_limit,
    history_hard_limit, history_warned_at, chain_id, chain_index, parent_run_id,
    successor_run_id
FROM safepoint_runs;

DROP TABLE safepoint_runs;

ALTER TABLE safepoint_runs_next RENAME TO safepoint_runs;

CREATE INDEX safepoint_runs_status ON safepoint_runs (status, updated_at);

CREATE INDEX safepoint_runs_due ON safepoint_runs (wake_at) WHERE status = 'waiting';

CREATE INDEX safepoint_runs_chain ON safepoint_runs (chain_id, chain_index);

CREATE TABLE safepoint_steps_next (
    run_id        TEXT    NOT NULL REFERENCES safepoint_runs (run_id),
    step_id       TEXT    NOT NULL,
    seq           INTEGER NOT NULL,         -- order of first record within the run
    kind          TEXT    NOT NULL
                  CHECK (kind IN ('pure', 'read', 'model', 'decision', 'effect', 'value',
                                'wait')),
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
    observed_at   INTEGER,                  -- read steps: when the observation was made
    operation_id  TEXT,                     -- effect steps
    fence         INTEGER NOT NULL,
    recorded_at   INTEGER NOT NULL,
    tokens        INTEGER,                  -- model steps: the usage they reported
    cost          REAL,
    PRIMARY KEY (run_id, step_id)
) WITHOUT ROWID;

INSERT INTO safepoint_steps_next (
    run_id, step_id, seq, kind, name, input_hash, status, result, result_ref, error,
    next_step_id, attempt, model_id, prompt_hash, observed_at, operation_id, fence, recorded_at,
    tokens, cost)
SELECT
    run_id, step_id, seq, kind, name, input_hash, status, result, result_ref, error,
    next_step_id, attempt, model_id, prompt_hash, observed_at, operation_id, fence, recorded_at,
    tokens, cost
FROM safepoint_steps;

DROP TABLE safepoint_steps;

ALTER TABLE safepoint_steps_next RENAME TO safepoint_steps;

ALTER TABLE safepoint_operations ADD COLUMN key_attempt INTEGER NOT NULL DEFAULT 1;

CREATE TABLE safepoint_messages (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,  -- the order messages were sent in
    run_id       TEXT    NOT NULL REFERENCES safepoint_runs (run_id),
    name         TEXT    NOT NULL,
    message_id   TEXT,               -- the sender's id for it; NULL: none given
    payload      TEXT,
    payload_ref  TEXT,
    sent_by      TEXT,
    sent_at      INTEGER NOT NULL,
    taken_by     TEXT,               -- the wait step that received it; NULL: not yet taken
    taken_at     INTEGER
);

CREATE UNIQUE INDEX safepoint_messages_id ON safepoint_messages (run_id, message_id);

CREATE INDEX safepoint_messages_name ON safepoint_messages (run_id, name, seq);
