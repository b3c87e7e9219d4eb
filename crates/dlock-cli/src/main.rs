//! The `dlock` command: flock(1) for a fleet of machines.
//!
//! `main` parses flags, connects to the store named by `--url` / `DLOCK_URL`, and hands
//! the concrete backend to a command; every expected failure becomes a documented exit
//! code (see `exit.rs` and `dlock --help`) and one line on stderr.

#![forbid(unsafe_code)]

mod args;
mod cmd;
mod exit;
mod target;

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

use crate::args::{Cli, Command};
use crate::exit::Failure;
use crate::target::{connect, with_election_backend};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) if err.use_stderr() => {
            // A usage error: one line, and the usage code.
            let text = err.to_string();
            let first_paragraph = text.split("\n\n").next().unwrap_or("bad usage");
            let line = first_paragraph
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            return exit::finish(Err(Failure::usage(format!(
                "{} (see dlock --help)",
                line.trim_start_matches("error: ")
            ))));
        }
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

async fn dispatch(command: Command) -> Result<u8, Failure> {
    match command {
        // What each store can do, or why not: target.rs.
        Command::Run(args) => target::run(connect(&args.store, false).await?, args).await,
        Command::Elect(args) => {
            with_election_backend!(connect(&args.store, false).await?, |b| {
                cmd::elect::elect(b, args).await
            })
        }
        Command::Leader(args) => {
            with_election_backend!(connect(&args.store, false).await?, |b| {
                cmd::elect::leader(b, args).await
            })
        }
        Command::Acquire(args) => target::acquire(connect(&args.store, false).await?, args).await,
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
