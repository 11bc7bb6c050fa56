//! The results: a table on stdout, JSON and an SVG plot on disk.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::exit::{Failure, UNAVAILABLE};

/// One measured point.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Row {
    /// The backend and its (redacted) URL.
    pub backend: String,
    /// The scenario.
    pub scenario: &'static str,
    /// The point within it (a percentile, a task count).
    pub point: String,
    /// The unit of `library` and `raw`.
    pub unit: &'static str,
    /// Through the library.
    pub library: f64,
    /// The same backend commands sent raw.
    pub raw: Option<f64>,
    /// Library cost over raw cost (1.0 = no overhead).
    pub ratio: Option<f64>,
    /// Anything else worth knowing.
    pub note: String,
}

fn number(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

pub(super) fn print_table(rows: &[Row]) {
    println!(
        "\n{:<44} {:<12} {:<12} {:>12} {:>12} {:>11}  unit",
        "backend", "scenario", "point", "library", "raw", "library/raw"
    );
    for row in rows {
        println!(
            "{:<44} {:<12} {:<12} {:>12} {:>12} {:>11}  {}{}",
            row.backend,
            row.scenario,
            row.point,
            number(row.library),
            row.raw.map(number).unwrap_or_else(|| "—".into()),
            row.ratio.map(|r| format!("{r:.2}x")).unwrap_or_else(|| "—".into()),
            row.unit,
            if row.note.is_empty() { String::new() } else { format!("  ({})", row.note) }
        );
    }
}

pub(super) fn write_files(dir: &Path, rows: &[Row]) -> Result<(), Failure> {
    let fail = |e: std::io::Error| Failure::new(UNAVAILABLE, format!("cannot write to {}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(fail)?;
    let json = serde_json::to_string_pretty(rows).map_err(|e| Failure::new(UNAVAILABLE, e.to_string()))?;
    std::fs::write(dir.join("bench.json"), json).map_err(fail)?;
    std::fs::write(dir.join("bench.svg"), svg(rows)).map_err(fail)?;
    Ok(())
}

/// A horizontal bar chart of the library/raw cost ratio of every point that has one.
fn svg(rows: &[Row]) -> String {
    let bars: Vec<&Row> = rows.iter().filter(|r| r.ratio.is_some()).collect();
    let (left, bar_h, gap, width) = (420.0, 18.0, 6.0, 900.0);
    let max = bars.iter().filter_map(|r| r.ratio).fold(1.0_f64, f64::max).max(1.5);
    let scale = (width - left - 80.0) / max;
    let height = 60.0 + bars.len() as f64 * (bar_h + gap);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<text x="10" y="20" font-size="14" font-weight="bold">dlock bench: library cost / raw cost (1.0 = no overhead)</text>"#
    );
    let one = left + scale;
    let _ =
        writeln!(out, r##"<line x1="{one}" y1="30" x2="{one}" y2="{height}" stroke="#999" stroke-dasharray="4 3"/>"##);
    for (i, row) in bars.iter().enumerate() {
        let y = 40.0 + i as f64 * (bar_h + gap);
        let ratio = row.ratio.unwrap_or_default();
        let label = escape(&format!("{} · {} · {}", row.backend, row.scenario, row.point));
        let colour = if ratio <= 1.1 {
            "#4c9a2a"
        } else if ratio <= 1.5 {
            "#d8a31a"
        } else {
            "#c0392b"
        };
        let _ = writeln!(out, r#"<text x="{}" y="{}" text-anchor="end">{label}</text>"#, left - 8.0, y + bar_h - 5.0);
        let _ = writeln!(
            out,
            r#"<rect x="{left}" y="{y}" width="{:.1}" height="{bar_h}" fill="{colour}"/>"#,
            ratio * scale
        );
        let _ =
            writeln!(out, r#"<text x="{:.1}" y="{}">{ratio:.2}x</text>"#, left + ratio * scale + 4.0, y + bar_h - 5.0);
    }
    out.push_str("</svg>\n");
    out
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
