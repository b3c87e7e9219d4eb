//! dlock-sim's tests: determinism, every primitive exercised, and the bugs the
//! simulation found.

mod determinism;
mod family;
mod regressions;
