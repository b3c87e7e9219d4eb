//! The stores dlock runs on. Each implements the [`raw`](crate::raw) traits.

mod memory;
pub use memory::Memory;

#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redis")]
pub use self::redis::Redis;
