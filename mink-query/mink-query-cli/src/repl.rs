//! The prompt: statements end with `;` (they may span lines); backslash commands act at once.

use std::time::Instant;

use mink_query::QueryEngine;
use mink_query::ddl::table_names;
use rustyline::error::ReadlineError;

use crate::{Format, print_batches, run_statement, say};

const HELP: &str = r"\d            list the tables of every database
\dt PATTERN   the tables matching PATTERN (`*` any characters, `?` one; events, app.*)
\d TABLE      describe a table (database.table, or a table of database default)
\timing       turn the time each statement takes on or off
\q            quit (so does Ctrl-D)
Statements end with `;` and may span lines; Ctrl-C cancels the one running.";

/// `text` cut at its semicolons outside quotes and comments: each piece's byte range (the last
/// runs to the end, with no `;`), whether it holds anything but whitespace and comments, and
/// whether the text ends inside a quote or a block comment.
fn pieces(text: &str) -> (Vec<(std::ops::Range<usize>, bool)>, bool) {
    #[derive(Clone, Copy, PartialEq)]
    enum In {
        Code,
        /// A quoted string or identifier, closed by this character (doubled, it is one);
        /// `true`: an `E'...'` string, where a backslash escapes the next character.
        Quote(char, bool),
        LineComment,
        /// Block comments nest, as in PostgreSQL.
        BlockComment(u32),
    }
    let mut at = In::Code;
    let mut pieces = Vec::new();
    let (mut from, mut code) = (0, false);
    let mut chars = text.char_indices().peekable();
    let mut previous = ' ';
    while let Some((i, c)) = chars.next() {
        let next = chars.peek().map(|&(_, n)| n);
        match at {
            In::Code => match c {
                ';' => {
                    pieces.push((from..i, code));
                    (from, code) = (i + 1, false);
                }
                '-' if next == Some('-') => {
                    chars.next();
                    at = In::LineComment;
                }
                '/' if next == Some('*') => {
                    chars.next();
                    at = In::BlockComment(1);
                }
                c if !c.is_whitespace() => {
                    code = true;
                    if c == '\'' || c == '"' {
                        at = In::Quote(c, c == '\'' && matches!(previous, 'e' | 'E'));
                    }
                }
                _ => {}
            },
            In::Quote(q, escapes) => {
                if escapes && c == '\\' {
                    chars.next();
                } else if c == q {
                    if next == Some(q) {
                        chars.next();
                    } else {
                        at = In::Code;
                    }
                }
            }
            In::LineComment => {
                if c == '\n' {
                    at = In::Code;
                }
            }
            In::BlockComment(depth) => {
                if c == '*' && next == Some('/') {
                    chars.next();
                    at = if depth == 1 {
                        In::Code
                    } else {
                        In::BlockComment(depth - 1)
                    };
                } else if c == '/' && next == Some('*') {
                    chars.next();
                    at = In::BlockComment(depth + 1);
                }
            }
        }
        previous = c;
    }
    pieces.push((from..text.len(), code));
    (pieces, matches!(at, In::Quote(..) | In::BlockComment(_)))
}

/// Splits `text` into statements at the semicolons outside quotes and comments (the last may
/// lack one). Pieces holding only comments are dropped.
pub(crate) fn split_statements(text: &str) -> Vec<String> {
    let (pieces, open) = pieces(text);
    let last = pieces.len() - 1;
    pieces
        .into_iter()
        .enumerate()
        .filter(|(i, (_, code))| *code || (open && *i == last))
        .map(|(_, (range, _))| text[range].trim().to_string())
        .collect()
}

/// Splits a script (`-f`) as the prompt reads it: a line starting with `\\` between
/// statements is a command of its own (`\\d app.events`), and the rest splits into statements
/// at semicolons ([`split_statements`]). Without this a command ran on into the statement
/// after it, which was lost.
pub(crate) fn split_script(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let (pieces, open) = pieces(&pending);
        let between = !open && !pieces.last().is_some_and(|(_, code)| *code);
        if between && line.trim_start().starts_with('\\') {
            out.extend(split_statements(&pending));
            out.push(line.trim().to_string());
            pending.clear();
            continue;
        }
        pending.push_str(line);
        pending.push('\n');
    }
    out.extend(split_statements(&pending));
    out
}

