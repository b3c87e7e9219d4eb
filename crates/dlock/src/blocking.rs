//! A blocking API: the same primitives and guards for synchronous code (in progress).
