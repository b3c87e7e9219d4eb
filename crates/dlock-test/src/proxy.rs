//! A fault-injecting TCP proxy on loopback: pass, delay, blackhole, close.
//!
//! Put it between a client and a server to make the network misbehave without root or
//! `tc`: [`Proxy::set_fault`] delays every chunk in both directions, or holds all traffic
//! (a partition; it is delivered when the partition heals, as TCP retransmission would),
//! and [`Proxy::close_all`] drops every connection at once. New connections are accepted
//! throughout.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// What the proxy does to traffic now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward at once.
    Pass,
    /// Forward each chunk after this delay.
    Delay(Duration),
    /// Forward nothing until the fault changes.
    Blackhole,
}

/// A running proxy. Dropping it stops it and closes its connections.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    fault: watch::Sender<Fault>,
    connections: Arc<Mutex<JoinSet<()>>>,
    acceptor: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    ///
    /// # Errors
    /// Binding the listener failed.
    pub async fn start(upstream: SocketAddr) -> io::Result<Proxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (fault, _) = watch::channel(Fault::Pass);
        let connections: Arc<Mutex<JoinSet<()>>> = Arc::default();
        let acceptor = {
            let fault = fault.clone();
            let connections = Arc::clone(&connections);
            tokio::spawn(async move {
                loop {
                    let client = match listener.accept().await {
                        Ok((client, _)) => client,
                        Err(_) => {
                            // Transient (e.g. out of file descriptors): keep serving.
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    };
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        continue; // the client sees its connection closed
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let mut set = connections.lock().unwrap_or_else(PoisonError::into_inner);
                    while set.try_join_next().is_some() {} // reap finished connections
                    set.spawn(pump(cr, sw, fault.subscribe()));
                    set.spawn(pump(sr, cw, fault.subscribe()));
                }
            })
        };
        Ok(Proxy {
            addr,
            fault,
            connections,
            acceptor,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Changes what happens to traffic from now on.
    pub fn set_fault(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// Drops every open connection (clients see a reset and reconnect).
    pub fn close_all(&self) {
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .abort_all();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.acceptor.abort();
        self.close_all();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut fault: watch::Receiver<Fault>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        loop {
            let now = *fault.borrow_and_update();
            match now {
                Fault::Pass => break,
                Fault::Delay(d) => {
                    tokio::time::sleep(d).await;
                    // A partition that began meanwhile holds this chunk too.
                    if *fault.borrow() != Fault::Blackhole {
                        break;
                    }
                }
                Fault::Blackhole => {
                    if fault.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
