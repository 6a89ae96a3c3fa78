-- safepoint ledger, SQLite dialect, migration 9: the ledger's identity.
--
-- Every ledger gets an id of its own, minted once, here, when its schema is created (or when an
-- older ledger is migrated), and never changed by a later migration. It is part of every effect
-- key minted from now on, so two ledgers — dev and prod, two tenants, a database wiped and
-- created again — never send one key to one owner even when they use the same run ids.
-- KEYED_SINCE is when the id was minted: an operation prepared before it holds a key minted
-- without the id, which stays as it was recorded (a key is never minted again).
CREATE TABLE safepoint_ledger (
    singleton    INTEGER PRIMARY KEY CHECK (singleton = 1),
    ledger_id    TEXT    NOT NULL,
    keyed_since  INTEGER NOT NULL
);
INSERT INTO safepoint_ledger (singleton, ledger_id, keyed_since)
VALUES (1, lower(hex(randomblob(16))),
        CAST(round((julianday('now') - 2440587.5) * 86400000) AS INTEGER));
