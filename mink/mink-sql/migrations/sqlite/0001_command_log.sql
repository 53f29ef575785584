-- The metadata command log. Same tables and columns as the Postgres migration.
CREATE TABLE meta_log (
    idx     INTEGER PRIMARY KEY NOT NULL,  -- computed as MAX(idx)+1 inside the INSERT, never a sequence
    payload BLOB    NOT NULL
);

-- One row (id = 1): the whole state at applied_idx.
CREATE TABLE meta_snapshot (
    id          INTEGER PRIMARY KEY NOT NULL,
    applied_idx INTEGER NOT NULL,
    payload     BLOB    NOT NULL
);

-- One row (id = 1): who runs the coordinator. term rises whenever the holder changes.
CREATE TABLE meta_lease (
    id            INTEGER PRIMARY KEY NOT NULL,
    node_id       INTEGER NOT NULL,
    node_epoch    INTEGER NOT NULL,
    term          INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL
);
INSERT INTO meta_lease (id, node_id, node_epoch, term, expires_at_ms) VALUES (1, 0, 0, 0, 0);

-- One row per node: its last heartbeat (database clock), applied index and supported version.
CREATE TABLE meta_node (
    node_id           INTEGER PRIMARY KEY NOT NULL,
    node_epoch        INTEGER NOT NULL,
    heartbeat_ms      INTEGER NOT NULL,
    applied_idx       INTEGER NOT NULL,
    supported_version INTEGER NOT NULL
);
