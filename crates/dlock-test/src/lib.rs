//! Test kit for dlock: real servers on loopback, and one conformance suite for every
//! backend.
//!
//! * [`server::RedisServer`] spawns `redis-server` (from `PATH`, or `$DLOCK_REDIS_SERVER`)
//!   on a free loopback port, can restart it empty, freeze (SIGSTOP) and thaw it, and kills
//!   it on drop.
//! * [`postgres::PostgresServer`] spawns a private PostgreSQL (Debian's `postgresql`
//!   package), as the `postgres` user when the tests run as root.
//! * [`conformance`] holds one function per behaviour, generic over a [`conformance::Target`].
//! * [`targets`] has the targets of the built-in backends.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod clock;
pub mod cluster;
pub mod conformance;
pub mod election;
pub mod family;
pub mod postgres;
pub mod proxy;
pub mod server;
pub mod targets;
pub mod zookeeper;
