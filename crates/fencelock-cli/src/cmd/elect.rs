//! `dlock elect NAME -- COMMAND` (a command that runs only while leading) and
//! `dlock leader NAME` (who leads, once or as it changes).

use fencelock::raw::RawElection;
use std::time::UNIX_EPOCH;

use fencelock::{Election, Leader, LeaderChange, Leadership, Vacancy};
use serde::Serialize;

use crate::args::{ElectArgs, LeaderArgs, Store};
use crate::cmd::run::{Job, Signals, supervise};
use crate::cmd::{plain_text, print_json};
use crate::exit::{self, Failure};

/// The election's key prefix: `--prefix` as given, else
/// [`fencelock::DEFAULT_ELECTION_PREFIX`].
fn prefix(store: &Store) -> &str {
    store.prefix_or(fencelock::DEFAULT_ELECTION_PREFIX)
}

/// The value a candidate advertises when `--value` is not given: `host:pid`.
fn default_value() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "localhost".to_owned());
    format!("{host}:{}", std::process::id())
}

pub(crate) async fn elect<B: RawElection>(backend: B, args: ElectArgs) -> Result<u8, Failure> {
    crate::cmd::supervise::check_kill_grace(args.kill_grace, args.ttl)?;
    let election = Election::builder(backend, &args.name)
        .prefix(prefix(&args.store))
        .ttl(args.ttl)
        .build()?;
    let value = args.value.clone().unwrap_or_else(default_value);
    // Installed before campaigning, so that a signal while waiting ends the campaign
    // cleanly (a cancelled campaign leaves no place in the queue).
    let mut signals = Signals::install()?;
    let campaign = async {
        if args.wait.no_wait {
            election.try_campaign(value).await
        } else if let Some(d) = args.wait.wait {
            election.campaign_for(d, value).await
        } else {
            election.campaign(value).await.map(Some)
        }
    };
    let led: Option<Leadership<B>> = tokio::select! {
        led = campaign => led?,
        sig = signals.recv() => return Ok(128 + sig as u8),
    };
    let Some(leadership) = led else {
        if !args.quiet {
            let leader = election.leader().await;
            eprintln!("dlock: {}", led_by_another(&args, leader));
        }
        return Ok(args.wait.conflict_exit_code);
    };
    let term = leadership.term().get();
    let job = Job {
        what: "leadership of",
        name: &args.name,
        command: &args.command,
        kill_grace: args.kill_grace,
        release_on_exit: args.release_on_exit,
        env: vec![
            ("DLOCK_TERM", term.to_string()),
            ("DLOCK_FENCE", term.to_string()),
            ("DLOCK_VALUE", leadership.value().to_owned()),
        ],
    };
    // Releasing the lease is resigning: the next candidate is woken at once.
    supervise(leadership.into_guard(), &job, signals).await
}

/// What `elect` says when another candidate leads (`--no-wait`, or `--wait` ran out): who
/// leads, as `dlock leader` shows it (term and value), and what to do.
fn led_by_another(args: &ElectArgs, leader: fencelock::Result<Option<Leader>>) -> String {
    let name = crate::cmd::shown(&args.name);
    let who = match leader {
        Ok(Some(leader)) => match &leader.value {
            Some(v) => format!(" (term {}, value {:?})", leader.term, plain_text(v)),
            None => format!(" (term {}, value not announced yet)", leader.term),
        },
        Ok(None) => " (it has stepped down since: try again)".to_owned(),
        Err(_) => String::new(),
    };
    match args.wait.wait {
        Some(d) => format!(
            "another candidate still leads {name} after --wait {}{who}: a longer --wait \
             waits longer, and without --wait dlock waits until it leads",
            humantime::format_duration(d)
        ),
        None => format!(
            "another candidate leads {name}{who}: not waiting (--no-wait); --wait D waits up \
             to D to lead"
        ),
    }
}

#[derive(Serialize)]
struct LeaderJson<'a> {
    name: &'a str,
    leader: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    term: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<&'a str>,
    /// A vacancy's: the term that ended (the last leader's).
    #[serde(skip_serializing_if = "Option::is_none")]
    last_term: Option<u64>,
    /// A vacancy's: since when nobody leads, where known (RFC 3339, UTC).
    #[serde(skip_serializing_if = "Option::is_none")]
    since: Option<String>,
    /// The same, in milliseconds since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    since_ms: Option<u64>,
}

impl<'a> LeaderJson<'a> {
    fn of(name: &'a str, leader: Option<&'a Leader>) -> LeaderJson<'a> {
        LeaderJson {
            name,
            leader: leader.is_some(),
            term: leader.map(|l| l.term.get()),
            value: leader.and_then(|l| l.value.as_deref()),
            last_term: None,
            since: None,
            since_ms: None,
        }
    }
}

fn print_leader(args: &LeaderArgs, leader: Option<&Leader>) -> Result<(), Failure> {
    if args.json {
        return print_json(&LeaderJson::of(&args.name, leader));
    }
    match leader {
        None => println!("no leader"),
        Some(l) => match &l.value {
            // Another candidate's text: plain on one line (JSON escapes it instead).
            Some(v) => println!("term {}: {}", l.term, plain_text(v)),
            None => println!("term {}: (elected; value not announced yet)", l.term),
        },
    }
    Ok(())
}

/// `--watch`'s line for an empty seat: `no leader`, then what is known of it —
/// `(last term T, since TIME)`, `(last term T)`.
fn print_vacancy(args: &LeaderArgs, vacancy: &Vacancy) -> Result<(), Failure> {
    let last_term = vacancy.last_term.map(|t| t.get());
    let since = vacancy
        .since
        .map(|t| humantime::format_rfc3339_seconds(t).to_string());
    if args.json {
        return print_json(&LeaderJson {
            last_term,
            since_ms: vacancy
                .since
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            since,
            ..LeaderJson::of(&args.name, None)
        });
    }
    match (last_term, since) {
        (Some(term), Some(since)) => println!("no leader (last term {term}, since {since})"),
        (Some(term), None) => println!("no leader (last term {term})"),
        (None, Some(since)) => println!("no leader (since {since})"),
        (None, None) => println!("no leader"),
    }
    Ok(())
}

pub(crate) async fn leader<B: RawElection>(backend: B, args: LeaderArgs) -> Result<u8, Failure> {
    let election = Election::builder(backend, &args.name)
        .prefix(prefix(&args.store))
        .build()?;
    if !args.watch {
        let leader = election.leader().await?;
        print_leader(&args, leader.as_ref())?;
        return Ok(exit::SUCCESS);
    }
    let mut signals = Signals::install()?;
    // The first change is the state now: the leader, or nobody.
    let mut observer = election.observe();
    loop {
        let change = tokio::select! {
            change = observer.next() => change,
            sig = signals.recv() => return Ok(128 + sig as u8),
        };
        match change {
            Ok(LeaderChange::Leader(leader)) => print_leader(&args, Some(&leader))?,
            Ok(LeaderChange::Vacant(vacancy)) => print_vacancy(&args, &vacancy)?,
            // The observer reads again on the next call; say why the view may lag.
            Err(err) => eprintln!("dlock: reading the leader failed ({err}); retrying"),
        }
    }
}
