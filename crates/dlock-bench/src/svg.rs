//! Hand-written SVG charts: side-by-side panels with a logarithmic latency axis.

use std::fmt::Write;

/// One line (CDF) or one outlined histogram in a panel. `points` are `(µs, value)`.
pub(crate) struct Series {
    /// Legend text.
    pub(crate) label: String,
    /// CSS colour.
    pub(crate) color: &'static str,
    /// `(latency in µs, y)`, ascending in x. For histograms, x is the bin's lower edge.
    pub(crate) points: Vec<(f64, f64)>,
}

/// One chart panel.
pub(crate) struct Panel {
    /// Panel title.
    pub(crate) title: String,
    /// Its series, in legend order.
    pub(crate) series: Vec<Series>,
}

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 340.0;
const TOP: f64 = 70.0;
const BOTTOM: f64 = 42.0;
const LEFT: f64 = 50.0;
const RIGHT: f64 = 14.0;

/// Where one panel's plot area is and what it spans.
struct Axes {
    left: f64,
    width: f64,
    top: f64,
    height: f64,
    /// log10 of the x range in µs.
    x_lo: f64,
    x_hi: f64,
    y_max: f64,
}

impl Axes {
    fn x(&self, us: f64) -> f64 {
        let l = us.max(1e-3).log10().clamp(self.x_lo, self.x_hi);
        self.left + (l - self.x_lo) / (self.x_hi - self.x_lo) * self.width
    }

    fn y(&self, v: f64) -> f64 {
        self.top + self.height - (v / self.y_max).clamp(0.0, 1.0) * self.height
    }
}

fn decade_label(exp: i32) -> String {
    match exp {
        i32::MIN..=-1 => format!("1e{exp} µs"),
        0 => "1 µs".into(),
        1 => "10 µs".into(),
        2 => "100 µs".into(),
        3 => "1 ms".into(),
        4 => "10 ms".into(),
        5 => "100 ms".into(),
        6 => "1 s".into(),
        _ => format!("{} s", 10f64.powi(exp - 6)),
    }
}

/// The x range (log10 µs, whole decades) covering every non-zero point.
fn x_range(panels: &[Panel], skip_zero_y: bool) -> (f64, f64) {
    let xs = panels
        .iter()
        .flat_map(|p| p.series.iter())
        .flat_map(|s| s.points.iter())
        .filter(|(x, y)| *x > 0.0 && (!skip_zero_y || *y > 0.0))
        .map(|(x, _)| x.log10());
    let (lo, hi) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
        (lo.min(x), hi.max(x))
    });
    if !lo.is_finite() {
        return (1.0, 6.0);
    }
    let lo = lo.floor();
    let hi = (hi + 0.15).ceil().max(lo + 1.0);
    (lo, hi)
}

