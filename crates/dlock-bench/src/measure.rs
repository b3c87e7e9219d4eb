//! Measuring tools: latency histograms, medians, the process's CPU time and memory, and
//! the server's command counters.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::Result;

/// Latencies in nanoseconds (3 significant digits, up to a minute).
#[derive(Clone)]
pub(crate) struct Latencies(Histogram<u64>);

impl Latencies {
    /// An empty histogram.
    pub(crate) fn new() -> Latencies {
        // Bounds are constants that hdrhistogram accepts (1 ns to 60 s, 3 digits).
        Latencies(Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds"))
    }

    /// Adds one sample.
    pub(crate) fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.0.saturating_record(ns);
    }

    /// Adds every sample of `other`.
    pub(crate) fn merge(&mut self, other: &Latencies) {
        // Same bounds on both sides, so adding cannot fail.
        let _ = self.0.add(&other.0);
    }

    /// Number of samples.
    pub(crate) fn len(&self) -> u64 {
        self.0.len()
    }

    /// The latency at quantile `q` (0..=1); zero when empty.
    pub(crate) fn quantile(&self, q: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.0.value_at_quantile(q))
    }

    /// `(latency in µs, fraction of samples at or below it)` at `points` quantiles, for a
    /// CDF chart.
    pub(crate) fn cdf_points(&self, points: usize) -> Vec<(f64, f64)> {
        if self.0.is_empty() {
            return Vec::new();
        }
        (0..=points)
            .map(|i| {
                // Denser towards the tail, where the differences are.
                let q = 1.0 - (1.0 - i as f64 / points as f64).powi(3);
                let q = q.min(0.999);
                (self.quantile(q).as_secs_f64() * 1e6, q)
            })
            .collect()
    }

    /// Fractions of samples in logarithmic bins: `(bin lower edge in µs, fraction)`.
    pub(crate) fn log_bins(&self, lo_us: f64, hi_us: f64, per_decade: usize) -> Vec<(f64, f64)> {
        let total = self.0.len();
        if total == 0 {
            return Vec::new();
        }
        let decades = (hi_us / lo_us).log10();
        let n = (decades * per_decade as f64).ceil() as usize;
        let mut bins = vec![0u64; n];
        for v in self.0.iter_recorded() {
            let us = v.value_iterated_to() as f64 / 1e3;
            let idx = ((us / lo_us).log10() * per_decade as f64).floor();
            let idx = (idx.max(0.0) as usize).min(n - 1);
            bins[idx] += v.count_at_value();
        }
        bins.iter()
            .enumerate()
            .map(|(i, c)| {
                (
                    lo_us * 10f64.powf(i as f64 / per_decade as f64),
                    *c as f64 / total as f64,
                )
            })
            .collect()
    }
}

/// The median of `values` (0 when empty).
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// The median of durations.
pub(crate) fn median_duration(values: &[Duration]) -> Duration {
    let secs: Vec<f64> = values.iter().map(Duration::as_secs_f64).collect();
    Duration::from_secs_f64(median(&secs))
}

/// Bytes currently allocated by the process (from the counting allocator).
pub(crate) fn live_heap() -> i64 {
    let s = crate::ALLOC.stats();
    // stats_alloc already books a reallocation's growth or shrinkage into these two.
    let allocated = i64::try_from(s.bytes_allocated).unwrap_or(i64::MAX);
    let freed = i64::try_from(s.bytes_deallocated).unwrap_or(i64::MAX);
    allocated - freed
}

/// Number of allocations so far (including reallocations).
pub(crate) fn allocations() -> u64 {
    let s = crate::ALLOC.stats();
    (s.allocations + s.reallocations) as u64
}

/// User + system CPU time of a process (`None`: this one), in clock ticks.
pub(crate) fn cpu_ticks(pid: Option<u32>) -> Result<u64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_owned(),
    };
    let stat = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    // The command name (field 2) may hold spaces; fields after it are plain. Field 3
    // (state) is index 0 after the ')', so utime (14) and stime (15) are 11 and 12.
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| format!("unexpected {path}"))?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |i: usize| -> Result<u64> {
        Ok(fields
            .get(i)
            .ok_or_else(|| format!("short {path}"))?
            .parse()?)
    };
    Ok(field(11)? + field(12)?)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on every Linux we know of).
pub(crate) fn clock_ticks_per_sec() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// CPU use of a process over a window, as a percentage of one core.
pub(crate) struct CpuMeter {
    pid: Option<u32>,
    ticks: u64,
    at: Instant,
}

impl CpuMeter {
    /// Starts measuring process `pid` (`None`: this one).
    pub(crate) fn start(pid: Option<u32>) -> Result<CpuMeter> {
        Ok(CpuMeter {
            pid,
            ticks: cpu_ticks(pid)?,
            at: Instant::now(),
        })
    }

    /// Percentage of one core used since `start`.
    pub(crate) fn percent(&self) -> Result<f64> {
        let secs = self.at.elapsed().as_secs_f64();
        Ok(self.cpu_seconds()? / secs * 100.0)
    }

    /// CPU seconds used since `start`.
    pub(crate) fn cpu_seconds(&self) -> Result<f64> {
        let ticks = cpu_ticks(self.pid)?.saturating_sub(self.ticks);
        Ok(ticks as f64 / clock_ticks_per_sec())
    }
}

/// Resident set size of this process, in bytes.
pub(crate) fn rss_bytes() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .ok_or("no VmRSS in /proc/self/status")?
        .parse()?;
    Ok(kb * 1024)
}

/// A connection manager configured like dlock's own (same timeouts and retries), so that
/// the limit and dlock use the same connection type.
pub(crate) async fn connection_manager(url: &str) -> Result<ConnectionManager> {
    let client = redis::Client::open(url)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(2)))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500));
    Ok(ConnectionManager::new_with_config(client, config).await?)
}

/// How many times the server ran `command` (lowercase) since its start, from
/// `INFO commandstats`.
pub(crate) async fn command_calls(conn: &mut ConnectionManager, command: &str) -> Result<u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    let prefix = format!("cmdstat_{command}:calls=");
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map(str::parse)
        .transpose()?
        .unwrap_or(0))
}

/// How many commands the server ran since its start, those run inside scripts included,
/// from `INFO commandstats` (less the `INFO` calls themselves).
pub(crate) async fn commands_run(conn: &mut ConnectionManager) -> Result<u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    let mut total = 0u64;
    for line in info.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(":calls="))
        else {
            continue;
        };
        if name == "info" {
            continue;
        }
        if let Some(calls) = rest.split(',').next() {
            total += calls.parse::<u64>()?;
        }
    }
    Ok(total)
}

/// The round-trip time of `PING` on a connection like dlock's, one at a time.
pub(crate) async fn round_trip(url: &str, samples: usize) -> Result<Latencies> {
    let mut conn = connection_manager(url).await?;
    let mut lat = Latencies::new();
    for i in 0..samples + samples / 10 {
        let start = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        if i >= samples / 10 {
            lat.record(start.elapsed()); // the first tenth warms up
        }
    }
    Ok(lat)
}
