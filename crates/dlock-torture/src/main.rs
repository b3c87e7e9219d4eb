//! `dlock-torture`: see the library's documentation (`dlock_torture`).

fn main() -> std::process::ExitCode {
    dlock_torture::main()
}