/// Draws the frame (title, legend, axes, ticks) and calls `plot` for each panel's series.
fn chart(
    title: &str,
    panels: &[Panel],
    y_max: f64,
    y_label: impl Fn(f64) -> String,
    skip_zero_y: bool,
    plot: impl Fn(&Series, &Axes) -> String,
) -> String {
    let (x_lo, x_hi) = x_range(panels, skip_zero_y);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/><text x="{}" y="20" text-anchor="middle" font-size="14">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    // Legend from the first panel (every panel has the same series).
    if let Some(first) = panels.first() {
        let mut x = LEFT;
        for s in &first.series {
            let _ = writeln!(
                out,
                r#"<line x1="{x}" y1="38" x2="{}" y2="38" stroke="{}" stroke-width="3"/><text x="{}" y="42">{}</text>"#,
                x + 18.0,
                s.color,
                x + 22.0,
                escape(&s.label)
            );
            x += 30.0 + 6.5 * s.label.chars().count() as f64;
        }
    }
    let panel_width = (WIDTH - LEFT) / panels.len().max(1) as f64;
    for (i, panel) in panels.iter().enumerate() {
        let axes = Axes {
            left: LEFT + i as f64 * panel_width,
            width: panel_width - RIGHT - if i + 1 < panels.len() { 36.0 } else { 0.0 },
            top: TOP,
            height: HEIGHT - TOP - BOTTOM,
            x_lo,
            x_hi,
            y_max,
        };
        let bottom = axes.top + axes.height;
        let _ = writeln!(
            out,
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="#999"/><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="12">{}</text>"##,
            axes.left,
            axes.top,
            axes.width,
            axes.height,
            axes.left + axes.width / 2.0,
            axes.top - 6.0,
            escape(&panel.title)
        );
        for exp in (x_lo as i32)..=(x_hi as i32) {
            let x = axes.x(10f64.powi(exp));
            let _ = writeln!(
                out,
                r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{bottom:.1}" stroke="#eee"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                axes.top,
                bottom + 14.0,
                decade_label(exp)
            );
        }
        for step in 0..=4 {
            let v = y_max * f64::from(step) / 4.0;
            let y = axes.y(v);
            let _ = writeln!(
                out,
                r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#eee"/>"##,
                axes.left,
                axes.left + axes.width
            );
            if i == 0 {
                let _ = writeln!(
                    out,
                    r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
                    axes.left - 4.0,
                    y + 4.0,
                    y_label(v)
                );
            }
        }
        for s in &panel.series {
            out.push_str(&plot(s, &axes));
        }
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">latency (log scale)</text></svg>"#,
        WIDTH / 2.0,
        HEIGHT - 6.0
    );
    out
}

fn polyline(points: &[(f64, f64)], color: &str, fill: bool) -> String {
    let coords: Vec<String> = points
        .iter()
        .map(|(x, y)| format!("{x:.1},{y:.1}"))
        .collect();
    let fill = if fill {
        format!(r#"fill="{color}" fill-opacity="0.12""#)
    } else {
        r#"fill="none""#.to_owned()
    };
    format!(
        "<polyline points=\"{}\" {fill} stroke=\"{color}\" stroke-width=\"1.6\"/>\n",
        coords.join(" ")
    )
}

/// Cumulative distributions: y from 0 to 1.
pub(crate) fn cdf_chart(title: &str, panels: &[Panel]) -> String {
    chart(
        title,
        panels,
        1.0,
        |v| format!("{:.0} %", v * 100.0),
        false,
        |s, axes| {
            let pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .map(|&(us, q)| (axes.x(us), axes.y(q)))
                .collect();
            polyline(&pts, s.color, false)
        },
    )
}

/// Histograms over logarithmic bins (y: fraction of samples), drawn as outlined steps.
pub(crate) fn histogram_chart(title: &str, panels: &[Panel]) -> String {
    let y_top = panels
        .iter()
        .flat_map(|p| p.series.iter())
        .flat_map(|s| s.points.iter())
        .map(|(_, y)| *y)
        .fold(0.0f64, f64::max);
    // Round the y axis up to a multiple of 20 %, so the four grid steps are whole 5 %s.
    let y_max = ((y_top * 5.0).ceil() / 5.0).clamp(0.2, 1.0);
    chart(
        title,
        panels,
        y_max,
        |v| format!("{:.0} %", v * 100.0),
        true,
        |s, axes| {
            if s.points.len() < 2 {
                return String::new();
            }
            let ratio = s.points[1].0 / s.points[0].0;
            let base = axes.y(0.0);
            let mut pts = vec![(axes.x(s.points[0].0), base)];
            for &(lo, frac) in &s.points {
                let y = axes.y(frac);
                pts.push((axes.x(lo), y));
                pts.push((axes.x(lo * ratio), y));
            }
            if let Some(&(last, _)) = s.points.last() {
                pts.push((axes.x(last * ratio), base));
            }
            polyline(&pts, s.color, true)
        },
    )
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
