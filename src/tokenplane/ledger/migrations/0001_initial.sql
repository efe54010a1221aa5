-- The ledger's tables (the columns of tokenplane.ledger.schema, in PostgreSQL's types).
CREATE TABLE ledger_workflows (
    tenant VARCHAR(128) NOT NULL,
    workflow_id VARCHAR(300) NOT NULL,
    outcome VARCHAR(16) NOT NULL,
    first_t DOUBLE PRECISION NOT NULL,
    last_t DOUBLE PRECISION NOT NULL,
    model VARCHAR(256) NOT NULL,
    reason VARCHAR(256) NOT NULL,
    total_steps INTEGER,
    max_step INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    failed_attempts INTEGER NOT NULL,
    cost_usd DOUBLE PRECISION NOT NULL,
    failed_attempt_cost_usd DOUBLE PRECISION NOT NULL,
    tokens_in BIGINT NOT NULL,
    tokens_out BIGINT NOT NULL,
    settled_t DOUBLE PRECISION,
    PRIMARY KEY (tenant, workflow_id)
);

CREATE INDEX ledger_workflows_by_state ON ledger_workflows (outcome, last_t);

CREATE TABLE ledger_attempts (
    tenant VARCHAR(128) NOT NULL,
    workflow_id VARCHAR(300) NOT NULL,
    request_id VARCHAR(256) NOT NULL,
    instance_id VARCHAR(256) NOT NULL,
    model VARCHAR(256) NOT NULL,
    step INTEGER,
    total_steps INTEGER,
    tokens_in BIGINT NOT NULL,
    tokens_out BIGINT NOT NULL,
    cost_usd DOUBLE PRECISION NOT NULL,
    ok SMALLINT NOT NULL,
    terminal SMALLINT NOT NULL,
    reason VARCHAR(256) NOT NULL,
    t DOUBLE PRECISION NOT NULL
);

CREATE INDEX ledger_attempts_by_workflow ON ledger_attempts (tenant, workflow_id, t);
CREATE INDEX ledger_attempts_by_request ON ledger_attempts (tenant, request_id);

CREATE TABLE ledger_totals (
    grp_kind VARCHAR(8) NOT NULL,
    grp VARCHAR(256) NOT NULL,
    outcome VARCHAR(16) NOT NULL,
    tasks BIGINT NOT NULL,
    cost_usd DOUBLE PRECISION NOT NULL,
    failed_attempt_cost_usd DOUBLE PRECISION NOT NULL,
    tokens BIGINT NOT NULL,
    attempts BIGINT NOT NULL,
    failed_attempts BIGINT NOT NULL,
    PRIMARY KEY (grp_kind, grp, outcome)
);
