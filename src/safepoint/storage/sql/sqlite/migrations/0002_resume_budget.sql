-- safepoint ledger, SQLite dialect, migration 2: the resume budget.
--
-- How many times a run may be taken over (after its worker died or stopped) before it fails
-- loudly with BudgetExhausted instead of being re-claimed forever. NULL: no limit.
ALTER TABLE safepoint_runs ADD COLUMN resume_budget INTEGER;
