//! Conformance behaviours of leader election ([`fencelock::Election`]). Each panics if the
//! backend misbehaves.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock::raw::{RawElection, RawLock};
use fencelock::{Election, ErrorKind, Leader, LeaderChange, MAX_VALUE_LEN};
use tokio::time::{Instant, sleep, timeout};

use crate::conformance::{Target, dies_after, unique};

/// An election on a new client of `target`.
async fn election<T: Target>(target: &T, name: &str, ttl: Duration) -> Election<T::Backend>
where
    T::Backend: RawElection,
{
    Election::builder(target.client().await, name)
        .ttl(ttl)
        .build()
        .expect("valid election")
}

/// Many candidates, each on its own client, lead in turn: never two leaders at once,
/// every candidate leads every time it campaigns, and terms strictly increase in the
/// order the leaderships happened.
pub async fn election_one_leader_at_a_time<T: Target>(target: &T)
where
    T::Backend: RawElection,
{
    let name = unique("elect-one");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let terms = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for c in 0..6 {
        let election = election(target, &name, target.ttl(Duration::from_secs(10))).await;
        let (inside, most, terms) = (Arc::clone(&inside), Arc::clone(&most), Arc::clone(&terms));
        tasks.push(tokio::spawn(async move {
            for round in 0..3 {
                let leadership = election
                    .campaign(format!("candidate-{c}-{round}"))
                    .await
                    .expect("campaign");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                terms.lock().expect("terms").push(leadership.term().get());
                sleep(Duration::from_millis(5)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                leadership.resign().await.expect("resign");
            }
        }));
    }
    for t in tasks {
        timeout(Duration::from_secs(120), t)
            .await
            .expect("every candidate leads in time")
            .expect("candidate task");
    }
    assert_eq!(most.load(Ordering::SeqCst), 1, "two leaders at once");
    let terms = terms.lock().expect("terms").clone();
    assert_eq!(terms.len(), 18);
    assert!(
        terms.windows(2).all(|w| w[0] < w[1]),
        "terms must strictly increase in leadership order: {terms:?}"
    );
}

/// `leader()` says nobody before a campaign, the leader's value and term while it leads,
/// nobody after it resigns; bad input is a typed error.
pub async fn election_leader_reports_term_and_value<T: Target>(target: &T)
where
    T::Backend: RawElection,
{
    let name = unique("elect-leader");
    let a = election(target, &name, target.ttl(Duration::from_secs(10))).await;
    let other = election(target, &name, target.ttl(Duration::from_secs(10))).await;
    assert_eq!(other.leader().await.expect("read"), None);
    let leadership = a.campaign("10.0.0.1:8080").await.expect("campaign");
    let seen = other.leader().await.expect("read").expect("a leader");
    assert_eq!(seen.term, leadership.term());
    assert_eq!(seen.value.as_deref(), Some("10.0.0.1:8080"));
    assert!(
        other.try_campaign("second").await.expect("try").is_none(),
        "a second leader while the first leads"
    );
    leadership.resign().await.expect("resign");
    assert_eq!(other.leader().await.expect("read"), None);

    // A value with newlines and non-ASCII text comes back as it was.
    let odd = "line one\nline two: ünïcödé\n";
    let leadership = other.campaign(odd).await.expect("campaign");
    let seen = a.leader().await.expect("read").expect("a leader");
    assert_eq!(seen.value.as_deref(), Some(odd));
    assert!(seen.term.get() > 0);
    leadership.resign().await.expect("resign");

    let too_long = "x".repeat(MAX_VALUE_LEN + 1);
    let err = a.campaign(too_long).await.expect_err("over-long value");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_eq!(
        a.leader().await.expect("read"),
        None,
        "a refused campaign led"
    );
    let err = Election::new(target.client().await, "").expect_err("empty name");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

/// A resign wakes the next candidate at once: it leads long before the lease could have
/// run out.
pub async fn election_resign_hands_over<T: Target>(target: &T)
where
    T::Backend: RawElection,
{
    let name = unique("elect-resign");
    // A lease long enough that only a hand-over can let the standby lead within half of
    // it: the bound tells the mechanism apart (no speed is measured).
    let ttl = target.ttl(Duration::from_secs(60));
    let a = election(target, &name, ttl).await;
    let b = election(target, &name, ttl).await;
    let first = a.campaign("a").await.expect("campaign");
    let waiting = tokio::spawn(async move { b.campaign("b").await.expect("campaign") });
    sleep(Duration::from_millis(300)).await;
    let first_term = first.term();
    first.resign().await.expect("resign");
    let second = timeout(ttl / 2, waiting)
        .await
        .expect("the standby leads long before the resigned lease could run out")
        .expect("task");
    assert!(second.term() > first_term);
    second.resign().await.expect("resign");
}

/// A leader whose process dies (its runtime is shut down: no resign, no renewal) is
/// replaced within its lease plus a margin.
pub async fn election_killed_leader_is_replaced_within_ttl<T: Target>(target: &T)
where
    T::Backend: RawElection,
{
    let name = unique("elect-killed");
    let ttl = target.ttl(Duration::from_millis(800));
    let a = election(target, &name, ttl).await;
    let held = dies_after(async move {
        let l = a.campaign("doomed").await.expect("campaign");
        let term = l.term();
        std::mem::forget(l); // never resigned
        term
    });
    let died = Instant::now();
    let b = election(target, &name, ttl).await;
    let next = timeout(ttl * 10, b.campaign("heir"))
        .await
        .expect("a dead leader's lease must run out")
        .expect("campaign");
    let waited = died.elapsed();
    assert!(
        waited <= ttl + Duration::from_secs(2),
        "replaced only after {waited:?} (lease {ttl:?})"
    );
    assert!(next.term() > held);
    let seen = b.leader().await.expect("read").expect("leader");
    assert_eq!(seen.value.as_deref(), Some("heir"));
    next.resign().await.expect("resign");
}

/// Waits for an observer's next leader, at most 10 s, passing over vacancies (a
/// resignation handed straight on to a queued candidate may be reported as a vacancy
/// just before the next leader).
async fn next_change<B: RawElection>(observer: &mut fencelock::Observer<B>) -> Leader {
    timeout(Duration::from_secs(10), async {
        loop {
            match observer.next().await.expect("observe") {
                LeaderChange::Leader(leader) => break leader,
                LeaderChange::Vacant(_) => {}
            }
        }
    })
    .await
    .expect("the observer sees the change")
}

/// Two observers (sharing one client) see every change — a new leader, a proclaimed
/// value — once each and in order, and nothing more.
pub async fn election_observe_sees_every_change_in_order<T: Target>(target: &T)
where
    T::Backend: RawElection,
{
    let name = unique("elect-observe");
    let ttl = target.ttl(Duration::from_secs(10));
    let watcher = election(target, &name, ttl).await;
    let mut one = watcher.observe();
    let mut two = watcher.observe();
    let a = election(target, &name, ttl).await;
    let b = election(target, &name, ttl).await;

    let mut first = a.campaign("a1").await.expect("campaign");
    let t1 = first.term();
    let mut expected = vec![(t1, "a1")];
    for obs in [&mut one, &mut two] {
        let c = next_change(obs).await;
        assert_eq!((c.term, c.value.as_deref()), (t1, Some("a1")));
    }
    first.proclaim("a2").await.expect("proclaim");
    assert_eq!(first.value(), "a2");
    expected.push((t1, "a2"));
    let heir = tokio::spawn(async move { b.campaign("b1").await.expect("campaign") });
    let mut seen = [Vec::new(), Vec::new()];
    for (i, obs) in [&mut one, &mut two].into_iter().enumerate() {
        let c = next_change(obs).await;
        seen[i].push((c.term, c.value.clone().expect("announced")));
    }
    sleep(Duration::from_millis(200)).await; // b queues
    first.resign().await.expect("resign");
    let mut second = heir.await.expect("task");
    let t2 = second.term();
    expected.push((t2, "b1"));
    for (i, obs) in [&mut one, &mut two].into_iter().enumerate() {
        let c = next_change(obs).await;
        seen[i].push((c.term, c.value.clone().expect("announced")));
    }
    second.proclaim("b2").await.expect("proclaim");
    expected.push((t2, "b2"));
    for (i, obs) in [&mut one, &mut two].into_iter().enumerate() {
        let c = next_change(obs).await;
        seen[i].push((c.term, c.value.clone().expect("announced")));
    }
    let expected: Vec<_> = expected[1..]
        .iter()
        .map(|(t, v)| (*t, (*v).to_owned()))
        .collect();
    for s in &seen {
        assert_eq!(s, &expected, "every change, once, in order");
    }
    // Nothing more: no change is reported twice.
    assert!(
        timeout(Duration::from_millis(400), one.next())
            .await
            .is_err(),
        "an observer reported a change that did not happen"
    );
    // A late observer starts from the current leader.
    let mut late = watcher.observe();
    let c = next_change(&mut late).await;
    assert_eq!((c.term, c.value.as_deref()), (t2, Some("b2")));
    second.resign().await.expect("resign");
}

/// A campaign that gave up (timed out, or its future was dropped) leaves no place in the
/// queue: once the leader resigns, a newcomer leads at its first attempt.
pub async fn election_cancelled_campaign_leaves_nothing<T: Target>(target: &T)
where
    T::Backend: RawElection,
{
    let name = unique("elect-cancel");
    let ttl = target.ttl(Duration::from_secs(10));
    let a = election(target, &name, ttl).await;
    let b = election(target, &name, ttl).await;
    let c = election(target, &name, ttl).await;
    let leader = a.campaign("a").await.expect("campaign");
    assert!(
        b.campaign_for(Duration::from_millis(300), "b")
            .await
            .expect("campaign")
            .is_none()
    );
    assert!(
        timeout(Duration::from_millis(300), c.campaign("c"))
            .await
            .is_err(),
        "nobody else may lead"
    );
    // The withdrawals run in the background: they land within a bound (a loaded machine
    // once took more than 200 ms on ZooKeeper).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let state = a.lock().state().await.expect("inspect");
        if matches!(state.queued, None | Some(0)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "cancelled campaigns left queue entries: {state:?}"
        );
        sleep(Duration::from_millis(50)).await;
    }
    leader.resign().await.expect("resign");
    let d = election(target, &name, ttl).await;
    let next = d
        .try_campaign("d")
        .await
        .expect("campaign")
        .expect("nobody waits ahead of a newcomer");
    next.resign().await.expect("resign");
}

/// A leader deposed behind its back (an operator's force-unlock, then a new leader) can no
/// longer announce anything: its proclaim is `LockLost` and the record keeps the new
/// leader's value; its `lost()` fires.
pub async fn election_deposed_leader_is_refused<T: Target>(target: &T)
where
    T::Backend: RawElection,
{
    let name = unique("elect-deposed");
    let ttl = target.ttl(Duration::from_secs(3));
    let a = election(target, &name, ttl).await;
    let b = election(target, &name, ttl).await;
    let mut old = a.campaign("old").await.expect("campaign");
    assert!(b.lock().force_unlock().await.expect("force unlock"));
    let new = timeout(Duration::from_secs(10), b.campaign("new"))
        .await
        .expect("leads")
        .expect("campaign");
    assert!(new.term() > old.term());
    let err = old.proclaim("stale").await.expect_err("a deposed leader");
    assert_eq!(err.kind(), ErrorKind::LockLost);
    let seen = a.leader().await.expect("read").expect("leader");
    assert_eq!(
        (seen.term, seen.value.as_deref()),
        (new.term(), Some("new"))
    );
    timeout(ttl * 2, old.lost())
        .await
        .expect("the deposed leader's lost() fires");
    assert_eq!(
        old.resign().await.expect_err("resign").kind(),
        ErrorKind::LockLost
    );
    new.resign().await.expect("resign");
}

/// Where the store queues waiters, candidates lead in the order they arrived.
pub async fn election_candidates_lead_in_arrival_order<T: Target>(target: &T)
where
    T::Backend: RawElection,
{
    if !<T::Backend as RawLock>::QUEUES_WAITERS {
        return; // no queue: the store cannot be fair (documented)
    }
    let name = unique("elect-fifo");
    let ttl = target.ttl(Duration::from_secs(10));
    let first = election(target, &name, ttl)
        .await
        .campaign("first")
        .await
        .expect("campaign");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for c in 0..4 {
        let e = election(target, &name, ttl).await;
        let order = Arc::clone(&order);
        tasks.push(tokio::spawn(async move {
            let l = e.campaign(format!("c{c}")).await.expect("campaign");
            order.lock().expect("order").push(c);
            sleep(Duration::from_millis(20)).await;
            l.resign().await.expect("resign");
        }));
        sleep(Duration::from_millis(250)).await; // arrive one after the other
    }
    first.resign().await.expect("resign");
    for t in tasks {
        timeout(Duration::from_secs(60), t)
            .await
            .expect("in time")
            .expect("task");
    }
    assert_eq!(*order.lock().expect("order"), vec![0, 1, 2, 3]);
}

/// A record left with a term higher than any the store mints now (its fence counter was
/// reset, as by a restart without persistence, while the record survived) does not stop
/// the election: the next candidate leads and is reported, by `leader()` and observers.
/// And an announcement by a token that does not hold the lock writes nothing.
pub async fn election_goes_on_after_a_fence_counter_reset<T: Target>(target: &T)
where
    T::Backend: RawElection,
{
    let name = unique("elect-reset");
    let ttl = target.ttl(Duration::from_secs(10));
    let a = election(target, &name, ttl).await;
    let b = election(target, &name, ttl).await;
    let mut observer = b.observe();
    let first = a.campaign("a").await.expect("campaign");
    let ghost_term = first.term().get() + 1_000_000;
    let backend = a.lock().backend();
    let keys = a.lock().keys();
    let stranger = fencelock::Token::random().expect("rng");
    assert!(
        !backend
            .publish(
                keys,
                &stranger,
                ghost_term,
                &format!("{}\nforged", stranger.as_str())
            )
            .await
            .expect("publish"),
        "a token that does not hold the lock wrote the record"
    );
    let ghost = format!("{}\nghost", first.token().as_str());
    assert!(
        backend
            .publish(keys, first.token(), ghost_term, &ghost)
            .await
            .expect("publish"),
        "the holder's write was refused"
    );
    let seen = b.leader().await.expect("read").expect("leader");
    assert_eq!(seen.term.get(), ghost_term);
    assert_eq!(seen.value.as_deref(), Some("ghost"));
    let c = next_change(&mut observer).await;
    assert_eq!(c.term.get(), ghost_term);
    first.resign().await.expect("resign");
    let second = timeout(Duration::from_secs(10), b.campaign("b"))
        .await
        .expect("leads")
        .expect("a smaller term than the recorded one still leads");
    assert!(second.term().get() < ghost_term);
    let seen = a.leader().await.expect("read").expect("leader");
    assert_eq!(
        (seen.term, seen.value.as_deref()),
        (second.term(), Some("b"))
    );
    let c = next_change(&mut observer).await;
    assert_eq!((c.term, c.value.as_deref()), (second.term(), Some("b")));
    second.resign().await.expect("resign");
}
