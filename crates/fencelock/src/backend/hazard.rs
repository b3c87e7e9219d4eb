//! Store configurations that can drop a held lock or repeat a fence, read on connect.
//!
//! Every client reads, when it connects, what its store exposes to any user about how it
//! keeps data (no extra privilege: Redis `INFO`, memcached `stats settings`, PostgreSQL
//! `current_setting`), and keeps what it found as [`ConfigHazard`]s: the client's
//! `config_hazards()` lists them, and each was logged once as a `tracing` warning.
//! Nothing is refused by the library unless asked: [`refuse_config_hazards`] turns the hazards that can
//! give two holders at once into an [`ErrorKind::UnsafeConfig`] error (the `dlock` tool
//! does that by default).
//!
//! | Store, setting | Hazard | Two holders? |
//! |---|---|---|
//! | Redis `maxmemory` > 0 with `allkeys-*` | [`HazardKind::EvictsLocksAndFences`] | yes |
//! | Redis `maxmemory` > 0 with `volatile-*` | [`HazardKind::EvictsLocks`] (fence counters have no TTL, so are kept) | yes |
//! | Redis without AOF (`aof_enabled:0`) | [`HazardKind::FencesNotDurable`] | no: fences repeat after a restart |
//! | memcached with evictions on (started without `-M`) | [`HazardKind::EvictsLocksAndFences`] | yes |
//!
//! What is not read: Redis `appendfsync` (only `CONFIG GET` shows it; with `everysec` a
//! crash can lose the last second of fences), the replicas' settings (a Sentinel client
//! reads the new master's after each failover it follows), and changes made after connect.
//! etcd and ZooKeeper have no such setting. PostgreSQL's session timeouts
//! (`idle_session_timeout`, `idle_in_transaction_session_timeout`, `statement_timeout`)
//! are not hazards dlock leaves to the user: in advisory mode each lock's session sets the
//! two idle timeouts to 0 for itself (an ended session would free its lock at once;
//! `statement_timeout` can only cancel a short check, which then fails); in lease mode a
//! lock is a row with an expiry, so a session that ends loses no lock (see the backends'
//! docs).

use std::fmt;

use crate::error::{Error, ErrorKind, Result};

/// What a store's configuration can do to locks or fences.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HazardKind {
    /// The store may evict any key under memory pressure: a held lock's key (a second
    /// holder is then granted while the first still works) and a name's fence counter
    /// (fences then start again at 1, so a fenced resource accepts a stale holder).
    /// Redis `maxmemory` with an `allkeys-*` policy; memcached with evictions on.
    EvictsLocksAndFences,
    /// The store may evict keys that have an expiry: a held lock's key (a second holder
    /// is then granted while the first still works). Fence counters never have one, so
    /// they are kept. Redis `maxmemory` with a `volatile-*` policy (ElastiCache's
    /// default is `volatile-lru`).
    EvictsLocks,
    /// Fence counters are not written to disk as they change: a restart of the store
    /// starts them again (fences repeat). Redis without AOF (`appendonly no`).
    FencesNotDurable,
}

impl HazardKind {
    /// Whether this hazard can give two holders at once (not only repeat fences after a
    /// restart). The `dlock` tool refuses these unless told to accept them.
    pub fn can_give_two_holders(self) -> bool {
        !matches!(self, HazardKind::FencesNotDurable)
    }

    fn what(self) -> &'static str {
        match self {
            HazardKind::EvictsLocksAndFences => {
                "it may evict a held lock (another holder is then granted while the first \
                 still runs) and a fence counter (fences start again at 1)"
            }
            HazardKind::EvictsLocks => {
                "it may evict a held lock's key, which has a TTL (another holder is then \
                 granted while the first still runs); fence counters have none and are kept"
            }
            HazardKind::FencesNotDurable => {
                "fence counters are not persisted: after a restart fences start again at 1"
            }
        }
    }
}

/// One configuration hazard a client found on connect: what, where, and the setting as
/// the store reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigHazard {
    kind: HazardKind,
    node: String,
    setting: String,
    fix: &'static str,
}

