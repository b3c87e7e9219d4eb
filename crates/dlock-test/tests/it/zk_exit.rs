//! ZooKeeper: the release of a hold whose session expired while the client was cut off
//! (or paused). The ensemble deleted the hold's node with its session, so the release
//! reports the lock lost at once — not a store failure tried again in the background, as
//! if the node might still hold the lock.

use std::time::Duration;

use dlock_test::conformance::unique;
use dlock_test::proxy::{Fault, Proxy};
use fencelock::backend::ZooKeeper;
use fencelock::{ErrorKind, Lock};
use tokio::time::{sleep, timeout};

/// Connects to `url`, trying again while a shared server is still starting.
async fn zk_connect(url: &str) -> ZooKeeper {
    let mut last = None;
    for _ in 0..50 {
        match ZooKeeper::connect(url).await {
            Ok(zk) => return zk,
            Err(e) => last = Some(e),
        }
        sleep(Duration::from_millis(100)).await;
    }
    panic!("connect to {url}: {last:?}");
}

/// A holder cut off past its session (the next holder is granted meanwhile), its link
/// then healed: its release answers `LockLost`, within a liveness bound. Tried a few
/// times (bounded): the release races the client's own finding that its session expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_the_session_expired_reports_the_lock_lost() {
    let server = dlock_test::zookeeper::ZooKeeper::shared();
    let chroot = format!("/{}", unique("zk-exit"));
    let other = zk_connect(&server.url(&chroot, "?session_timeout=2s")).await;
    for round in 0..3 {
        let proxy = Proxy::start(server.members[0].addr().parse().expect("addr"))
            .await
            .expect("proxy");
        let holder = zk_connect(&format!("zk://{}{chroot}?session_timeout=2s", proxy.addr())).await;
        let name = unique("expired");
        let ttl = Duration::from_secs(2);
        let guard = Lock::builder(holder, &name)
            .ttl(ttl)
            .build()
            .expect("valid")
            .try_lock()
            .await
            .expect("store")
            .expect("free");
        proxy.set_fault(Fault::Blackhole);
        // Granted once the ensemble expired the holder's session.
        let next = Lock::builder(other.clone(), &name)
            .ttl(ttl)
            .build()
            .expect("valid")
            .try_lock_for(Duration::from_secs(30))
            .await
            .expect("store")
            .expect("granted once the holder's session expired");
        proxy.set_fault(Fault::Pass);
        let released = timeout(Duration::from_secs(15), guard.release())
            .await
            .expect("the release answers within a liveness bound");
        assert_eq!(
            released.as_ref().err().map(fencelock::Error::kind),
            Some(ErrorKind::LockLost),
            "round {round}: {released:?}"
        );
        next.release().await.expect("release");
    }
}
