//! The blocking API under the conformance suite's core behaviours.
