//! The `dlock` command: flock(1) for a fleet of machines.
//!
//! `main` parses flags, connects to the store named by `--url` / `DLOCK_URL`, and hands
//! the concrete backend to a command; every expected failure becomes a documented exit
//! code (see `exit.rs` and `dlock --help`) and one line on stderr.

#![forbid(unsafe_code)]

mod args;
mod cmd;
mod exit;
#[cfg(test)]
mod hostile;
mod target;

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

use crate::args::{Cli, Command};
use crate::exit::Failure;
use crate::target::{connect, connect_to_lock, with_election_backend};

fn main() -> ExitCode {
    exit_quietly_on_broken_pipe();
    // The reaper `dlock run` starts beside a command, and the gate in front of the command
    // (which execs it, returning only on failure): internal, not user commands.
    match std::env::args_os().nth(1) {
        Some(a) if a == cmd::REAPER_ARG => return ExitCode::from(cmd::reaper_main()),
        Some(a) if a == cmd::GATE_ARG => {
            return ExitCode::from(cmd::gate_main(std::env::args_os().skip(2)));
        }
        _ => {}
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // A usage error: one line, and the usage code.
        Err(err) if err.use_stderr() => return exit::finish(Err(usage_failure(&err))),
        Err(help_or_version) => {
            let _ = help_or_version.print();
            return ExitCode::from(exit::SUCCESS);
        }
    };
    // The harness replaces this process (no runtime needed).
    let command = match cli.command {
        Command::Torture(args) => {
            return exit::finish(Err(cmd::harness::exec("torture", args.args)));
        }
        Command::Demo(args) => return exit::finish(Err(cmd::harness::exec("demo", args.args))),
        command => command,
    };
    if matches!(command, Command::Run(_) | Command::Elect(_)) {
        cmd::write_from_the_background();
    }
    let runtime = tokio::runtime::Runtime::new();
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            return exit::finish(Err(Failure::new(
                exit::UNAVAILABLE,
                format!("cannot start: {e}"),
            )));
        }
    };
    exit::finish(runtime.block_on(dispatch(command)))
}

/// `dlock list | head -1`: a reader that closed stdout ends dlock as SIGPIPE ends a C
/// tool (status 141, nothing on stderr), not with `println!`'s panic message. (Rust
/// ignores SIGPIPE, so the write fails with EPIPE instead.)
fn exit_quietly_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        // println!'s "failed printing to stdout: Broken pipe (os error 32)", clap_complete's
        // "failed to write completion file: Os { .., kind: BrokenPipe, .. }".
        if message.contains("Broken pipe") || message.contains("kind: BrokenPipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

/// A usage error of clap's as one line (its first paragraph), without a secret it
/// echoes: clap quotes the value it refuses, which may be a URL given where a name or a
/// duration goes (`dlock status NAME "$DLOCK_URL"`, the `--url` forgotten).
fn usage_failure(err: &clap::Error) -> Failure {
    let text = err.to_string();
    // Clap's own words up to the first quote, then user input (the refused value), whose
    // secrets are hidden before the text is cut: a password may span lines.
    let text = match text.split_once('\'') {
        Some((words, input)) => format!("{words}'{}", target::redact(input)),
        None => target::redact(&text),
    };
    let first_paragraph = text.split("\n\n").next().unwrap_or("bad usage");
    let line = first_paragraph
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let line = line.trim_start_matches("error: ");
    // `dlock run NAME COMMAND`, the `--` forgotten: the command's words are taken for
    // dlock's (or missing), whatever clap calls it. Its usage line shows where they go.
    let usage = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Usage: "))
        .filter(|u| u.contains(" -- <COMMAND>"));
    let forgot_dashes = matches!(
        err.kind(),
        clap::error::ErrorKind::UnknownArgument | clap::error::ErrorKind::MissingRequiredArgument
    );
    match usage {
        Some(usage) if forgot_dashes => {
            let command = usage
                .split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" ");
            Failure::usage(format!(
                "{line}: the command goes after --, as in: {usage} (see {command} --help)"
            ))
        }
        _ => Failure::usage(format!("{line} (see dlock --help)")),
    }
}

