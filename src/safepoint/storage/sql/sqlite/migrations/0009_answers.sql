-- safepoint ledger, SQLite dialect, migration 9: answers to one wait.
--
-- A message is a mailbox message (for_wait NULL: it queues by name, and the next wait of the
-- name takes it, oldest first) or an ANSWER addressed to one wait step (for_wait: its step id;
-- safepoint.answer). A wait takes the answer addressed to it before anything queued by name,
-- and a wait takes one answer: the store refuses a second answer to a wait, and this index
-- keeps one per wait whatever a writer does. ../schema.sql is what this leaves.

ALTER TABLE safepoint_messages ADD COLUMN for_wait TEXT;

CREATE UNIQUE INDEX safepoint_messages_answer ON safepoint_messages (run_id, for_wait)
    WHERE for_wait IS NOT NULL;
