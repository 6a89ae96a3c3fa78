-- safepoint ledger, PostgreSQL dialect, migration 3: cancellation.
--
-- When someone asked a running run to stop. From then on its worker may settle what is in
-- flight (record outcomes, reconcile) but starts nothing new: no new step, no new dispatch.
ALTER TABLE safepoint_runs ADD COLUMN cancel_requested_at BIGINT;
