-- safepoint ledger, PostgreSQL dialect, migration 8: run families.
--
-- A run, its forks and its continue-as-new successors are one family (DESIGN, "Families of
-- runs"), and an operation is applied at most once across it. Each run names its family (the
-- run the family grew from) and its generation (its place in a chain, a fork standing where its
-- source stands); each operation names what it is within the family (its family key: an
-- operation id the caller chose, or a step's own id at its generation, see
-- safepoint/_rules/family.py); and safepoint_family_claims holds, per family key, the one member
-- whose operation may be sent — taken in the same transaction as the dispatch.
--
-- What ledgers already hold is brought in: families and generations from the chains and forks
-- (a run whose parent or source was pruned starts a family of its own), family keys from the
-- operations (a step's own id where the operation id is the step's), and a claim for every
-- operation that may have happened and every committed transaction step — the first recorded
-- holding it. ../schema.sql is what this leaves.


ALTER TABLE safepoint_runs ADD COLUMN family_id TEXT;
ALTER TABLE safepoint_runs ADD COLUMN family_generation INTEGER NOT NULL DEFAULT 0;
ALTER TABLE safepoint_operations ADD COLUMN family_key TEXT;

CREATE TABLE safepoint_family_claims (
    family_id     TEXT    NOT NULL,
    claim_key     TEXT    NOT NULL,
    run_id        TEXT    NOT NULL,
    operation_id  TEXT    NOT NULL,
    sent          BOOLEAN NOT NULL,
    PRIMARY KEY (family_id, claim_key)
);

CREATE INDEX safepoint_family_claims_holder ON safepoint_family_claims (run_id, operation_id);

-- a family's runs: whether any is left (a prune keeps the family's claims while one is)
CREATE INDEX safepoint_runs_family ON safepoint_runs (family_id);

WITH RECURSIVE member (run_id, family_id, generation) AS (
    SELECT r.run_id, r.run_id, r.chain_index FROM safepoint_runs AS r
    WHERE NOT EXISTS (
        SELECT 1 FROM safepoint_runs AS up
        WHERE up.run_id = COALESCE(r.parent_run_id, r.forked_from::jsonb ->> 'run_id'))
    UNION ALL
    SELECT r.run_id, m.family_id, m.generation + (r.parent_run_id IS NOT NULL)::int
    FROM safepoint_runs AS r
    JOIN member AS m ON m.run_id = COALESCE(r.parent_run_id, r.forked_from::jsonb ->> 'run_id')
)
UPDATE safepoint_runs AS r
SET family_id = member.family_id, family_generation = member.generation
FROM member WHERE member.run_id = r.run_id;

UPDATE safepoint_runs SET family_id = run_id WHERE family_id IS NULL;

UPDATE safepoint_operations AS o
SET family_key = CASE WHEN o.operation_id = o.step_id
                      THEN 'step ' || r.family_generation || ' ' || o.operation_id
                      ELSE 'op ' || o.operation_id END
FROM safepoint_runs AS r WHERE r.run_id = o.run_id;

INSERT INTO safepoint_family_claims (family_id, claim_key, run_id, operation_id, sent)
SELECT DISTINCT ON (r.family_id, o.family_key) r.family_id, o.family_key, o.run_id, o.operation_id, true
FROM safepoint_operations AS o JOIN safepoint_runs AS r ON r.run_id = o.run_id
WHERE o.state <> 'prepared'
ORDER BY r.family_id, o.family_key, o.prepared_at, r.created_at;

INSERT INTO safepoint_family_claims (family_id, claim_key, run_id, operation_id, sent)
SELECT DISTINCT ON (r.family_id, s.step_id, r.family_generation)
       r.family_id, 'transaction ' || r.family_generation || ' ' || s.step_id, s.run_id, s.step_id, true
FROM safepoint_steps AS s JOIN safepoint_runs AS r ON r.run_id = s.run_id
WHERE s.kind = 'transaction' AND s.status = 'completed'
ORDER BY r.family_id, s.step_id, r.family_generation, s.recorded_at, r.created_at
ON CONFLICT (family_id, claim_key) DO NOTHING;
