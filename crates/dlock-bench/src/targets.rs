//! The performance targets, judged on THIS run: every section that measures one of them adds
//! its figure here, and the last table of the results puts each figure beside its target
//! with a verdict computed from the figure (met / missed). Nothing is asserted: a missed
//! target is reported, never an error. A target whose section (or whose condition, such
//! as 64 waiters or 100 000 leases) was not part of this run says so instead of a verdict.

use std::time::Duration;

use crate::report::{fmt_dur, fmt_rate};

/// The rows of the table, in its order: `(row, section that measures it, figure,
/// target)`. A row no section reported on is printed as not measured.
const ISSUE_ROWS: [(u32, &str, &str, &str); 9] = [
    (
        1,
        "uncontended",
        "uncontended cycles/s × rslock, 1 / 16 / 64 tasks (fencing and watchdog on)",
        "≥ 1.0× at each",
    ),
    (
        2,
        "contended",
        "64 waiters, a client per waiter: acquisitions/s × BLPOP scheme",
        "≥ 1.0×",
    ),
    (
        3,
        "contended",
        "same: hand-off p50 / fairness max/min / wait p99",
        "≤ 3 RT / ≤ 1.5 / ≤ 20 ms",
    ),
    (
        4,
        "contended",
        "8 waiters, a client per waiter: hand-off p50 / fairness",
        "≤ 2.5 RT / ≤ 1.5",
    ),
    (
        5,
        "primitives",
        "semaphore (1 permit), 64 waiters in 64 clients",
        "as the lock: ≥ 1.0× BLPOP, ≤ 3 RT, ≤ 1.5, ≤ 20 ms",
    ),
    (
        6,
        "etcd",
        "etcd, 8 and 64 waiters: hand-off p50 × etcd's lock service / fairness",
        "≤ 1.0× / ≤ 1.5",
    ),
    (
        7,
        "redlock",
        "RedLock 3 and 5 nodes: cycles/s × rslock",
        "≥ 1.0×",
    ),
    (
        8,
        "watchdog",
        "100 000 leases of mixed primitives on one client, ttl 30 s",
        "0 lost, < 5 % of a core, one renewal task",
    ),
    (9, "memory", "client heap per held lock", "≤ 400 B"),
];

/// How a figure compares with its target.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Goal {
    /// The figure must be at least this.
    AtLeast(f64),
    /// The figure must be at most this.
    AtMost(f64),
    /// The figure must be below this.
    Below(f64),
    /// The figure must be exactly this.
    Exactly(f64),
}

impl Goal {
    fn met(self, value: f64) -> bool {
        match self {
            Goal::AtLeast(t) => value >= t,
            Goal::AtMost(t) => value <= t,
            Goal::Below(t) => value < t,
            Goal::Exactly(t) => value == t,
        }
    }
}

enum Verdict {
    Met,
    Missed,
    /// Not judged, and why.
    NotJudged(String),
}

struct Figure {
    /// The issue table's row.
    row: u32,
    figure: String,
    value: String,
    target: String,
    verdict: Verdict,
}

/// The figures the sections reported.
#[derive(Default)]
pub(crate) struct Targets {
    figures: Vec<Figure>,
}

impl Targets {
    /// Figure `figure` of issue row `row`: `value` (`None`: missing from this run, e.g. a
    /// peer's run) shown as `shown`, judged against `goal`, described as `target`.
    pub(crate) fn judge(
        &mut self,
        row: u32,
        figure: impl Into<String>,
        value: Option<f64>,
        shown: impl Into<String>,
        goal: Goal,
        target: &str,
    ) {
        let verdict = match value {
            None => Verdict::NotJudged("a figure it needs is missing from this run".to_owned()),
            // NaN (e.g. 0/0) misses every goal, as does ∞ a ceiling.
            Some(v) if goal.met(v) => Verdict::Met,
            Some(_) => Verdict::Missed,
        };
        self.figures.push(Figure {
            row,
            figure: figure.into(),
            value: shown.into(),
            target: target.to_owned(),
            verdict,
        });
    }

    /// A figure of issue row `row` whose condition this run did not meet (`why`), with
    /// what it measured instead (`shown`, may be empty).
    pub(crate) fn not_judged(
        &mut self,
        row: u32,
        figure: impl Into<String>,
        shown: impl Into<String>,
        target: &str,
        why: impl Into<String>,
    ) {
        self.figures.push(Figure {
            row,
            figure: figure.into(),
            value: shown.into(),
            target: target.to_owned(),
            verdict: Verdict::NotJudged(why.into()),
        });
    }