/// Whether `text` holds a complete statement: it ends with a `;` outside quotes and comments,
/// followed by nothing but whitespace and comments.
fn complete(text: &str) -> bool {
    let (pieces, open) = pieces(text);
    !open && pieces.len() > 1 && !pieces.last().is_some_and(|(_, code)| *code)
}

pub(crate) async fn run(
    engine: &QueryEngine,
    format: Format,
    max_rows: usize,
) -> anyhow::Result<()> {
    let mut editor = rustyline::DefaultEditor::new()?;
    let history =
        std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".mink_query_history"));
    if let Some(h) = &history {
        let _ = editor.load_history(h);
    }
    // At a terminal only: statements piped in write their rows alone, as psql does.
    if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        say("mink-query: SQL over Mink. \\? for help, \\q to quit.");
    }
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
                (command, argument) => {
                    let mut out = std::io::stdout();
                    match catalog_command(engine, command, argument, format, &mut out).await {
                        Some(done) => report(done),
                        None => say(&format!("unknown command {command}: \\? lists them")),
                    }
                }
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
            // Ctrl-C while a statement runs cancels it (its stream is dropped, and with it the
            // reads at the nodes) and the prompt goes on, as psql's does; it used to end the
            // process, and the session with it.
            let mut out = std::io::stdout();
            tokio::select! {
                ran = run_statement(engine, &sql, format, max_rows, &mut out) => report(ran),
                _ = tokio::signal::ctrl_c() => {
                    say("cancelled");
                    break;
                }
            }
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

/// Runs a backslash command that prints the catalog (`\d`, `\dt [PATTERN]`, `\d TABLE`, `\?`)
/// into `out`, at the prompt or from `-c`; `None` for any other command.
pub(crate) async fn catalog_command(
    engine: &QueryEngine,
    command: &str,
    argument: Option<&str>,
    format: Format,
    out: &mut (dyn std::io::Write + Send),
) -> Option<anyhow::Result<()>> {
    Some(match (command, argument) {
        ("\\?" | "\\h", _) => writeln!(out, "{HELP}").map_err(Into::into),
        ("\\d" | "\\dt", None) => list_tables(engine, None, format, out).await,
        ("\\dt", Some(pattern)) => list_tables(engine, Some(pattern), format, out).await,
        ("\\d", Some(table)) => describe(engine, table, format, out).await,
        _ => return None,
    })
}

/// Prints the tables, or those whose name matches `pattern` as psql's `\dt` does: `*` any
/// characters, `?` one; `database.table` matches both parts, a name alone the table's in
/// any database.
async fn list_tables(
    engine: &QueryEngine,
    pattern: Option<&str>,
    format: Format,
    out: &mut (dyn std::io::Write + Send),
) -> anyhow::Result<()> {
    let like = |p: &str| {
        let mut out = String::from("'");
        for c in p.chars() {
            match c {
                '*' => out.push('%'),
                '?' => out.push('_'),
                '%' | '_' | '\\' => {
                    out.push('\\');
                    out.push(c);
                }
                '\'' => out.push_str("''"),
                c => out.push(c),
            }
        }
        out.push('\'');
        out
    };
    let filter = match pattern.map(|p| p.split_once('.').map_or((None, p), |(d, t)| (Some(d), t))) {
        None => String::new(),
        Some((None, table)) => format!(" AND table_name LIKE {}", like(table)),
        Some((Some(database), table)) => format!(
            " AND table_schema LIKE {} AND table_name LIKE {}",
            like(database),
            like(table)
        ),
    };
    let sql = format!(
        "SELECT table_schema AS database, table_name AS table FROM information_schema.tables \
         WHERE table_catalog = 'mink' AND table_schema NOT IN ('information_schema', 'system'){filter} \
         ORDER BY 1, 2"
    );
    run_statement(engine, &sql, format, 0, out).await
}

