-- safepoint ledger, SQLite dialect, migration 4: workflow fingerprints.
--
-- What the code that started a run was built from, beyond its version: a digest over its tool
-- schemas, model ids and prompt hashes (the fingerprint), and those parts as digests (the
-- manifest, JSON) so that a refusal can say which part changed. NULL: the run predates
-- fingerprints, and only its version is compared.
ALTER TABLE safepoint_runs ADD COLUMN workflow_fingerprint TEXT;
ALTER TABLE safepoint_runs ADD COLUMN workflow_manifest TEXT;
