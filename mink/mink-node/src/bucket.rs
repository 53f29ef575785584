//! Names of tables and buckets as requests give them.

/// One bucket of a table: of one partition when the table is partitioned.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BucketRef {
    pub database: String,
    pub table: String,
    /// The partition's name (values joined by `$`); `None` for an unpartitioned table.
    pub partition: Option<String>,
    pub bucket: u32,
}

impl BucketRef {
    pub fn new(database: &str, table: &str, partition: Option<&str>, bucket: u32) -> Self {
        BucketRef {
            database: database.to_string(),
            table: table.to_string(),
            partition: partition.map(str::to_string),
            bucket,
        }
    }
}

impl std::fmt::Display for BucketRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bucket {}", self.bucket)?;
        if let Some(p) = &self.partition {
            write!(f, " of partition {p:?}")?;
        }
        write!(f, " of {}.{}", self.database, self.table)
    }
}
