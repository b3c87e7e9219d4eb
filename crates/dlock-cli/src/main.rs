//! The `dlock` command. A placeholder until the command-line issue lands: it answers
//! `--version` and says that the commands are not implemented yet.

use std::process::ExitCode;

/// Exit code for a usage error (as in sysexits' EX_USAGE).
const EXIT_USAGE: u8 = 64;

fn main() -> ExitCode {
    let arg = std::env::args().nth(1);
    match arg.as_deref() {
        Some("--version" | "-V") => {
            println!("dlock {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!(
                "dlock {}: the command-line tool is not implemented yet; use the dlock library \
                 (see README.md)",
                env!("CARGO_PKG_VERSION")
            );
            ExitCode::from(EXIT_USAGE)
        }
    }
}
