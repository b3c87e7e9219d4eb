//! The command's side of the hostile-input generators (`dlock-hostile`, shared with the
//! library's tests): the schemes `--url` knows, and the check of a usage error. Hostile
//! input ends in a value or a typed failure, never a panic, and shows no secret.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::exit::{self, Failure};

/// Every scheme `--url` knows, and a few it does not.
pub(crate) const SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "redis+unix",
    "unix",
    "redis+sentinel",
    "redis+cluster",
    "redlock",
    "memcache",
    "memcached",
    "etcd",
    "postgres",
    "postgresql",
    "zk",
    "memory",
    "mysql",
    "http",
];

pub(crate) use dlock_hostile::{cases, hidden, url_with_password};

/// Any string; strings that start like a URL of a known scheme; printable ASCII after one.
pub(crate) fn any_url() -> impl Strategy<Value = String> {
    dlock_hostile::any_url(SCHEMES)
}

/// Checks that `failure` is a usage error that shows nothing of `secret`, in the line
/// printed or its `Debug`.
pub(crate) fn usage_without(failure: &Failure, secret: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(failure.code, exit::USAGE, "{}", failure.message);
    prop_assert!(!failure.message.is_empty());
    hidden(&failure.message, secret)?;
    hidden(&format!("{failure:?}"), secret)
}
