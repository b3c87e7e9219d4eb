//! dlock-sim's tests: determinism, the checkers' teeth, and the bugs the simulation found.

mod determinism;
mod regressions;