    /// The closing table, the rows in order; rows that no section of this run
    /// measured say which section to run.
    pub(crate) fn markdown(&self, quick: bool) -> String {
        let mut md = format!(
            "\n## The performance targets, judged on this run\n\n\
             Every figure below is taken from the tables above ({} profile{}); each verdict \
             is computed from its figure and nothing else. RT = the PING round trip of the \
             figure's own section.\n\n\
             | # | figure | this run | target | verdict |\n\
             |---:|---|---|---|---|\n",
            if quick { "quick" } else { "full" },
            if quick {
                " — shorter and fewer runs, without 64 etcd waiters or 100 000 leases \
                 at ttl 30 s — so these verdicts are for direction only"
            } else {
                ""
            },
        );
        let (mut met, mut missed, mut open) = (0, 0, 0);
        for (row, section, figure, target) in ISSUE_ROWS {
            let mine: Vec<&Figure> = self.figures.iter().filter(|f| f.row == row).collect();
            if mine.is_empty() {
                open += 1;
                md.push_str(&format!(
                    "| {row} | {figure} | – | {target} | not measured: section `{section}` \
                     was not run |\n"
                ));
                continue;
            }
            for f in mine {
                let verdict = match &f.verdict {
                    Verdict::Met => {
                        met += 1;
                        "**met**".to_owned()
                    }
                    Verdict::Missed => {
                        missed += 1;
                        "**missed**".to_owned()
                    }
                    Verdict::NotJudged(why) => {
                        open += 1;
                        format!("not judged: {why}")
                    }
                };
                md.push_str(&format!(
                    "| {row} | {} | {} | {} | {verdict} |\n",
                    f.figure,
                    if f.value.is_empty() { "–" } else { &f.value },
                    f.target,
                ));
            }
        }
        md.push_str(&format!(
            "\n{} met, {} missed, {} not judged in this run.\n",
            fmt_rate(f64::from(met)),
            fmt_rate(f64::from(missed)),
            fmt_rate(f64::from(open)),
        ));
        md
    }
}

/// The hand-off figures of one contended cell, for the lock's and the semaphore's rows.
pub(crate) struct HandoffFigures {
    /// The issue table's row.
    pub(crate) row: u32,
    /// Which cell, e.g. "64 waiters, a client per waiter".
    pub(crate) what: String,
    /// The section's PING round trip.
    pub(crate) rtt: Duration,
    /// Median hand-off p50.
    pub(crate) p50: Duration,
    /// Median fairness (most / fewest acquisitions of one waiter).
    pub(crate) fairness: f64,
    /// Median wait p99, when the row has a target for it.
    pub(crate) wait_p99: Option<Duration>,
    /// The hand-off target in round trips.
    pub(crate) max_rt: f64,
}

/// Fairness target of every contended row.
const MAX_FAIRNESS: f64 = 1.5;
/// Wait p99 target of the 64-waiter rows.
const MAX_WAIT_P99: Duration = Duration::from_millis(20);

impl HandoffFigures {
    /// Adds the cell's hand-off (in round trips), fairness and wait figures.
    pub(crate) fn judge(&self, targets: &mut Targets) {
        let rt = self.p50.as_secs_f64() / self.rtt.as_secs_f64().max(1e-9);
        targets.judge(
            self.row,
            format!("{}: hand-off p50", self.what),
            Some(rt),
            format!(
                "{rt:.1} RT ({}, PING p50 {})",
                fmt_dur(self.p50),
                fmt_dur(self.rtt)
            ),
            Goal::AtMost(self.max_rt),
            &format!("≤ {} RT", self.max_rt),
        );
        targets.judge(
            self.row,
            format!("{}: fairness max/min", self.what),
            Some(self.fairness),
            fairness_text(self.fairness),
            Goal::AtMost(MAX_FAIRNESS),
            "≤ 1.5",
        );
        if let Some(wait) = self.wait_p99 {
            targets.judge(
                self.row,
                format!("{}: wait p99", self.what),
                Some(wait.as_secs_f64()),
                fmt_dur(wait),
                Goal::AtMost(MAX_WAIT_P99.as_secs_f64()),
                "≤ 20 ms",
            );
        }
    }
}

/// `0.63× (5 377 vs 8 480)`: a ratio with its two rates.
pub(crate) fn ratio_text(value: f64, base: f64) -> String {
    format!(
        "{:.2}× ({} vs {})",
        value / base,
        fmt_rate(value),
        fmt_rate(base)
    )
}

/// `1.02`, or `∞` (some waiter got nothing).
pub(crate) fn fairness_text(fairness: f64) -> String {
    if fairness.is_finite() {
        format!("{fairness:.2}")
    } else {
        "∞".to_owned()
    }
}

/// `1 task`, `16 tasks`.
pub(crate) fn tasks_text(n: usize) -> String {
    if n == 1 {
        "1 task".to_owned()
    } else {
        format!("{n} tasks")
    }
}
