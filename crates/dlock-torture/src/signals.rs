//! The signals that end a run cleanly (its servers and workers killed, nothing left).

use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::exit::{self, Failure};

/// SIGINT, SIGTERM and SIGHUP, installed once per run.
pub(crate) struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    pub(crate) fn install() -> Result<Signals, Failure> {
        let install = |kind| {
            signal(kind)
                .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("cannot handle signals: {e}")))
        };
        Ok(Signals {
            int: install(SignalKind::interrupt())?,
            term: install(SignalKind::terminate())?,
            hup: install(SignalKind::hangup())?,
        })
    }

    /// The number of the next signal received.
    pub(crate) async fn recv(&mut self) -> nix::sys::signal::Signal {
        use nix::sys::signal::Signal as S;
        tokio::select! {
            _ = self.int.recv() => S::SIGINT,
            _ = self.term.recv() => S::SIGTERM,
            _ = self.hup.recv() => S::SIGHUP,
        }
    }
}
