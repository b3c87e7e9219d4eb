//! Exit codes: documented constants, one per outcome a script must tell apart.
//!
//! `dlock run` otherwise exits with its child's status (128 + N if a signal N killed it),
//! so these codes sit where child programs rarely go (the BSD `sysexits.h` range).

use std::process::ExitCode;

use fencelock::ErrorKind;

/// Success (or, for `dlock run`, the child's own status).
pub(crate) const SUCCESS: u8 = 0;
/// Bad usage: unknown flag, bad duration, malformed URL, unknown backend (`EX_USAGE`).
pub(crate) const USAGE: u8 = 64;
/// The store could not be reached or failed (`EX_UNAVAILABLE`).
pub(crate) const UNAVAILABLE: u8 = 69;
/// The lock is held: `--no-wait`, or `--wait` ran out (`EX_TEMPFAIL`; `--conflict-exit-code`
/// changes it).
pub(crate) const CONFLICT: u8 = 75;
/// The lock was lost while held: the child was terminated.
pub(crate) const LOST: u8 = 76;
/// `release` or `extend` with a token that does not hold the lock, which another token
/// holds: a mistyped token, or the lease ran out and another holder took the lock
/// (`EX_NOPERM`).
pub(crate) const NOT_OURS: u8 = 77;
/// Nobody holds the lock: `force-unlock`, or `release` / `extend` (under any token) found
/// nothing to act on; for a token that did hold it, its lease ran out or it was
/// force-unlocked. Past the `sysexits.h` range, as no code there means it.
pub(crate) const NOT_HELD: u8 = 79;
/// The command could not be executed (as in POSIX shells).
pub(crate) const CANNOT_EXECUTE: u8 = 126;
/// The command was not found (as in POSIX shells).
pub(crate) const NOT_FOUND: u8 = 127;

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
            // A semaphore's count other than the stored one, a kind the store does not
            // offer: the command line's to change.
            ErrorKind::InvalidArgument | ErrorKind::PermitsMismatch | ErrorKind::Unsupported => {
                USAGE
            }
            ErrorKind::LockLost => LOST,
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
            // One line, whatever the message quotes (a store's reply, a name): no control
            // character reaches the terminal.
            let line: String = failure
                .message
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            eprintln!("dlock: {line}");
            ExitCode::from(failure.code)
        }
    }
}
