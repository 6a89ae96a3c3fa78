-- safepoint ledger, SQLite dialect, migration 6: approvals.
--
-- An effect may need a person's approval before it is dispatched. Its operation says so
-- (approval_required) and remembers the digest of its target's state as last read at the gate
-- (target_digest). An APPROVAL is bound to the operation's payload digest and that target
-- digest, may expire, and authorizes a dispatch only while all three still hold; the approval
-- that authorized the latest dispatch is kept on the operation (approval_id). A run whose
-- effect has no valid approval WAITS: status 'waiting', released, not claimable by workers,
-- with what it waits for in waiting_for (JSON).
--
-- SQLite cannot alter a CHECK constraint, and rebuilding safepoint_runs would have to rebuild
-- every table that references it. Widening the list of allowed statuses changes nothing
-- stored, so the table's definition is edited in place (the procedure SQLite documents for
-- changes that leave the stored format as it is); RESET makes this connection read the new
-- definition, and the CREATE TABLE below moves the schema cookie, so every other connection
-- reads it too.
PRAGMA writable_schema = ON;
UPDATE sqlite_master
SET sql = replace(sql, '''blocked'', ''cancelled'')', '''blocked'', ''cancelled'', ''waiting'')')
WHERE type = 'table' AND name = 'safepoint_runs';
PRAGMA writable_schema = RESET;

ALTER TABLE safepoint_runs ADD COLUMN waiting_for TEXT;

ALTER TABLE safepoint_operations ADD COLUMN approval_required INTEGER NOT NULL DEFAULT 0;
ALTER TABLE safepoint_operations ADD COLUMN target_digest TEXT;
ALTER TABLE safepoint_operations ADD COLUMN approval_id TEXT;

CREATE TABLE safepoint_approvals (
    approval_id     TEXT    PRIMARY KEY,
    run_id          TEXT    NOT NULL,
    operation_id    TEXT    NOT NULL,
    step_id         TEXT    NOT NULL,
    payload_digest  TEXT    NOT NULL,   -- the payload approved ('sha256:<hex>')
    target_digest   TEXT,               -- the target's state approved; NULL: no target state
    approved_by     TEXT    NOT NULL,
    evidence        TEXT,
    approved_at     INTEGER NOT NULL,
    expires_at      INTEGER,            -- NULL: does not expire
    FOREIGN KEY (run_id, operation_id) REFERENCES safepoint_operations (run_id, operation_id)
);

CREATE INDEX safepoint_approvals_operation ON safepoint_approvals (run_id, operation_id);
