//! Liveness: the lock free within ttl + ε after a holder's crash, and no stretch without a
//! grant that no fault or crash explains (a stall).

use super::Input;
use super::holds::step_time;
use crate::model::Fault;
use crate::worker::Step;

/// Slack for liveness: a waiter's retry after the ttl.
pub(crate) const EPSILON_NS: u64 = 1_500_000_000;

/// How long after a holder's crash (or after a grant) the next grant is due: ttl + the
/// kind's slack + ε.
pub(crate) fn allowed(input: &Input<'_>) -> u64 {
    input.ttl_ns + input.reacquire_slack_ns + EPSILON_NS
}

/// After a holder was killed, someone else must get the lock within [`allowed`] (unless
/// the run ended first, or a server-side fault held everyone up: on etcd, a new leader
/// extends every lease by an election timeout). Returns each crash's reacquire time in
/// milliseconds and the number of crashes after which it came too late or never.
pub(crate) fn reacquire(input: &Input<'_>) -> (Vec<u64>, usize) {
    let mut reacquire_ms = Vec::new();
    let mut liveness_violations = 0;
    let allowed = allowed(input);
    for kill in input.kills.iter().filter(|k| k.was_holding) {
        let bound = kill.t + allowed;
        let held_up = input.windows.iter().any(|w| {
            matches!(
                w.fault,
                Fault::Freeze
                    | Fault::ClientPause
                    | Fault::Restart
                    | Fault::DelayedRestart
                    | Fault::LeaderRestart
                    | Fault::MemberRestart
                    | Fault::CrashRestart
                    | Fault::Failover
                    | Fault::ClockBack
            ) && w.start <= bound
                && w.end >= kill.t
        });
        let next = input
            .history
            .iter()
            .filter(|(w, s)| {
                *w != kill.worker && matches!(s, Step::Acquired { .. }) && step_time(s) > kill.t
            })
            .map(|(_, s)| step_time(s))
            .min();
        match next {
            Some(t) => {
                let delay = t - kill.t;
                reacquire_ms.push(delay / 1_000_000);
                if delay > allowed && !held_up {
                    liveness_violations += 1;
                }
            }
            None if input.end > bound && !held_up => liveness_violations += 1,
            None => {}
        }
    }
    (reacquire_ms, liveness_violations)
}

/// The stretches without any grant (write or read side) in which the lock was stuck, each
/// as the length in milliseconds of the whole gap between two grants (or from the last
/// grant to the workers' deadline). Every worker asks for the lock all the time, so after
/// a grant the next one is due within `allowed` (ttl + ε, as after a holder's crash) —
/// unless a fault or a crash was under way, or had ended less than `allowed` before: a
/// gap is a stall when some moment past its first `allowed` is covered by no
/// `[start, end + allowed]` of a fault window or a kill.
pub(crate) fn stalls(input: &Input<'_>, allowed: u64) -> Vec<u64> {
    let mut grants: Vec<u64> = input
        .history
        .iter()
        .filter(|(_, s)| matches!(s, Step::Acquired { .. } | Step::ReadAcquired { .. }))
        .map(|(_, s)| step_time(s))
        .collect();
    grants.sort_unstable();
    let mut excuses: Vec<(u64, u64)> = input
        .windows
        .iter()
        .map(|w| (w.start, w.end.max(w.start).saturating_add(allowed)))
        .chain(
            input
                .kills
                .iter()
                .map(|k| (k.t, k.t.saturating_add(allowed))),
        )
        .collect();
    excuses.sort_unstable();
    let ends = grants.iter().skip(1).copied().chain([input.until]);
    let mut out = Vec::new();
    for (&from, to) in grants.iter().zip(ends) {
        let (due, to) = (from.saturating_add(allowed), to.min(input.until));
        if due >= to {
            continue;
        }
        // How far from `due` the excuses cover without a hole.
        let mut covered = due;
        for &(start, end) in &excuses {
            if start > covered {
                break;
            }
            covered = covered.max(end);
        }
        if covered < to {
            out.push((to - from) / 1_000_000);
        }
    }
    out
}
