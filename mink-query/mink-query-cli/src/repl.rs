//! The prompt: statements end with `;` (they may span lines); backslash commands act at once.

use std::time::Instant;

use mink_query::QueryEngine;
use rustyline::error::ReadlineError;

use crate::{Format, print_batches, run_statement, say};

const HELP: &str = r"\d            list the tables of every database
\dt           the same
\d TABLE      describe a table (database.table, or a table of database default)
\timing       turn the time each statement takes on or off
\q            quit (so does Ctrl-D)
Statements end with `;` and may span lines.";

/// Splits `text` into statements at the semicolons outside quotes (the last may lack one).
pub(crate) fn split_statements(text: &str) -> Vec<String> {
    let mut statements = Vec::new();
    let mut current = String::new();
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, ';') => {
                if !current.trim().is_empty() {
                    statements.push(current.trim().to_string());
                }
                current.clear();
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    if !current.trim().is_empty() {
        statements.push(current.trim().to_string());
    }
    statements
}

/// Whether `text` holds a complete statement: a `;` outside quotes ends it.
fn complete(text: &str) -> bool {
    let mut quote: Option<char> = None;
    let mut ended = false;
    for c in text.chars() {
        match (quote, c) {
            (None, '\'' | '"') => {
                quote = Some(c);
                ended = false;
            }
            (Some(q), c) if c == q => quote = None,
            (None, ';') => ended = true,
            (None, c) if !c.is_whitespace() => ended = false,
            _ => {}
        }
    }
    ended
}

pub(crate) async fn run(engine: &QueryEngine, format: Format) -> anyhow::Result<()> {
    let mut editor = rustyline::DefaultEditor::new()?;
    let history =
        std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".mink_query_history"));
    if let Some(h) = &history {
        let _ = editor.load_history(h);
    }
    say("mink-query: SQL over Mink. \\? for help, \\q to quit.");
    let mut timing = false;
    let mut buffer = String::new();
    loop {
        let prompt = if buffer.is_empty() {
            "mink> "
        } else {
            "   -> "
        };
        let line = match editor.readline(prompt) {
            Ok(l) => l,
            Err(ReadlineError::Interrupted) => {
                buffer.clear();
                continue;
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        };
        let trimmed = line.trim();
        if buffer.is_empty() && trimmed.starts_with('\\') {
            let _ = editor.add_history_entry(trimmed);
            let mut words = trimmed.split_whitespace();
            match (words.next().unwrap_or(""), words.next()) {
                ("\\q", _) => break,
                ("\\?" | "\\h", _) => say(HELP),
                ("\\timing", _) => {
                    timing = !timing;
                    say(if timing {
                        "Timing is on."
                    } else {
                        "Timing is off."
                    });
                }
                ("\\d" | "\\dt", None) => {
                    report(
                        run_statement(
                            engine,
                            "SELECT table_schema AS database, table_name AS table FROM information_schema.tables WHERE table_catalog = 'mink' AND table_schema NOT IN ('information_schema', 'system') ORDER BY 1, 2",
                            format,
                            false,
                            &mut std::io::stdout(),
                        )
                        .await,
                    );
                }
                ("\\d", Some(table)) => report(describe(engine, table, format).await),
                (other, _) => say(&format!("unknown command {other}: \\? lists them")),
            }
            continue;
        }
        if trimmed.is_empty() && buffer.is_empty() {
            continue;
        }
        buffer.push_str(&line);
        buffer.push('\n');
        if !complete(&buffer) {
            continue;
        }
        let text = std::mem::take(&mut buffer);
        let _ = editor.add_history_entry(text.trim());
        for sql in split_statements(&text) {
            let started = Instant::now();
            report(run_statement(engine, &sql, format, false, &mut std::io::stdout()).await);
            if timing {
                say(&format!("Time: {:.3}s", started.elapsed().as_secs_f64()));
            }
        }
    }
    if let Some(h) = &history {
        let _ = editor.save_history(h);
    }
    Ok(())
}

/// The columns of `table` (`database.table`, or a table of database `default`), as planning a
/// read of it finds them: `t$log`, `t$lake` and the system tables too, which the information
/// schema does not list.
async fn describe(engine: &QueryEngine, table: &str, format: Format) -> anyhow::Result<()> {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, RecordBatch, StringArray};
    let (database, name) = table.split_once('.').unwrap_or(("default", table));
    let quoted = |i: &str| format!("\"{}\"", i.replace('"', "\"\""));
    let df = engine
        .sql(&format!(
            "SELECT * FROM {}.{}",
            quoted(database),
            quoted(name)
        ))
        .await?;
    let fields = df.schema().as_arrow().fields().clone();
    let column = |values: Vec<String>| Arc::new(StringArray::from(values)) as ArrayRef;
    let batch = RecordBatch::try_from_iter(vec![
        (
            "column",
            column(fields.iter().map(|f| f.name().clone()).collect()),
        ),
        (
            "type",
            column(fields.iter().map(|f| f.data_type().to_string()).collect()),
        ),
        (
            "nullable",
            column(
                fields
                    .iter()
                    .map(|f| if f.is_nullable() { "YES" } else { "NO" }.to_string())
                    .collect(),
            ),
        ),
    ])?;
    print_batches(&batch.schema(), &[batch], format, &mut std::io::stdout())
}

/// Prints a statement's error; the prompt goes on.
fn report(result: anyhow::Result<()>) {
    if let Err(e) = result {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("error: {}", crate::error_text(&e));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_split_at_semicolons_outside_quotes() {
        assert_eq!(
            split_statements("select 1; select ';' as x;\nselect 2"),
            ["select 1", "select ';' as x", "select 2"]
        );
        assert!(complete("select 1;"));
        assert!(complete("select 1;  \n"));
        assert!(!complete("select ';'"));
        assert!(!complete("select 1; select"));
    }
}
