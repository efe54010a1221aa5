-- Idempotency keys: each attempt carries the key its gateway gave it when it was queued, so a
-- batch retried after a commit whose acknowledgement was lost is not written twice.
ALTER TABLE ledger_attempts ADD COLUMN write_id VARCHAR(64);

CREATE UNIQUE INDEX ledger_attempts_by_write_id ON ledger_attempts (write_id);
