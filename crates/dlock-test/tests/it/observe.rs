//! Spans and metrics captured from real stores.
