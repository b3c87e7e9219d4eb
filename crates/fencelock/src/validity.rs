//! Lease validity arithmetic, on the monotonic clock only.
//!
//! A lease granted for `ttl` is counted from the moment the request was *sent*, not from
//! when the reply arrived, and shortened by a drift allowance for clock-rate differences
//! between client and server: `valid_until = sent + ttl − drift(ttl)`. The wall clock is
//! never consulted, so a jump of the client's clock changes nothing.

use std::time::{Duration, Instant};

/// The drift allowance for a lease of `ttl`: 1 % of it plus 2 ms (the RedLock formula).
pub fn drift(ttl: Duration) -> Duration {
    Drift::DEFAULT.of(ttl)
}

/// A clock-drift allowance: `factor × ttl + constant`, subtracted from every lease's
/// validity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Drift {
    /// Fraction of the ttl (0.01 = 1 %).
    pub factor: f64,
    /// Added on top (for timer granularity).
    pub constant: Duration,
}

impl Drift {
    /// 1 % of the ttl plus 2 ms.
    pub const DEFAULT: Drift = Drift {
        factor: 0.01,
        constant: Duration::from_millis(2),
    };

    /// The allowance for a lease of `ttl` (a factor outside 0..1 counts as 0 or 1).
    pub fn of(&self, ttl: Duration) -> Duration {
        if crate::simulation::planted(crate::simulation::Plant::NoDriftAllowance) {
            return Duration::ZERO; // planted for the simulator: no allowance at all
        }
        let factor = if self.factor.is_finite() {
            self.factor.clamp(0.0, 1.0)
        } else {
            0.0
        };
        ttl.mul_f64(factor) + self.constant
    }

    /// The instant up to which a lease of `ttl` requested at `sent` can be relied on.
    pub fn valid_until(&self, sent: Instant, ttl: Duration) -> Instant {
        sent + ttl.saturating_sub(self.of(ttl))
    }
}

/// The instant up to which a lease of `ttl` requested at `sent` can be relied on.
pub fn valid_until(sent: Instant, ttl: Duration) -> Instant {
    Drift::DEFAULT.valid_until(sent, ttl)
}

/// How much of a lease of `ttl` requested at `sent` is left at `now` (zero once run out).
pub fn remaining(sent: Instant, ttl: Duration, now: Instant) -> Duration {
    valid_until(sent, ttl).saturating_duration_since(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn remaining_never_underflows_nor_exceeds_ttl(
            ttl_ms in 0u64..=86_400_000,
            elapsed_ms in 0u64..=200_000_000,
        ) {
            let sent = Instant::now();
            let ttl = Duration::from_millis(ttl_ms);
            let now = sent + Duration::from_millis(elapsed_ms);
            let left = remaining(sent, ttl, now);
            prop_assert!(left <= ttl);
            prop_assert!(left <= ttl.saturating_sub(Duration::from_millis(elapsed_ms)));
            if elapsed_ms >= ttl_ms {
                prop_assert_eq!(left, Duration::ZERO);
            }
        }

        #[test]
        fn drift_is_positive_and_grows_with_ttl(a in 0u64..=86_400_000, b in 0u64..=86_400_000) {
            let (lo, hi) = (a.min(b), a.max(b));
            prop_assert!(drift(Duration::from_millis(lo)) >= Duration::from_millis(2));
            prop_assert!(drift(Duration::from_millis(lo)) <= drift(Duration::from_millis(hi)));
        }
    }

    #[test]
    fn worked_example() {
        let sent = Instant::now();
        let ttl = Duration::from_secs(30);
        // 30 s − (300 ms + 2 ms) − 1 s elapsed
        assert_eq!(
            remaining(sent, ttl, sent + Duration::from_secs(1)),
            Duration::from_millis(28_698)
        );
    }
}
