-- safepoint ledger, PostgreSQL dialect, migration 7: the clock in PL/pgSQL.
--
-- Migration 5 declared safepoint_now_ms() STABLE for a distributed PostgreSQL. A STABLE SQL
-- function whose body calls a volatile one (clock_timestamp()) is never inlined, so the server
-- ran it as a SQL function on every execution of every statement — parsing and planning its
-- body each time: a tenth of the server's CPU per durable step (perf, docs/benchmarks.md). A
-- PL/pgSQL function keeps its plan for the session and evaluates the expression directly. The
-- value is the same: clock_timestamp() in epoch milliseconds, read once per statement in the
-- MATERIALIZED `clock` CTE. ../schema.sql is what this leaves.

CREATE OR REPLACE FUNCTION safepoint_now_ms() RETURNS BIGINT
    LANGUAGE plpgsql STABLE
    AS $$ BEGIN RETURN (extract(epoch FROM clock_timestamp()) * 1000)::bigint; END $$;
