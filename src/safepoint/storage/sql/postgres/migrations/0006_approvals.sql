-- safepoint ledger, PostgreSQL dialect, migration 6: approvals.
--
-- An effect may need a person's approval before it is dispatched. Its operation says so
-- (approval_required) and remembers the digest of its target's state as last read at the gate
-- (target_digest). An APPROVAL is bound to the operation's payload digest and that target
-- digest, may expire (database clock), and authorizes a dispatch only while all three still
-- hold; the approval that authorized the latest dispatch is kept on the operation
-- (approval_id). A run whose effect has no valid approval WAITS: status 'waiting', released,
-- not claimable by workers, with what it waits for in waiting_for (JSON text).
ALTER TABLE safepoint_runs DROP CONSTRAINT safepoint_runs_status_check;
ALTER TABLE safepoint_runs ADD CONSTRAINT safepoint_runs_status_check
    CHECK (status IN ('pending', 'running', 'completed', 'failed', 'blocked', 'cancelled',
                      'waiting'));

ALTER TABLE safepoint_runs ADD COLUMN waiting_for TEXT;

ALTER TABLE safepoint_operations
    ADD COLUMN approval_required BOOLEAN NOT NULL DEFAULT false,
    ADD COLUMN target_digest TEXT,
    ADD COLUMN approval_id TEXT;

CREATE TABLE safepoint_approvals (
    approval_id     TEXT    PRIMARY KEY,
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
    FOREIGN KEY (run_id, operation_id) REFERENCES safepoint_operations (run_id, operation_id)
);

CREATE INDEX safepoint_approvals_operation ON safepoint_approvals (run_id, operation_id);
