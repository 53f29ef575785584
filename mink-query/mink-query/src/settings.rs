//! Per-session settings a statement can change: `SET mink.freshness = 'latest' | 'lake' |
//! '30s'` (over Flight SQL, the `mink-freshness` header of a request).

use std::time::Duration;

use datafusion::error::{DataFusionError, Result};

/// The setting's name in `SET`.
pub const FRESHNESS: &str = "mink.freshness";
/// The Flight SQL request header carrying it.
pub const FRESHNESS_HEADER: &str = "mink-freshness";

/// How fresh the rows of a lake table a statement reads must be.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Freshness {
    /// Every row written up to the cut: the lake snapshot and the log tail (the default).
    #[default]
    Latest,
    /// The lake snapshot only, however old: no log tail is read.
    Lake,
    /// The lake snapshot only when its lag is at most this long; else as `Latest`.
    Within(Duration),
}

impl Freshness {
    /// `latest`, `lake`, or a duration (`30s`, `5min`, `1h`).
    pub fn parse(value: &str) -> Result<Freshness> {
        let v = value.trim().trim_matches('\'').to_ascii_lowercase();
        match v.as_str() {
            "latest" => Ok(Freshness::Latest),
            "lake" => Ok(Freshness::Lake),
            _ => mink_log::options::parse_ttl(&v)
                .flatten()
                .map(Freshness::Within)
                .ok_or_else(|| {
                    DataFusionError::Plan(format!(
                        "{FRESHNESS} = {value:?}: expected 'latest', 'lake' or a duration such as '30s', '5min', '1h'"
                    ))
                }),
        }
    }

    /// Whether a statement reads only the lake of a table whose lake is `lag_ms` behind.
    pub fn lake_only(self, lag_ms: Option<u64>) -> bool {
        match self {
            Freshness::Latest => false,
            Freshness::Lake => true,
            Freshness::Within(d) => lag_ms.is_some_and(|lag| u128::from(lag) <= d.as_millis()),
        }
    }
}

/// Whether `sql` is a `SET mink.freshness` statement (whatever its value).
pub fn is_set_freshness(sql: &str) -> bool {
    datafusion::sql::parser::DFParser::parse_sql(sql)
        .is_ok_and(|statements| statements.iter().any(|s| freshness_values(s).is_some()))
}

/// The values of `statement` if it is `SET mink.freshness = ...`.
fn freshness_values(
    statement: &datafusion::sql::parser::Statement,
) -> Option<&[datafusion::sql::sqlparser::ast::Expr]> {
    use datafusion::sql::parser::Statement as S;
    use datafusion::sql::sqlparser::ast::{Set, Statement};
    let S::Statement(s) = statement else {
        return None;
    };
    match s.as_ref() {
        Statement::Set(Set::SingleAssignment {
            variable, values, ..
        }) if variable.to_string().eq_ignore_ascii_case(FRESHNESS) => Some(values),
        _ => None,
    }
}

/// The freshness a `SET mink.freshness = ...` statement sets; `None` for any other
/// statement.
pub fn set_statement(statement: &datafusion::sql::parser::Statement) -> Result<Option<Freshness>> {
    use datafusion::sql::sqlparser::ast::{Expr, Set, Statement, Value};
    // DataFusion answers SET TIME ZONE with the parser's debug form of the statement.
    if let datafusion::sql::parser::Statement::Statement(s) = statement
        && let Statement::Set(Set::SetTimeZone { .. }) = s.as_ref()
    {
        return Err(DataFusionError::NotImplemented(
            "SET TIME ZONE is not supported: sessions are in UTC (for another zone's wall time, \
             write ts AT TIME ZONE 'Europe/Berlin' or cast to a zoned TIMESTAMP)"
                .into(),
        ));
    }
    let Some(values) = freshness_values(statement) else {
        return Ok(None);
    };
    let value = match values {
        [Expr::Value(v)] => match &v.value {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
            other => other.to_string(),
        },
        [Expr::Identifier(i)] => i.value.clone(),
        _ => {
            return Err(DataFusionError::Plan(format!(
                "SET {FRESHNESS} takes one value: 'latest', 'lake' or a duration"
            )));
        }
    };
    Freshness::parse(&value).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freshness_values() {
        assert_eq!(Freshness::parse("latest").unwrap(), Freshness::Latest);
        assert_eq!(Freshness::parse("'LAKE'").unwrap(), Freshness::Lake);
        assert_eq!(
            Freshness::parse("30s").unwrap(),
            Freshness::Within(Duration::from_secs(30))
        );
        assert!(Freshness::parse("soon").is_err());
        assert!(Freshness::Within(Duration::from_secs(30)).lake_only(Some(30_000)));
        assert!(!Freshness::Within(Duration::from_secs(30)).lake_only(Some(30_001)));
        assert!(!Freshness::Within(Duration::from_secs(30)).lake_only(None));
    }
}
