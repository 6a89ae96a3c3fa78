-- safepoint ledger, SQLite dialect, migration 8: approvals can be revoked.
--
-- A person may withdraw an approval before the effect it authorizes is dispatched. The
-- approval's row stays (it is evidence of what was authorized, and by whom); it is marked
-- REVOKED: when (revoked_at, the store's clock), by whom (revoked_by) and why (revoke_reason).
-- A revoked approval authorizes nothing. Revocation is refused once the operation was
-- dispatched: its outcome is then what the run reconciles. All three NULL: not revoked.
ALTER TABLE safepoint_approvals ADD COLUMN revoked_at INTEGER;
ALTER TABLE safepoint_approvals ADD COLUMN revoked_by TEXT;
ALTER TABLE safepoint_approvals ADD COLUMN revoke_reason TEXT;