async fn dispatch(command: Command) -> Result<u8, Failure> {
    match command {
        // What each store can do, or why not: target.rs.
        // On zk://, --ttl is the session timeout (see target::connect_holding).
        Command::Run(args) => {
            target::run(connect_to_lock(&args.store, Some(args.ttl)).await?, args).await
        }
        Command::Elect(args) => {
            with_election_backend!(connect_to_lock(&args.store, Some(args.ttl)).await?, |b| {
                cmd::elect::elect(b, args).await
            })
        }
        Command::Leader(args) => {
            with_election_backend!(connect(&args.store, false).await?, |b| {
                cmd::elect::leader(b, args).await
            })
        }
        Command::Acquire(args) => {
            target::acquire(connect_to_lock(&args.store, None).await?, args).await
        }
        Command::Hold(args) => {
            target::hold(connect_to_lock(&args.store, Some(args.ttl)).await?, args).await
        }
        Command::Release(args) => target::release(connect(&args.store, false).await?, args).await,
        Command::Extend(args) => {
            target::extend(connect(&args.held.store, false).await?, args).await
        }
        Command::Status(args) => target::status(connect(&args.store, false).await?, args).await,
        Command::List(args) => target::list(connect(&args.store, false).await?, args).await,
        Command::Top(args) => target::top(connect(&args.store, false).await?, args).await,
        Command::ForceUnlock(args) => {
            target::force_unlock(connect(&args.store, false).await?, args).await
        }
        Command::SetPermits(args) => {
            target::set_permits(connect(&args.store, false).await?, args).await
        }
        Command::Torture(_) | Command::Demo(_) => Err(Failure::new(
            exit::CANNOT_EXECUTE,
            "dlock torture and dlock demo run the harness in place of dlock",
        )),
        Command::Completions(args) => {
            clap_complete::generate(
                args.shell,
                &mut Cli::command(),
                "dlock",
                &mut std::io::stdout(),
            );
            Ok(exit::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::args::{Kind, SortBy};
    use crate::hostile::{SCHEMES, cases, hidden, url_with_password, usage_without};

    /// The command lines that take a value, one per flag or argument (words split at
    /// spaces), `{}` where the value goes.
    const TAKES_A_VALUE: &[&str] = &[
        "run --url redis://h --ttl {} n -- true",
        "run --url redis://h --wait {} n -- true",
        "run --url redis://h --kill-grace {} n -- true",
        "run --url redis://h --min-hold {} n -- true",
        "run --url redis://h --semaphore {} n -- true",
        "run --url redis://h --conflict-exit-code {} n -- true",
        "run --url redis://h --info {} n -- true",
        "run --url redis://h --prefix {} n -- true",
        "run --url {} n -- true",
        "run {} -- true",
        "elect --url redis://h --value {} n -- true",
        "elect --url redis://h --ttl {} n -- true",
        "acquire --url redis://h --ttl {} n",
        "extend --url redis://h --token t --ttl {} n",
        "release --url redis://h --token {} n",
        "status --url redis://h --kind {} n",
        "status n {}",
        "list {}",
        "list --limit {}",
        "top --sort {}",
        "top --kind {}",
        "top --interval {}",
        "top --limit {}",
        "top --iterations {}",
        "force-unlock n --kind {}",
        "list --kind {}",
        "set-permits --url redis://h n {}",
        "set-permits {} 3",
        "completions {}",
        "{}",
    ];

    /// What `top --sort` takes.
    const SORTS: [(&str, SortBy); 5] = [
        ("name", SortBy::Name),
        ("ttl", SortBy::Ttl),
        ("fence", SortBy::Fence),
        ("waiters", SortBy::Waiters),
        ("since", SortBy::Since),
    ];

    /// What `--kind` takes, and what it means.
    const KINDS: &[&str] = &["lock", "semaphore", "reentrant", "rwlock", "fair"];
    const KIND_VALUES: [Kind; 5] = [
        Kind::Lock,
        Kind::Semaphore,
        Kind::Reentrant,
        Kind::Rwlock,
        Kind::Fair,
    ];

    /// Every word `--sort` or `--kind` takes.
    const WORDS: &[&str] = &[
        "name",
        "ttl",
        "fence",
        "waiters",
        "since",
        "lock",
        "semaphore",
        "reentrant",
        "rwlock",
        "fair",
    ];

    /// `dlock` and `line` with `value` in place of `{}`, as `--flag value` or (`eq`)
    /// `--flag=value`.
    fn argv(line: &str, value: &str, eq: bool) -> Vec<String> {
        let mut argv = vec!["dlock".to_owned()];
        let mut words = line.split_whitespace().peekable();
        while let Some(word) = words.next() {
            if eq && word.starts_with("--") && words.peek() == Some(&"{}") {
                words.next();
                argv.push(format!("{word}={value}"));
            } else if word == "{}" {
                argv.push(value.to_owned());
            } else {
                argv.push(word.to_owned());
            }
        }
        argv
    }

    /// Parses `argv` as `main` does: the arguments, or the failure it prints.
    fn parse(argv: &[String]) -> Result<Cli, Failure> {
        Cli::try_parse_from(argv).map_err(|err| {
            if err.use_stderr() {
                usage_failure(&err)
            } else {
                Failure::new(exit::SUCCESS, "help or version")
            }
        })
    }

    proptest! {
        #![proptest_config(cases(256))]

        /// Any value of any flag or argument: parsed, or one usage line (never a panic).
        #[test]
        fn any_value_parses_or_is_one_usage_line(
            line in prop::sample::select(TAKES_A_VALUE),
            value in prop_oneof![any::<String>(), "[ -~]{0,20}", "[0-9]{1,25}"],
            eq in any::<bool>(),
        ) {
            if let Err(f) = parse(&argv(line, &value, eq))
                && f.code != exit::SUCCESS
            {
                usage_without(&f, "")?;
                prop_assert!(!f.message.contains('\n'), "{}", f.message);
            }
        }

        /// A URL with a password, wherever it lands on the command line (a name, a
        /// duration, a kind, a subcommand: `dlock status NAME "$DLOCK_URL"`), never shows
        /// in the usage error.
        #[test]
        fn a_password_never_shows_in_usage_errors(
            line in prop::sample::select(TAKES_A_VALUE),
            (url, secret) in url_with_password(SCHEMES),
            eq in any::<bool>(),
        ) {
            if let Err(f) = parse(&argv(line, &url, eq))
                && f.code != exit::SUCCESS
            {
                usage_without(&f, &secret)?;
            }
        }

        /// Durations on the command line: `<n>ms` and `<n>s` are exactly n units.
        #[test]
        fn durations_on_the_command_line_are_exact(n in 1..=u64::MAX, ms in any::<bool>()) {
            let (text, d) = if ms {
                let nanos = n.checked_mul(1_000_000);
                (format!("{n}ms"), nanos.map(Duration::from_nanos))
            } else {
                (format!("{n}s"), Some(Duration::from_secs(n)))
            };
            let line = "run --url redis://h --wait {} --kill-grace {} n -- true";
            match (parse(&argv(line, &text, false)), d) {
                (Ok(cli), Some(d)) => {
                    let Command::Run(run) = cli.command else { panic!("not run") };
                    prop_assert_eq!(run.wait.wait, Some(d));
                    prop_assert_eq!(run.kill_grace, Some(d));
                }
                (Err(f), None) => usage_without(&f, "")?,
                (Ok(_), None) => prop_assert!(false, "{} overflowed into a value", text),
                (Err(f), Some(_)) => prop_assert!(false, "{}: {}", text, f.message),
            }
        }

        /// `top --sort` and `--kind` (`status --kind`) take exactly their names, kinds
        /// also as a list.
        #[test]
        fn sort_and_kind_take_exactly_their_names(
            word in prop_oneof![
                prop::sample::select(WORDS).prop_map(str::to_owned),
                "[a-zA-Z]{0,9}",
            ],
            kinds in prop::collection::vec(prop::sample::select(KINDS), 1..4),
        ) {
            let sort = SORTS.iter().find(|(s, _)| *s == word).map(|(_, v)| *v);
            match (parse(&argv("top --sort {}", &word, false)), sort) {
                (Ok(cli), Some(by)) => {
                    let Command::Top(top) = cli.command else { panic!("not top") };
                    prop_assert_eq!(top.sort, by);
                }
                (Err(f), None) => usage_without(&f, "")?,
                (_, expected) => prop_assert!(false, "--sort {:?}: expected {:?}", word, expected),
            }
            let kind_of = |w: &str| KINDS.iter().position(|k| *k == w).map(|i| KIND_VALUES[i]);
            let cli = parse(&argv("top --kind {}", &kinds.join(","), false))
                .map_err(|f| TestCaseError::fail(f.message))?;
            let Command::Top(top) = cli.command else { panic!("not top") };
            let expected: Vec<Kind> = kinds.iter().filter_map(|k| kind_of(k)).collect();
            prop_assert_eq!(top.kind, expected);
            let status = parse(&argv("status n --kind {}", &word, false));
            prop_assert_eq!(status.is_ok(), kind_of(&word).is_some());
        }

        /// Numbers in range parse to themselves; others (negative, too large) are usage
        /// errors, never wrapped.
        #[test]
        fn numbers_in_range_parse_to_themselves(
            n in prop_oneof![any::<i128>(), -300..300i128, any::<u64>().prop_map(i128::from)],
        ) {
            let number = n.to_string();
            let limit = parse(&argv("top --limit {}", &number, false));
            match limit {
                Ok(cli) => {
                    let Command::Top(top) = cli.command else { panic!("not top") };
                    prop_assert_eq!(i128::from(top.limit), n);
                    prop_assert!(n >= 1);
                }
                Err(f) => {
                    prop_assert!(!(1..=i128::from(u64::MAX)).contains(&n));
                    usage_without(&f, "")?;
                }
            }
            match parse(&argv("run --conflict-exit-code {} n -- true", &number, false)) {
                Ok(cli) => {
                    let Command::Run(run) = cli.command else { panic!("not run") };
                    prop_assert_eq!(i128::from(run.wait.conflict_exit_code), n);
                }
                Err(f) => {
                    prop_assert!(u8::try_from(n).is_err());
                    usage_without(&f, "")?;
                }
            }
            match parse(&argv("run --semaphore {} n -- true", &number, false)) {
                Ok(cli) => {
                    let Command::Run(run) = cli.command else { panic!("not run") };
                    prop_assert_eq!(run.semaphore.map(i128::from), Some(n));
                }
                Err(f) => {
                    prop_assert!(u32::try_from(n).is_err());
                    usage_without(&f, "")?;
                }
            }
        }
    }

    /// Regression: clap quotes the value it refuses, so `dlock status NAME "$DLOCK_URL"`
    /// (the `--url` forgotten) printed the password.
    #[test]
    fn a_url_given_in_the_wrong_place_is_not_echoed() {
        for line in [
            "status n {}",
            "run --ttl {} n -- true",
            "top --sort {}",
            "{}",
        ] {
            let argv = argv(line, "redis://app:s3cret@db:6379/0", false);
            let f = parse(&argv).map(|_| ()).expect_err("a usage error");
            assert_eq!(f.code, exit::USAGE);
            hidden(&f.message, "s3cret").expect("hidden");
            assert!(f.message.contains("'redis://app:***@db"), "{}", f.message);
        }
    }
}
