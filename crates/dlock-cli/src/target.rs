//! From `--url` to a connected store.

use dlock::backend::{Memory, Redis};

use crate::args::Store;
use crate::exit::Failure;

/// A connected store of any supported kind.
pub(crate) enum Target {
    Redis(Redis),
    Memory(Memory),
}

/// Runs `$body` with `$b` bound to the concrete backend of `$target`.
macro_rules! with_backend {
    ($target:expr, |$b:ident| $body:expr) => {
        match $target {
            $crate::target::Target::Redis($b) => $body,
            $crate::target::Target::Memory($b) => $body,
        }
    };
}
pub(crate) use with_backend;

/// The URL schemes `--url` accepts.
const SCHEMES: &str = "redis://, rediss://, redis+unix://";

/// Connects to the store named by `--url` / `DLOCK_URL`. `memory://` (in-process) is
/// accepted only where `allow_memory` says so: a lock in one process's memory excludes
/// nobody else.
pub(crate) async fn connect(store: &Store, allow_memory: bool) -> Result<Target, Failure> {
    let Some(url) = store.url.as_deref().filter(|u| !u.is_empty()) else {
        return Err(Failure::usage(format!(
            "no store given: pass --url or set DLOCK_URL ({SCHEMES})"
        )));
    };
    let scheme = url.split_once("://").map(|(s, _)| s);
    match scheme {
        Some("redis" | "rediss" | "redis+unix" | "unix") => {
            Ok(Target::Redis(Redis::connect(url).await?))
        }
        Some("memory") if allow_memory => Ok(Target::Memory(Memory::new())),
        Some("memory") => Err(Failure::usage(
            "memory:// is in-process only and would exclude no other process; use redis://",
        )),
        Some(other) => Err(Failure::usage(format!(
            "unknown backend {other:?} in --url (supported: {SCHEMES})"
        ))),
        None => Err(Failure::usage(format!(
            "--url {url:?} is not a URL (expected {SCHEMES})"
        ))),
    }
}
