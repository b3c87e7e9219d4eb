//! What dlock tells an operator: tracing spans and metrics (in progress).
