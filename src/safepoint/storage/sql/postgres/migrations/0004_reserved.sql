-- safepoint ledger, PostgreSQL dialect, migration 4: kept free for a change made beside
-- migration 5 (the numbers must run 1..n); it changes nothing.

SELECT 1;
