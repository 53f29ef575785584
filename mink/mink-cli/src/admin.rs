//! Databases, tables, partitions and the cluster.

use std::collections::BTreeMap;
use std::str::FromStr;

use anyhow::{Context as _, bail};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use clap::Subcommand;
use mink_client::{Client, TableDescription, protocol};

use crate::out;

#[derive(Subcommand, Debug)]
pub(crate) enum DatabaseCommand {
    Create {
        name: String,
        #[arg(long)]
        if_not_exists: bool,
    },
    Drop {
        name: String,
        /// Drop its tables too.
        #[arg(long)]
        cascade: bool,
        #[arg(long)]
        if_exists: bool,
    },
    List,
}

#[derive(Subcommand, Debug)]
pub(crate) enum TableCommand {
    /// Create a log table: `mink table create app.events --column 'id Int64 not null'
    /// --column 'msg Utf8' --bucket-num 4 --bucket-key id`.
    Create {
        /// `database.table` (the database is created if missing).
        table: String,
        /// A column: `name Type` or `name:Type`, optionally followed by `not null`. Types are
        /// Arrow's (`Int64`, `Utf8`, `Float64`, `Boolean`, `Date32`, `Timestamp(Microsecond, None)`,
        /// `List(Int64)`, ...) or the SQL names `bigint`, `int`, `string`, `double`, `boolean`,
        /// `date`, `timestamp`.
        #[arg(long = "column", short = 'c', required = true)]
        columns: Vec<String>,
        /// Number of buckets (`bucket.num`).
        #[arg(long)]
        bucket_num: Option<u32>,
        /// Columns whose hash picks a row's bucket, comma-separated (`bucket.key`).
        #[arg(long)]
        bucket_key: Option<String>,
        /// Partition columns, comma-separated.
        #[arg(long)]
        partition_key: Option<String>,
        /// Primary-key columns, comma-separated: a primary-key table (upserts, deletes,
        /// lookups; see `-o table.merge-engine=...`).
        #[arg(long)]
        primary_key: Option<String>,
        /// Another table option, `key=value` (`table.log.ttl=3d`, ...).
        #[arg(long = "option", short = 'o')]
        options: Vec<String>,
        #[arg(long)]
        comment: Option<String>,
        #[arg(long)]
        if_not_exists: bool,
    },
    Describe {
        table: String,
        /// Print the description as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Change options (`--set k=v`, `--reset k`) or add nullable columns (`--add-column`).
    Alter {
        table: String,
        #[arg(long = "set")]
        set: Vec<String>,
        #[arg(long = "reset")]
        reset: Vec<String>,
        #[arg(long = "add-column")]
        add_columns: Vec<String>,
    },
    Drop {
        table: String,
        #[arg(long)]
        if_exists: bool,
    },
    List {
        database: String,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum PartitionCommand {
    /// Create a partition by its values joined by `$` (writes create them too).
    Create {
        table: String,
        partition: String,
        #[arg(long)]
        if_not_exists: bool,
    },
    Drop {
        table: String,
        partition: String,
        #[arg(long)]
        if_exists: bool,
    },
}

/// `database.table` → both names.
pub(crate) fn split_table(name: &str) -> anyhow::Result<(String, String)> {
    match name.split_once('.') {
        Some((d, t)) if !d.is_empty() && !t.is_empty() => Ok((d.to_string(), t.to_string())),
        _ => bail!("name the table as database.table (got {name:?})"),
    }
}

fn key_value(s: &str) -> anyhow::Result<(String, String)> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .with_context(|| format!("expected key=value, got {s:?}"))
}

/// Parses a column: `name Type [not null]` or `name:Type[ not null]`; a name with spaces in
/// double quotes (`"My Col" Utf8`).
pub(crate) fn parse_column(spec: &str) -> anyhow::Result<Field> {
    let spec = spec.trim();
    let quoted = crate::data::quoted_name(spec)
        .transpose()
        .map_err(|e| anyhow::anyhow!(e))?;
    let (name, rest) = match (&quoted, spec.split_once(':')) {
        (Some((n, r)), _) => (n.as_str(), r.strip_prefix(':').unwrap_or(r)),
        (None, Some((n, r))) if !n.contains(char::is_whitespace) => (n, r),
        _ => spec
            .split_once(char::is_whitespace)
            .with_context(|| format!("a column is `name Type` (got {spec:?})"))?,
    };
    anyhow::ensure!(
        !rest.trim().is_empty(),
        "a column is `name Type` (got {spec:?})"
    );
    let rest = rest.trim();
    let lower = rest.to_ascii_lowercase();
    let (type_text, nullable) = match lower.strip_suffix("not null") {
        Some(t) => (&rest[..t.len()], false),
        None => (rest, true),
    };
    let data_type = parse_type(type_text.trim())?;
    Ok(Field::new(name.trim(), data_type, nullable))
}

fn parse_type(t: &str) -> anyhow::Result<DataType> {
    let alias = match t.to_ascii_lowercase().as_str() {
        "bigint" | "long" | "int64" => Some(DataType::Int64),
        "int" | "integer" | "int32" => Some(DataType::Int32),
        "smallint" | "int16" => Some(DataType::Int16),
        "tinyint" | "int8" => Some(DataType::Int8),
        "string" | "text" | "varchar" | "utf8" => Some(DataType::Utf8),
        "double" | "float64" => Some(DataType::Float64),
        "float" | "real" | "float32" => Some(DataType::Float32),
        "boolean" | "bool" => Some(DataType::Boolean),
        "date" => Some(DataType::Date32),
        "timestamp" => Some(DataType::Timestamp(TimeUnit::Microsecond, None)),
        "timestamptz" | "timestamp_ltz" => Some(DataType::Timestamp(
            TimeUnit::Microsecond,
            Some("UTC".into()),
        )),
        "binary" | "bytes" => Some(DataType::Binary),
        _ => None,
    };
    match alias {
        Some(d) => Ok(d),
        None => DataType::from_str(t).map_err(|e| anyhow::anyhow!("unknown type {t:?} ({e}); use an Arrow type such as Int64, Utf8, Float64, Timestamp(Microsecond, None), List(Int64)")),
    }
}

pub(crate) async fn database(client: &Client, c: DatabaseCommand) -> anyhow::Result<()> {
    match c {
        DatabaseCommand::Create {
            name,
            if_not_exists,
        } => {
            client.create_database(&name, if_not_exists).await?;
            out(&format!("created database {name}\n"))?;
        }
        DatabaseCommand::Drop {
            name,
            cascade,
            if_exists,
        } => {
            client.drop_database(&name, cascade, if_exists).await?;
            out(&format!("dropped database {name}\n"))?;
        }
        DatabaseCommand::List => {
            for d in client.list_databases().await? {
                out(&format!("{d}\n"))?;
            }
        }
    }
    Ok(())
}

pub(crate) async fn table(client: &Client, c: TableCommand) -> anyhow::Result<()> {
    match c {
        TableCommand::Create {
            table,
            columns,
            bucket_num,
            bucket_key,
            partition_key,
            primary_key,
            options,
            comment,
            if_not_exists,
        } => {
            let (database, name) = split_table(&table)?;
            let fields = columns
                .iter()
                .map(|c| parse_column(c))
                .collect::<anyhow::Result<Vec<_>>>()?;
            // An option given twice, or by a flag and by -o, is refused rather than one of
            // them dropped.
            let mut opts: BTreeMap<String, String> = BTreeMap::new();
            let flags = [
                (
                    "bucket.num",
                    bucket_num.map(|n| n.to_string()),
                    "--bucket-num",
                ),
                ("bucket.key", bucket_key, "--bucket-key"),
            ];
            for (k, v) in options
                .iter()
                .map(|o| key_value(o))
                .collect::<anyhow::Result<Vec<_>>>()?
            {
                if let Some((_, _, flag)) = flags.iter().find(|(f, v, _)| *f == k && v.is_some()) {
                    bail!("option {k} is given by {flag} and by -o {k}=...: give it once");
                }
                if opts.insert(k.clone(), v).is_some() {
                    bail!("option {k} is given twice: give it once");
                }
            }
            for (k, v, _) in flags {
                if let Some(v) = v {
                    opts.insert(k.into(), v);
                }
            }
            let partition_keys: Vec<String> = partition_key
                .map(|p| p.split(',').map(|s| s.trim().to_string()).collect())
                .unwrap_or_default();
            client.create_database(&database, true).await?;
            let schema =
                protocol::encode_schema(&Schema::new(fields)).map_err(|e| anyhow::anyhow!(e.0))?;
            let d: TableDescription = client
                .create_table_with(&protocol::CreateTable {
                    database,
                    table: name,
                    schema,
                    options: opts,
                    partition_keys,
                    primary_key: primary_key
                        .map(|p| p.split(',').map(|s| s.trim().to_string()).collect())
                        .unwrap_or_default(),
                    comment: comment.unwrap_or_default(),
                    if_not_exists,
                })
                .await?;
            out(&format!("created table {}.{}\n", d.database, d.table))?;
            out(&describe_text(&d))?;
        }
        TableCommand::Describe { table, json } => {
            let (database, name) = split_table(&table)?;
            let d = client.describe_table(&database, &name).await?;
            if json {
                out(&format!("{}\n", serde_json::to_string_pretty(&d)?))?;
            } else {
                out(&describe_text(&d))?;
            }
        }
        TableCommand::Alter {
            table,
            set,
            reset,
            add_columns,
        } => {
            let (database, name) = split_table(&table)?;
            let schema = if add_columns.is_empty() {
                None
            } else {
                let current = client
                    .describe_table(&database, &name)
                    .await?
                    .arrow_schema()
                    .map_err(|e| anyhow::anyhow!(e.0))?;
                let mut fields: Vec<Field> = current
                    .fields()
                    .iter()
                    .map(|f| f.as_ref().clone())
                    .collect();
                for c in &add_columns {
                    fields.push(parse_column(c)?);
                }
                Some(
                    protocol::encode_schema(&Schema::new(fields))
                        .map_err(|e| anyhow::anyhow!(e.0))?,
                )
            };
            let d = client
                .alter_table(&protocol::AlterTable {
                    database,
                    table: name,
                    set_options: set
                        .iter()
                        .map(|s| key_value(s))
                        .collect::<anyhow::Result<_>>()?,
                    reset_options: reset,
                    schema,
                })
                .await?;
            out(&describe_text(&d))?;
        }
        TableCommand::Drop { table, if_exists } => {
            let (database, name) = split_table(&table)?;
            client.drop_table(&database, &name, if_exists).await?;
            out(&format!("dropped table {database}.{name}\n"))?;
        }
        TableCommand::List { database } => {
            for t in client.list_tables(&database).await? {
                out(&format!("{database}.{t}\n"))?;
            }
        }
    }
    Ok(())
}

/// A table as text: columns, options, buckets.
pub(crate) fn describe_text(d: &TableDescription) -> String {
    let mut out = format!(
        "table {}.{} (id {}, schema version {})\n",
        d.database, d.table, d.table_id, d.schema_version
    );
    out.push_str("columns:\n");
    for c in &d.columns {
        let null = if c.nullable { "" } else { " not null" };
        out.push_str(&format!("  {} {}{null}\n", c.name, c.r#type));
    }
    if !d.primary_key.is_empty() {
        out.push_str(&format!("primary key: {}\n", d.primary_key.join(", ")));
    }
    if !d.partition_keys.is_empty() {
        out.push_str(&format!(
            "partition keys: {}\n",
            d.partition_keys.join(", ")
        ));
    }
    out.push_str(&format!("buckets: {}", d.bucket_count));
    if !d.bucket_key.is_empty() {
        out.push_str(&format!(" by {}", d.bucket_key.join(", ")));
    }
    out.push('\n');
    if !d.options.is_empty() {
        out.push_str("options:\n");
        for (k, v) in &d.options {
            out.push_str(&format!("  {k} = {v}\n"));
        }
    }
    let rows: u64 = d
        .buckets
        .iter()
        .map(|b| b.end_offset - b.start_offset)
        .sum();
    if d.primary_key.is_empty() {
        out.push_str(&format!("rows in the log: {rows}\n"));
    } else {
        // Offsets, not rows: an idempotent write that changed nothing takes one for its marker.
        out.push_str(&format!("changelog offsets: {rows}\n"));
    }
    if let Some(l) = &d.lake {
        match l.snapshot_id {
            Some(id) => out.push_str(&format!(
                "lake: Iceberg snapshot {id}, {} behind the log\n",
                if l.lag_ms == 0 {
                    "nothing".to_string()
                } else {
                    format!("{:.1} s", l.lag_ms as f64 / 1000.0)
                }
            )),
            None => out.push_str("lake: nothing tiered yet\n"),
        }
    }
    for b in &d.buckets {
        let p = b
            .partition
            .as_ref()
            .map(|p| format!("partition {p} "))
            .unwrap_or_default();
        let lake = b
            .tiered_offset
            .map(|t| format!(", in the lake below {t}"))
            .unwrap_or_default();
        let leader = if b.leader_node_id == 0 {
            "no leader yet (`mink cluster status` says why)".to_string()
        } else {
            format!(
                "leader node {} ({}) at epoch {}",
                b.leader_node_id, b.leader_address, b.leader_epoch
            )
        };
        out.push_str(&format!(
            "  {p}bucket {}: offsets {}..{}, {leader}{lake}\n",
            b.bucket, b.start_offset, b.end_offset,
        ));
    }
    out
}

pub(crate) async fn partition(client: &Client, c: PartitionCommand) -> anyhow::Result<()> {
    match c {
        PartitionCommand::Create {
            table,
            partition,
            if_not_exists,
        } => {
            let (database, name) = split_table(&table)?;
            let p = client
                .create_partition(&database, &name, &partition, if_not_exists)
                .await?;
            out(&format!(
                "created partition {} (id {}) of {database}.{name}\n",
                p.name, p.partition_id
            ))?;
        }
        PartitionCommand::Drop {
            table,
            partition,
            if_exists,
        } => {
            let (database, name) = split_table(&table)?;
            client
                .drop_partition(&database, &name, &partition, if_exists)
                .await?;
            out(&format!(
                "dropped partition {partition} of {database}.{name}\n"
            ))?;
        }
    }
    Ok(())
}

#[derive(Subcommand, Debug)]
pub(crate) enum ClusterCommand {
    /// Nodes (heartbeats, buckets led, drained), the lease holder and its coordinator epoch
    /// (the default).
    Status,
    /// Even out the buckets led per node, and each table's over the nodes (the coordinator
    /// moves them).
    Rebalance {
        /// Only print the moves it would make.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum NodeCommand {
    /// Move every bucket off a node and give it no new ones (before taking it down).
    Drain { node_id: u64 },
    /// Let a drained node take buckets again (a rebalance gives it its share).
    Undrain { node_id: u64 },
    /// Exit 0 when the node at --server serves (for readiness probes): answered from its view
    /// of the metadata, so it passes through an outage of the metadata database, while reads
    /// go on; a node that cannot serve any more has stopped.
    Ready,
}

pub(crate) async fn cluster(client: &Client, c: Option<ClusterCommand>) -> anyhow::Result<()> {
    match c.unwrap_or(ClusterCommand::Status) {
        ClusterCommand::Status => cluster_status(client).await,
        ClusterCommand::Rebalance { dry_run } => {
            let moves = client.rebalance(dry_run).await?;
            let verb = if dry_run { "would move" } else { "moved" };
            out(&format!("{verb} {}\n", buckets(moves.len() as u64)))?;
            for m in moves {
                out(&format!("  {m}\n"))?;
            }
            Ok(())
        }
    }
}

pub(crate) async fn node(client: &Client, c: NodeCommand) -> anyhow::Result<()> {
    match c {
        NodeCommand::Drain { node_id } => {
            let cluster = client.describe_cluster().await?;
            let node = cluster.nodes.iter().find(|n| n.node_id == node_id);
            if let Some(n) = node.filter(|n| n.drained) {
                out(&format!(
                    "node {node_id} is drained already: it gets no buckets, and leads {}\n",
                    buckets(n.buckets)
                ))?;
                return Ok(());
            }
            client.drain_node(node_id, false).await?;
            let message = match node.map(|n| n.buckets) {
                Some(0) => {
                    format!("node {node_id} is drained: it leads no buckets and gets none\n")
                }
                _ => format!(
                    "node {node_id} is drained: the coordinator moves its buckets to the other nodes (watch with `mink cluster status`)\n"
                ),
            };
            out(&message)?;
        }
        NodeCommand::Undrain { node_id } => {
            let cluster = client.describe_cluster().await?;
            if let Some(n) = cluster.nodes.iter().find(|n| n.node_id == node_id)
                && !n.drained
            {
                out(&format!(
                    "node {node_id} is not drained: it takes buckets already\n"
                ))?;
                return Ok(());
            }
            client.drain_node(node_id, true).await?;
            out(&format!(
                "node {node_id} takes buckets again (`mink cluster rebalance` gives it its share)\n"
            ))?;
        }
        NodeCommand::Ready => {
            let applied = client.ping().await?;
            out(&format!(
                "the node at {} serves (metadata applied up to index {applied})\n",
                client.address()
            ))?;
        }
    }
    Ok(())
}

async fn cluster_status(client: &Client) -> anyhow::Result<()> {
    out(&status_text(&client.describe_cluster().await?))?;
    Ok(())
}

/// `n buckets`, or `1 bucket`.
fn buckets(n: u64) -> String {
    if n == 1 {
        "1 bucket".to_string()
    } else {
        format!("{n} buckets")
    }
}

/// What `mink cluster status` prints.
fn status_text(c: &protocol::ClusterDescription) -> String {
    let coordinator = match (c.coordinator_node_id, c.coordinator_epoch) {
        (Some(n), Some(e)) => format!("node {n} (coordinator epoch {e})"),
        (Some(n), None) => format!("node {n}"),
        _ => "none".to_string(),
    };
    let mut text = format!(
        "answered by node {}; metadata applied up to index {}; lease holder: {coordinator}\n",
        c.node_id, c.applied_index,
    );
    for n in &c.nodes {
        let state = if n.live { "live" } else { "down" };
        let heartbeat = n
            .heartbeat_age_ms
            .filter(|a| *a < 86_400_000)
            .map(|a| format!(", heartbeat {:.1} s ago", a as f64 / 1000.0))
            .unwrap_or_default();
        // Nodes heartbeat every quarter TTL: two missed is a node that may be gone, whose
        // buckets wait for it (writes to them stall) until its heartbeat is a TTL old.
        let late = match (n.live, n.heartbeat_age_ms, c.lease_ttl_ms) {
            (true, Some(age), Some(ttl)) if u64::try_from(age).is_ok_and(|a| 2 * a > ttl) => {
                format!(
                    " (late: down, and its buckets failed over, once {:.1} s old)",
                    ttl as f64 / 1000.0
                )
            }
            _ => String::new(),
        };
        let drained = if n.drained { ", drained" } else { "" };
        let listeners: String = n
            .listeners
            .iter()
            .filter(|(k, _)| k.as_str() != "flight")
            .map(|(k, v)| format!(", {k} at {v}"))
            .collect();
        text.push_str(&format!(
            "  node {} (epoch {}) at {}: {state}{heartbeat}{late}, leads {}{drained}{listeners}\n",
            n.node_id,
            n.node_epoch,
            n.address,
            buckets(n.buckets)
        ));
    }
    if c.buckets_without_live_leader > 0 {
        let why = if c.nodes.iter().any(|n| n.live && !n.drained) {
            "failover pending, or a new table"
        } else if c.nodes.iter().any(|n| n.live) {
            "every live node is drained: `mink node undrain <id>` lets one lead them"
        } else {
            "no node is live"
        };
        let verb = if c.buckets_without_live_leader == 1 {
            "has"
        } else {
            "have"
        };
        text.push_str(&format!(
            "{} {verb} no live leader ({why})\n",
            buckets(c.buckets_without_live_leader)
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_parse_with_plain_and_quoted_names() {
        let f = parse_column("id Int64 not null").unwrap();
        assert_eq!((f.name().as_str(), f.is_nullable()), ("id", false));
        assert_eq!(parse_column("n:Int32").unwrap().name(), "n");
        let f = parse_column("\"My Col\" Utf8").unwrap();
        assert_eq!(
            (f.name().as_str(), f.data_type()),
            ("My Col", &DataType::Utf8)
        );
        assert_eq!(parse_column("\"a:b\":Int64").unwrap().name(), "a:b");
        assert!(parse_column("\"My Col\"").is_err());
        assert!(parse_column("\"My Col Utf8").is_err());
    }

    fn node(node_id: u64, live: bool, drained: bool, buckets: u64) -> protocol::NodeDescription {
        protocol::NodeDescription {
            node_id,
            node_epoch: 1,
            address: format!("10.0.0.{node_id}:7171"),
            live,
            heartbeat_age_ms: None,
            buckets,
            drained,
            listeners: BTreeMap::new(),
        }
    }

    fn cluster(
        nodes: Vec<protocol::NodeDescription>,
        orphans: u64,
    ) -> protocol::ClusterDescription {
        protocol::ClusterDescription {
            node_id: 1,
            applied_index: 7,
            coordinator_node_id: Some(1),
            coordinator_epoch: Some(2),
            nodes,
            buckets_without_live_leader: orphans,
            lease_ttl_ms: Some(30_000),
        }
    }

    #[test]
    fn a_node_whose_heartbeat_is_late_says_so() {
        let mut late = node(2, true, false, 4);
        late.heartbeat_age_ms = Some(16_000);
        let mut fresh = node(1, true, false, 4);
        fresh.heartbeat_age_ms = Some(7_000);
        let text = status_text(&cluster(vec![fresh, late], 0));
        assert!(
            text.contains(
                "node 1 (epoch 1) at 10.0.0.1:7171: live, heartbeat 7.0 s ago, leads 4 buckets\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("node 2 (epoch 1) at 10.0.0.2:7171: live, heartbeat 16.0 s ago (late: down, and its buckets failed over, once 30.0 s old), leads 4 buckets\n"),
            "{text}"
        );
    }

    #[test]
    fn status_counts_in_words_and_says_why_buckets_have_no_leader() {
        let text = status_text(&cluster(
            vec![node(1, true, false, 1), node(2, false, false, 2)],
            2,
        ));
        assert!(
            text.contains("node 1 (epoch 1) at 10.0.0.1:7171: live, leads 1 bucket\n"),
            "{text}"
        );
        assert!(text.contains("down, leads 2 buckets\n"), "{text}");
        assert!(
            text.ends_with("2 buckets have no live leader (failover pending, or a new table)\n"),
            "{text}"
        );
        let text = status_text(&cluster(
            vec![node(1, true, true, 0), node(2, false, false, 0)],
            1,
        ));
        assert!(text.ends_with("1 bucket has no live leader (every live node is drained: `mink node undrain <id>` lets one lead them)\n"), "{text}");
    }
}
