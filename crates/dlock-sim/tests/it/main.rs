//! dlock-sim's integration tests.

mod family;
