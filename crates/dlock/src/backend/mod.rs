//! The stores dlock runs on. Each implements the [`raw`](crate::raw) traits.

mod memory;
mod quorum;
pub use memory::Memory;
#[cfg(any(feature = "etcd", feature = "postgres", feature = "zookeeper"))]
pub(crate) use memory::glob_match;
pub use quorum::{DEFAULT_NODE_TIMEOUT_FRACTION, Quorum, QuorumBuilder};

#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redis")]
pub use self::redis::Redis;

#[cfg(feature = "memcached")]
pub mod memcached;
#[cfg(feature = "memcached")]
pub use self::memcached::Memcached;

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "etcd")]
pub use self::etcd::Etcd;

#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "postgres")]
pub use self::postgres::{PgAdvisory, Postgres};

#[cfg(feature = "zookeeper")]
pub mod zookeeper;
#[cfg(feature = "zookeeper")]
pub use self::zookeeper::ZooKeeper;
