//! Hooks for the deterministic simulator (the workspace's `dlock-sim`): a seeded source
//! of the randomness the library draws (tokens, back-off jitter) and planted bugs that
//! the simulator must catch.
//!
//! Public only with the `simulation` feature, which is for the test kit: **never enable
//! it in a program that protects anything**. Without the feature nothing here is
//! reachable and every check below compiles to `false`.
//!
//! Both settings are per thread: the simulator runs each seed on a current-thread tokio
//! runtime (paused clock), so the thread that runs it is the only one that draws.

#[cfg(feature = "simulation")]
use std::cell::Cell;

#[cfg(feature = "simulation")]
thread_local! {
    /// The seeded generator's state, when the thread draws from one.
    static RNG: Cell<Option<u64>> = const { Cell::new(None) };
    /// The bug planted on this thread, if any.
    static PLANT: Cell<Option<Plant>> = const { Cell::new(None) };
}

/// Makes this thread's tokens and jitter come from a generator seeded with `seed`
/// (`None`: back to the OS generator). One seed gives one sequence of tokens.
#[cfg(feature = "simulation")]
pub fn seed_thread_rng(seed: Option<u64>) {
    RNG.with(|r| r.set(seed));
}

/// SplitMix64: the next value of the seeded sequence.
#[cfg(feature = "simulation")]
fn next(state: &Cell<Option<u64>>) -> Option<u64> {
    let s = state.get()?.wrapping_add(0x9e37_79b9_7f4a_7c15);
    state.set(Some(s));
    let mut z = s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    Some(z ^ (z >> 31))
}

/// Fills `bytes` from the thread's seeded generator; `false` (untouched) when the thread
/// has none, and always without the `simulation` feature.
pub(crate) fn fill(bytes: &mut [u8]) -> bool {
    #[cfg(feature = "simulation")]
    {
        RNG.with(|r| {
            if r.get().is_none() {
                return false;
            }
            for chunk in bytes.chunks_mut(8) {
                let v = next(r).unwrap_or_default().to_le_bytes();
                chunk.copy_from_slice(&v[..chunk.len()]);
            }
            true
        })
    }
    #[cfg(not(feature = "simulation"))]
    {
        let _ = bytes;
        false
    }
}

/// A bug the simulator plants in the library to show that its checkers catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
// Without the feature only the library's checks name it, and they are always false.
#[cfg_attr(not(feature = "simulation"), allow(unreachable_pub))]
pub enum Plant {
    /// A lease's validity is counted from the reply's arrival instead of the request's
    /// sending: every grant (an attempt's, a hand-over's, a read-write downgrade's),
    /// every `extend` and every watchdog renewal, of every primitive.
    ValidityFromReply,
    /// No clock-drift allowance: a lease is relied on for its whole ttl (the allowance
    /// is zero wherever it is applied, renewal periods included).
    NoDriftAllowance,
    /// An acquire whose request may have been granted does not give the grant back when
    /// it is cancelled mid-flight, nor when it fails with its outcome unknown (its reply
    /// lost), nor when its wait ends with such an attempt unsettled.
    CancelledGrantKept,
    /// A waiter that consumed a release's wake-up and then left does not pass it on to
    /// the next local waiter; and the in-process store does not give a fair lock's turn
    /// on to the next in line when the head of its queue leaves.
    WakeNotPassedOn,
    /// A renewal batch whose reply is shorter than the batch counts the missing
    /// renewals as done (their leases extended from the batch's sending), where the
    /// library otherwise counts every renewal of the batch as failed.
    ShortBatchAllRenewed,
}

#[cfg(feature = "simulation")]
impl Plant {
    /// Every plant, in the order of their names' documentation.
    pub const ALL: [Plant; 5] = [
        Plant::ValidityFromReply,
        Plant::NoDriftAllowance,
        Plant::CancelledGrantKept,
        Plant::WakeNotPassedOn,
        Plant::ShortBatchAllRenewed,
    ];
}

/// Plants `plant` on this thread (`None`: the library as written).
#[cfg(feature = "simulation")]
pub fn set_plant(plant: Option<Plant>) {
    PLANT.with(|p| p.set(plant));
}

/// The bug planted on this thread, if any.
#[cfg(feature = "simulation")]
pub fn plant() -> Option<Plant> {
    PLANT.with(Cell::get)
}

/// Whether `plant` is planted on this thread (always `false` without the feature).
#[inline]
pub(crate) fn planted(plant: Plant) -> bool {
    #[cfg(feature = "simulation")]
    {
        PLANT.with(|p| p.get() == Some(plant))
    }
    #[cfg(not(feature = "simulation"))]
    {
        let _ = plant;
        false
    }
}

#[cfg(all(test, feature = "simulation"))]
mod tests {
    use super::*;

    #[test]
    fn one_seed_gives_one_sequence_of_tokens() {
        let draw = |seed| {
            seed_thread_rng(Some(seed));
            let t: Vec<String> = (0..3)
                .map(|_| crate::Token::random().map(|t| t.as_str().to_owned()))
                .collect::<crate::Result<_>>()
                .unwrap_or_default();
            seed_thread_rng(None);
            t
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        assert_eq!(draw(7).len(), 3);
        // Without a seed, the OS generator: two draws differ.
        let a = crate::Token::random().map(|t| t.as_str().to_owned()).ok();
        let b = crate::Token::random().map(|t| t.as_str().to_owned()).ok();
        assert_ne!(a, b);
    }
}

/// Each plant changes what the library does, and only while it is set: the same scenario
/// is run without and with it, on the in-process store behind a network whose delays and
/// losses the test sets.
#[cfg(all(test, feature = "simulation"))]
#[path = "simulation/plants_tests.rs"]
mod plants;
