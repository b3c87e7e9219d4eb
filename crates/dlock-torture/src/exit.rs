//! Exit codes of `dlock-torture` (and so of `dlock torture` and `dlock demo`, which run
//! it): the `dlock` command's codes for the outcomes the harness can have.

use std::process::ExitCode;

use fencelock::ErrorKind;

/// Success: every kind showed what it must.
pub(crate) const SUCCESS: u8 = 0;
/// `dlock torture` found an unexpected result (a violation where none is allowed, or a
/// control that was not caught).
pub(crate) const TORTURE_FAILED: u8 = 1;
/// Bad usage: unknown flag, kind or fault, bad duration, malformed URL (`EX_USAGE`).
pub(crate) const USAGE: u8 = 64;
/// A store could not be started, reached, or failed (`EX_UNAVAILABLE`).
pub(crate) const UNAVAILABLE: u8 = 69;
/// A worker process could not be started.
pub(crate) const CANNOT_EXECUTE: u8 = 126;

/// A failure that ends the program with a code and a one-line message.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }

    pub(crate) fn usage(message: impl Into<String>) -> Failure {
        Failure::new(USAGE, message)
    }
}

impl From<fencelock::Error> for Failure {
    fn from(err: fencelock::Error) -> Failure {
        let code = match err.kind() {
            ErrorKind::InvalidArgument => USAGE,
            _ => UNAVAILABLE,
        };
        Failure::new(code, err.to_string())
    }
}

/// What the program ends with.
pub(crate) fn finish(result: Result<u8, Failure>) -> ExitCode {
    match result {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            eprintln!("dlock: {}", failure.message.replace('\n', " "));
            ExitCode::from(failure.code)
        }
    }
}

/// `url` with any password replaced by `***`, for everything the harness prints or
/// writes (its summary, report.json, errors).
pub(crate) fn redact(url: &str) -> String {
    fencelock::backend::redact_url(url)
}
