//! The report of a run: the summary, then throughput (MB/s per second) and latency (p50 and
//! p99 per second) as SVG line charts. Markdown links the charts as files written beside it;
//! HTML holds them inline.

use std::path::Path;

use anyhow::bail;
use plotters::prelude::*;

use super::Second;

/// How a report at `path` is written, from its extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Format {
    Markdown,
    Html,
}

pub(super) fn format_of(path: &Path) -> anyhow::Result<Format> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("md") => Ok(Format::Markdown),
        Some("html" | "htm") => Ok(Format::Html),
        _ => bail!("--report {}: name a .md or .html file", path.display()),
    }
}

/// Refuses a report the run could not write, before the run (its figures would be lost after
/// it): a name of neither format, or a directory that is missing or not writable.
pub(super) fn check(path: &Path) -> anyhow::Result<()> {
    format_of(path)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        bail!(
            "--report {}: {} {}",
            path.display(),
            dir.display(),
            if dir.exists() {
                "is not a directory"
            } else {
                "does not exist"
            }
        );
    }
    if let Err(e) = tempfile::NamedTempFile::new_in(dir) {
        // The OS's error, without the temporary file's name.
        let cause = e.raw_os_error().map_or_else(
            || e.to_string(),
            |c| std::io::Error::from_raw_os_error(c).to_string(),
        );
        bail!(
            "--report {}: cannot write in {}: {cause}",
            path.display(),
            dir.display()
        );
    }
    Ok(())
}

const WIDTH: u32 = 900;
const HEIGHT: u32 = 320;
const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
];

/// One line of a chart: its name and `(second, value)` points.
type Line = (String, Vec<(f64, f64)>);

/// A line chart of `lines` as an SVG document.
fn chart(title: &str, y_label: &str, lines: &[Line]) -> anyhow::Result<String> {
    let mut svg = String::new();
    {
        let x_max = lines
            .iter()
            .flat_map(|(_, p)| p.iter().map(|(x, _)| *x))
            .fold(1.0, f64::max);
        let y_max = lines
            .iter()
            .flat_map(|(_, p)| p.iter().map(|(_, y)| *y))
            .filter(|y| y.is_finite())
            .fold(0.0, f64::max)
            .max(1e-3)
            * 1.1;
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let mut c = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(plot_error)?;
        c.configure_mesh()
            .x_desc("seconds")
            .y_desc(y_label)
            .draw()
            .map_err(plot_error)?;
        for (i, (name, points)) in lines.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            c.draw_series(LineSeries::new(
                points.iter().copied().filter(|(_, y)| y.is_finite()),
                color.stroke_width(2),
            ))
            .map_err(plot_error)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
        }
        c.configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(plot_error)?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

fn plot_error(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing a chart: {e}")
}

/// The two charts of a run: throughput and latency per second of each side.
fn charts(timelines: &[(&'static str, Vec<Second>)]) -> anyhow::Result<(String, String)> {
    // The last second is partial: left out (unless it is the only one).
    let full = |s: &[Second]| s.len().saturating_sub(1).max(1).min(s.len());
    let throughput: Vec<Line> = timelines
        .iter()
        .map(|(side, seconds)| {
            let n = full(seconds);
            (
                format!("{side} MB/s"),
                seconds[..n]
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (i as f64 + 0.5, s.bytes as f64 / 1e6))
                    .collect(),
            )
        })
        .collect();
    let mut latency: Vec<Line> = Vec::new();
    for (side, seconds) in timelines {
        let n = full(seconds);
        for (q, name) in [(0.5, "p50"), (0.99, "p99")] {
            let points: Vec<(f64, f64)> = seconds[..n]
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.latency.is_empty())
                .map(|(i, s)| {
                    (
                        i as f64 + 0.5,
                        s.latency.value_at_quantile(q) as f64 / 1000.0,
                    )
                })
                .collect();
            if !points.is_empty() {
                latency.push((format!("{side} {name}"), points));
            }
        }
    }
    Ok((
        chart("Throughput", "MB/s", &throughput)?,
        chart("Latency", "ms", &latency)?,
    ))
}

/// Writes the report of a run titled `title` (`mink-bench produce over kafka`, say).
pub(super) fn write(
    path: &Path,
    title: &str,
    summary: &str,
    timelines: &[(&'static str, Vec<Second>)],
) -> anyhow::Result<()> {
    let (throughput, latency) = charts(timelines)?;
    // The command as the user typed it, the program by its name only.
    let command: Vec<String> = std::env::args()
        .enumerate()
        .map(|(i, a)| {
            if i == 0 {
                Path::new(&a)
                    .file_name()
                    .map_or(a.clone(), |n| n.to_string_lossy().into_owned())
            } else {
                a
            }
        })
        .collect();
    match format_of(path)? {
        Format::Markdown => {
            let stem = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("report");
            let dir = path.parent().unwrap_or(Path::new(""));
            let (t, l) = (
                format!("{stem}-throughput.svg"),
                format!("{stem}-latency.svg"),
            );
            std::fs::write(dir.join(&t), throughput)?;
            std::fs::write(dir.join(&l), latency)?;
            std::fs::write(
                path,
                format!(
                    "# {title}\n\n`{}`\n\n{summary}\n![throughput]({t})\n\n![latency]({l})\n",
                    command.join(" ")
                ),
            )?;
        }
        Format::Html => {
            let table = markdown_table_to_html(summary);
            std::fs::write(
                path,
                format!(
                    "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title>\
                     <style>body{{font-family:sans-serif;max-width:960px;margin:2em auto}}\
                     table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}</style>\
                     </head><body>\n<h1>{title}</h1>\n<p><code>{}</code></p>\n{table}\n{throughput}\n{latency}\n</body></html>\n",
                    escape(&command.join(" "))
                ),
            )?;
        }
    }
    Ok(())
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The summary's text and Markdown table as HTML.
fn markdown_table_to_html(summary: &str) -> String {
    let mut out = String::new();
    let mut in_table = false;
    for line in summary.lines() {
        if let Some(row) = line.strip_prefix('|') {
            if row.starts_with("---") {
                continue;
            }
            if !in_table {
                out.push_str("<table>\n");
                in_table = true;
            }
            out.push_str("<tr>");
            for cell in row.trim_end_matches('|').split('|') {
                out.push_str(&format!("<td>{}</td>", escape(cell.trim())));
            }
            out.push_str("</tr>\n");
        } else {
            if in_table {
                out.push_str("</table>\n");
                in_table = false;
            }
            if !line.trim().is_empty() {
                out.push_str(&format!("<p>{}</p>\n", escape(line)));
            }
        }
    }
    if in_table {
        out.push_str("</table>\n");
    }
    out
}
