//! The timeline: one row per worker, a bar per hold (red where holders overlapped; read
//! holds of a read-write lock as thin blue bars, purple where they overlapped a writer),
//! fault windows shaded, kills marked.

use std::fmt::Write as _;

use crate::report::KindReport;

const WIDTH: f64 = 1100.0;
const LEFT: f64 = 90.0;
const ROW: f64 = 22.0;
const TOP: f64 = 56.0;

/// `s` as SVG text (also the soak chart's).
pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The timeline of one kind's run, with at least `workers` rows.
pub(crate) fn timeline(report: &KindReport, workers: usize) -> String {
    let (findings, holds, reads, windows, kills) = (
        &report.findings,
        &report.holds,
        &report.read_holds,
        &report.fault_windows,
        &report.kills,
    );
    let all = || holds.iter().chain(reads);
    let workers = all()
        .map(|h| h.worker + 1)
        .max()
        .unwrap_or(workers)
        .max(workers);
    let start = all().map(|h| h.start).min().unwrap_or(0);
    let end = all().map(|h| h.end).max().unwrap_or(0);
    let span = end.saturating_sub(start).max(1) as f64;
    let x = |t: u64| LEFT + (t.saturating_sub(start) as f64 / span) * (WIDTH - LEFT - 10.0);
    let height = TOP + ROW * workers as f64 + 40.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(s, r##"<rect width="100%" height="100%" fill="#fff"/>"##);
    let _ = write!(
        s,
        r#"<text x="8" y="18" font-size="14" font-weight="bold">{}: {}</text>"#,
        findings.kind.id(),
        esc(&findings.verdict)
    );
    let reads_line = if reads.is_empty() {
        String::new()
    } else {
        format!(
            " · read holds {} · overlapping a writer {}",
            findings.read_holds, findings.read_overlaps
        )
    };
    let _ = write!(
        s,
        r#"<text x="8" y="36">holds {} · overlaps {} · lost increments {} · stale writes accepted {} · fenced writes refused {}{reads_line}</text>"#,
        findings.holds,
        findings.overlaps,
        findings.lost_increments,
        findings.stale_accepted,
        findings.fenced_refused
    );
    for w in windows {
        let (x0, x1) = (x(w.start), x(w.end.max(w.start)));
        let label = if w.nodes.is_empty() {
            w.fault.id().to_owned()
        } else {
            let nodes: Vec<String> = w.nodes.iter().map(|n| format!("n{n}")).collect();
            format!("{} {}", w.fault.id(), nodes.join(","))
        };
        let _ = write!(
            s,
            r##"<rect x="{x0:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="#f4a261" fill-opacity="0.25"/><text x="{x0:.1}" y="{:.1}" fill="#b5651d">{}</text>"##,
            (x1 - x0).max(2.0),
            ROW * workers as f64,
            TOP - 4.0,
            esc(&label)
        );
    }
    for row in 0..workers {
        let y = TOP + ROW * row as f64;
        let _ = write!(s, r#"<text x="8" y="{:.1}">worker {row}</text>"#, y + 15.0);
        let _ = write!(
            s,
            r##"<line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#ddd"/>"##,
            y + ROW - 1.0,
            WIDTH - 10.0,
            y + ROW - 1.0
        );
    }
    for h in holds {
        let y = TOP + ROW * h.worker as f64 + 3.0;
        let (x0, x1) = (x(h.start), x(h.end));
        let color = if h.overlapping { "#d62828" } else { "#2a9d8f" };
        let _ = write!(
            s,
            r#"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{color}"><title>worker {} fence {} · {:.1} ms</title></rect>"#,
            (x1 - x0).max(1.0),
            ROW - 7.0,
            h.worker,
            h.fence,
            (h.end.saturating_sub(h.start)) as f64 / 1e6
        );
    }
    for h in reads {
        // The lower third of the row, under where write holds are drawn.
        let y = TOP + ROW * h.worker as f64 + ROW - 9.0;
        let (x0, x1) = (x(h.start), x(h.end));
        let color = if h.overlapping { "#7b2cbf" } else { "#4895ef" };
        let _ = write!(
            s,
            r#"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="5" fill="{color}"><title>worker {} read hold · {:.1} ms</title></rect>"#,
            (x1 - x0).max(1.0),
            h.worker,
            (h.end.saturating_sub(h.start)) as f64 / 1e6
        );
    }
    for k in kills {
        let y = TOP + ROW * k.worker as f64 + 11.0;
        let x0 = x(k.t);
        let _ = write!(
            s,
            r#"<path d="M{:.1},{:.1} l10,10 m0,-10 l-10,10" stroke="black" stroke-width="2" transform="translate(-5,-5)"/>"#,
            x0, y
        );
    }
    let legend_y = TOP + ROW * workers as f64 + 24.0;
    let read_legend = if reads.is_empty() {
        ""
    } else {
        r##"  <tspan fill="#4895ef">▬ read hold</tspan>  <tspan fill="#7b2cbf">▬ read hold overlapping a writer</tspan>"##
    };
    let _ = write!(
        s,
        r##"<text x="8" y="{legend_y:.1}">time →  {:.1} s · <tspan fill="#2a9d8f">■ hold</tspan>  <tspan fill="#d62828">■ overlapping hold</tspan>{read_legend}  <tspan fill="#f4a261">■ fault window</tspan>  ✕ worker killed</text></svg>"##,
        span / 1e9
    );
    s
}