impl ConfigHazard {
    #[cfg_attr(
        not(any(feature = "redis", feature = "memcached", feature = "postgres")),
        allow(dead_code)
    )]
    /// A hazard of `kind` found on `node` (an address, without credentials) in `setting`
    /// (as the store reports it), with how to remove it.
    pub(crate) fn new(
        kind: HazardKind,
        node: impl Into<String>,
        setting: impl Into<String>,
        fix: &'static str,
    ) -> ConfigHazard {
        ConfigHazard {
            kind,
            node: node.into(),
            setting: setting.into(),
            fix,
        }
    }

    /// What the configuration can do.
    pub fn kind(&self) -> HazardKind {
        self.kind
    }

    /// The server it was found on (its address, never credentials).
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The setting as the store reported it (e.g. `maxmemory_policy:allkeys-lru`).
    pub fn setting(&self) -> &str {
        &self.setting
    }

    /// Whether it can give two holders at once ([`HazardKind::can_give_two_holders`]).
    pub fn can_give_two_holders(&self) -> bool {
        self.kind.can_give_two_holders()
    }

    /// Logs it as a `tracing` warning (once, on connect). Without the node's address,
    /// which dlock never records (docs/observability.md); `config_hazards()` has it.
    #[cfg_attr(not(any(feature = "redis", feature = "memcached")), allow(dead_code))]
    pub(crate) fn warn(&self) {
        tracing::warn!(
            setting = %self.setting,
            two_holders = self.can_give_two_holders(),
            "store configuration hazard: {}: {}; {}",
            self.setting,
            self.kind.what(),
            self.fix
        );
    }
}

impl fmt::Display for ConfigHazard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at {}: {}; {}",
            self.setting,
            self.node,
            self.kind.what(),
            self.fix
        )
    }
}

/// `Ok` unless one of `hazards` can give two holders at once; then an
/// [`ErrorKind::UnsafeConfig`] error that names each such hazard (the others do not
/// count: see [`HazardKind::can_give_two_holders`]).
///
/// ```no_run
/// # async fn demo() -> fencelock::Result<()> {
/// let redis = fencelock::backend::Redis::connect("redis://127.0.0.1:6379/0").await?;
/// fencelock::backend::refuse_config_hazards(&redis.config_hazards())?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`ErrorKind::UnsafeConfig`], as above.
pub fn refuse_config_hazards(hazards: &[ConfigHazard]) -> Result<()> {
    let unsafe_: Vec<String> = hazards
        .iter()
        .filter(|h| h.can_give_two_holders())
        .map(ToString::to_string)
        .collect();
    if unsafe_.is_empty() {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::UnsafeConfig,
        format!(
            "the store is configured so that it can drop a held lock: {}",
            unsafe_.join("; ")
        ),
    ))
}

#[cfg_attr(not(any(feature = "redis", feature = "memcached")), allow(dead_code))]
/// Logs each of `hazards` once and returns them.
pub(crate) fn found(hazards: Vec<ConfigHazard>) -> Vec<ConfigHazard> {
    for hazard in &hazards {
        hazard.warn();
    }
    hazards
}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
/// The hazards in the fields of Redis `INFO memory` and `INFO persistence` (`text`: the
/// replies, `field:value` lines) of `node`.
pub(crate) fn redis_info(node: &str, text: &str) -> Vec<ConfigHazard> {
    let field = |name: &str| {
        text.lines()
            .find_map(|line| line.trim_end().strip_prefix(name)?.strip_prefix(':'))
    };
    let mut out = Vec::new();
    let maxmemory = field("maxmemory").and_then(|v| v.parse::<u64>().ok());
    let policy = field("maxmemory_policy").unwrap_or("noeviction");
    // maxmemory 0: no limit, nothing is evicted whatever the policy.
    if maxmemory.is_some_and(|m| m > 0) {
        let kind = if policy.starts_with("allkeys-") {
            Some(HazardKind::EvictsLocksAndFences)
        } else if policy.starts_with("volatile-") {
            Some(HazardKind::EvictsLocks)
        } else {
            None
        };
        if let Some(kind) = kind {
            out.push(ConfigHazard::new(
                kind,
                node,
                format!(
                    "maxmemory:{} maxmemory_policy:{policy}",
                    maxmemory.unwrap_or(0)
                ),
                "set maxmemory-policy noeviction (or maxmemory 0) on the servers of locks",
            ));
        }
    }
    if field("aof_enabled") == Some("0") {
        out.push(ConfigHazard::new(
            HazardKind::FencesNotDurable,
            node,
            "aof_enabled:0",
            "run Redis with appendonly yes (and appendfsync always) if fences must survive \
             a restart",
        ));
    }
    out
}