/// The columns of `table` (`database.table`, or a table of database `default`), as planning a
/// read of it finds them: `t$log`, `t$lake` and the system tables too, which the information
/// schema does not list.
async fn describe(
    engine: &QueryEngine,
    table: &str,
    format: Format,
    out: &mut (dyn std::io::Write + Send),
) -> anyhow::Result<()> {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, RecordBatch, StringArray};
    let quoted = |i: &str| format!("\"{}\"", i.replace('"', "\"\""));
    let mut df = None;
    let mut first_error = None;
    for (database, name) in table_names(table)? {
        match engine
            .sql(&format!(
                "SELECT * FROM {}.{}",
                quoted(&database),
                quoted(&name)
            ))
            .await
        {
            Ok(found) => {
                df = Some(found);
                break;
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    let Some(df) = df else {
        return Err(first_error.expect("a name was tried").into());
    };
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
    print_batches(&batch.schema(), &[batch], format, out)
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
    fn a_described_name_is_read_as_sql_reads_it_then_as_written() {
        let names = |t: &str| {
            table_names(t)
                .unwrap()
                .into_iter()
                .map(|(d, n)| format!("{d}|{n}"))
                .collect::<Vec<_>>()
        };
        assert_eq!(names("app.events"), ["app|events"]);
        assert_eq!(names("app.Events"), ["app|events", "app|Events"]);
        assert_eq!(names("app.\"Events\""), ["app|Events"]);
        assert_eq!(names("\"A.b\".\"x\"\"y\""), ["A.b|x\"y"]);
        assert_eq!(names("t"), ["default|t"]);
        assert_eq!(names("app.people$changelog"), ["app|people$changelog"]);
        assert!(table_names("app.\"open").is_err());
        assert!(table_names("a.b.c").is_err());
    }

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

    /// A script's `\\` command is a line of its own between statements (it ran on into the
    /// next statement, which was lost).
    #[test]
    fn a_script_command_is_its_own_line() {
        assert_eq!(
            split_script("\\d app.acct\nSELECT 111;\nSELECT 222;\n"),
            ["\\d app.acct", "SELECT 111", "SELECT 222"]
        );
        assert_eq!(
            split_script("SELECT 1;\n  \\dt app*\n-- c\nINSERT INTO t VALUES (1);"),
            ["SELECT 1", "\\dt app*", "-- c\nINSERT INTO t VALUES (1)"]
        );
        // Inside a statement or a string a backslash line is the statement's.
        assert_eq!(
            split_script("SELECT 'a\n\\b';\nSELECT 1\n\\d\n;"),
            ["SELECT 'a\n\\b'", "SELECT 1\n\\d"]
        );
    }

    /// A `;` in a comment or an escaped string ends nothing (`-- note: counts; rows` split the
    /// statement, and the rest failed to parse).
    #[test]
    fn semicolons_in_comments_and_escaped_strings_end_nothing() {
        assert_eq!(
            split_statements("SELECT 1 AS a; -- note: counts; rows\nSELECT 2 AS b;\n"),
            ["SELECT 1 AS a", "-- note: counts; rows\nSELECT 2 AS b"]
        );
        assert_eq!(
            split_statements("SELECT 3 /* ; */ AS z;"),
            ["SELECT 3 /* ; */ AS z"]
        );
        assert_eq!(
            split_statements("SELECT 4 AS w -- trailing; comment\n;"),
            ["SELECT 4 AS w -- trailing; comment"]
        );
        assert_eq!(
            split_statements(r"SELECT E'x\';y' AS v; SELECT 'it''s;' AS u"),
            [r"SELECT E'x\';y' AS v", "SELECT 'it''s;' AS u"]
        );
        assert_eq!(split_statements("SELECT 1; -- the end\n"), ["SELECT 1"]);
        assert!(complete("SELECT 1; -- done"));
        assert!(!complete("SELECT 1 -- not yet;"));
        assert!(!complete("SELECT 1 /* ; "));
        assert!(!complete("SELECT E'a\\';"));
    }
}
