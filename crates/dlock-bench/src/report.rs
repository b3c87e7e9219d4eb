//! Markdown: the machine description and number formatting shared by the sections.

use std::time::Duration;

use crate::{Profile, Result};

/// The results' heading: what ran, where.
pub(crate) fn header(profile: &Profile) -> Result<String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = if args.is_empty() {
        "cargo run --release -p dlock-bench".to_owned()
    } else {
        format!("cargo run --release -p dlock-bench -- {}", args.join(" "))
    };
    Ok(format!(
        "# dlock benchmark results ({} profile)\n\n\
         Command: `{command}`\n\n\
         | machine | |\n|---|---|\n\
         | CPUs (nproc) | {} |\n\
         | CPU model | {} |\n\
         | memory | {} |\n\
         | redis-server | {} |\n\
         | rustc | {} |\n\
         | kernel | {} |\n\n\
         Everything runs on this one machine: the client and `redis-server` share its \
         cores, over loopback TCP. Absolute figures vary from run to run on a shared \
         machine; compare the ratios, which were measured interleaved in one run.\n",
        if profile.quick { "quick" } else { "full" },
        std::thread::available_parallelism().map_or(0, usize::from),
        first_line_with("/proc/cpuinfo", "model name").unwrap_or_else(|| "unknown".into()),
        first_line_with("/proc/meminfo", "MemTotal").unwrap_or_else(|| "unknown".into()),
        command_output("redis-server", &["--version"]),
        command_output("rustc", &["--version"]),
        command_output("uname", &["-sr"]),
    ))
}

/// The value after `key:` on the first line of `path` that starts with `key`.
fn first_line_with(path: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
}

fn command_output(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// `84 µs`, `1.23 ms`, `2.10 s`.
pub(crate) fn fmt_dur(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1_000.0 {
        format!("{us:.0} µs")
    } else if us < 1_000_000.0 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

/// A rate or count with thin thousands separators: `12 345`.
pub(crate) fn fmt_rate(v: f64) -> String {
    let n = v.round() as u64;
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push('\u{202f}');
        }
        out.push(c);
    }
    out
}

/// `0.93×` — `value / base`, or a dash without a base.
pub(crate) fn fmt_ratio(value: f64, base: Option<f64>) -> String {
    match base {
        Some(b) if b > 0.0 => format!("{:.2}×", value / b),
        _ => "–".to_owned(),
    }
}

/// `812 B`, `3.4 KiB`, `120.5 MiB`.
pub(crate) fn fmt_bytes(b: f64) -> String {
    if b.abs() < 1024.0 {
        format!("{b:.0} B")
    } else if b.abs() < 1024.0 * 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{:.1} MiB", b / (1024.0 * 1024.0))
    }
}