#[cfg_attr(not(feature = "memcached"), allow(dead_code))]
/// The hazards in memcached's `stats settings` (`STAT <name> <value>` lines) of `node`.
pub(crate) fn memcached_settings(node: &str, text: &str) -> Vec<ConfigHazard> {
    let evictions = text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some("STAT") && words.next() == Some("evictions"))
            .then(|| words.next().unwrap_or_default().to_owned())
    });
    match evictions.as_deref() {
        Some("off") => Vec::new(),
        // `on`, or a server that does not say: memcached evicts by default.
        other => vec![ConfigHazard::new(
            HazardKind::EvictsLocksAndFences,
            node,
            format!("evictions {}", other.unwrap_or("(not reported)")),
            "start memcached with -M (no evictions: a full cache refuses new items instead)",
        )],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_policies() {
        let info = |m: u64, p: &str, aof: u8| {
            format!(
                "# Memory\r\nused_memory:1\r\nmaxmemory:{m}\r\nmaxmemory_human:1M\r\n\
                 maxmemory_policy:{p}\r\n# Persistence\r\naof_enabled:{aof}\r\n"
            )
        };
        let kinds = |text: &str| -> Vec<HazardKind> {
            redis_info("n", text)
                .iter()
                .map(ConfigHazard::kind)
                .collect()
        };
        assert_eq!(kinds(&info(0, "allkeys-lru", 1)), []);
        assert_eq!(kinds(&info(1, "noeviction", 1)), []);
        for p in ["allkeys-lru", "allkeys-lfu", "allkeys-random"] {
            assert_eq!(kinds(&info(1, p, 1)), [HazardKind::EvictsLocksAndFences]);
        }
        for p in [
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
        ] {
            assert_eq!(kinds(&info(1 << 20, p, 1)), [HazardKind::EvictsLocks]);
        }
        assert_eq!(
            kinds(&info(1, "allkeys-lru", 0)),
            [
                HazardKind::EvictsLocksAndFences,
                HazardKind::FencesNotDurable
            ]
        );
        // `maxmemory_human` or `maxmemory_policy` is not `maxmemory`.
        assert_eq!(kinds("maxmemory_policy:allkeys-lru\r\n"), []);
        assert_eq!(kinds(""), []);
    }

    #[test]
    fn memcached_evictions() {
        let text = "STAT maxbytes 1048576\r\nSTAT evictions on\r\nEND\r\n";
        assert_eq!(
            memcached_settings("n", text)[0].kind(),
            HazardKind::EvictsLocksAndFences
        );
        assert!(memcached_settings("n", "STAT evictions off\r\nEND\r\n").is_empty());
        assert_eq!(memcached_settings("n", "END\r\n").len(), 1);
    }

    #[test]
    fn refusal_names_only_two_holder_hazards() {
        let durable = ConfigHazard::new(HazardKind::FencesNotDurable, "a:1", "aof_enabled:0", "x");
        assert!(refuse_config_hazards(std::slice::from_ref(&durable)).is_ok());
        let evicts = ConfigHazard::new(
            HazardKind::EvictsLocks,
            "a:1",
            "maxmemory:1 maxmemory_policy:volatile-lru",
            "y",
        );
        let err = refuse_config_hazards(&[durable, evicts]).expect_err("refused");
        assert_eq!(err.kind(), ErrorKind::UnsafeConfig);
        assert!(err.to_string().contains("volatile-lru"), "{err}");
        assert!(!err.to_string().contains("aof_enabled"), "{err}");
    }
}
