-- The metadata command log. Same tables and columns as the SQLite migration.
CREATE TABLE meta_log (
    idx     BIGINT PRIMARY KEY,  -- computed as MAX(idx)+1 inside the INSERT, never a sequence
    payload BYTEA  NOT NULL
);

-- One row (id = 1): the whole state at applied_idx.
CREATE TABLE meta_snapshot (
    id          INTEGER PRIMARY KEY,
    applied_idx BIGINT NOT NULL,
    payload     BYTEA  NOT NULL
);

-- One row (id = 1): who runs the coordinator. term rises whenever the holder changes.
CREATE TABLE meta_lease (
    id            INTEGER PRIMARY KEY,
    node_id       BIGINT NOT NULL,
    node_epoch    BIGINT NOT NULL,
    term          BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL
);
INSERT INTO meta_lease (id, node_id, node_epoch, term, expires_at_ms) VALUES (1, 0, 0, 0, 0);

-- One row per node: its last heartbeat (database clock), applied index and supported version.
CREATE TABLE meta_node (
    node_id           BIGINT  PRIMARY KEY,
    node_epoch        BIGINT  NOT NULL,
    heartbeat_ms      BIGINT  NOT NULL,
    applied_idx       BIGINT  NOT NULL,
    supported_version INTEGER NOT NULL
);
