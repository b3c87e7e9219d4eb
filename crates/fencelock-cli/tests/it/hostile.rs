//! Hostile input on the command line: durations, names and URLs of every scheme must end in
//! the usage code or a typed failure code with one line on stderr, never in a panic; and a
//! secret in a URL (or in the environment) must never be printed, whatever happens.
//!
//! Every case spawns the real binary. The "fuzzed" inputs come from a seeded generator
//! (this crate's tests have no proptest), 24 per kind, reproducible from the seed printed
//! with a failure.

use std::process::{Command, Output, Stdio};

use dlock_test::server::{RedisServer, free_port};

use super::{CONFLICT, LOST, UNAVAILABLE, USAGE, dlock, output, stderr};

/// Checks that `out` ended in one of `codes`, without a panic, and with at most one line on
/// stderr (exactly one, starting `dlock: `, unless it succeeded) besides warnings.
fn assert_typed(out: &Output, codes: &[i32], what: &str) {
    let err = stderr(out);
    let code = out.status.code();
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE") && code != Some(101),
        "{what}: a panic: {err}"
    );
    assert!(
        code.is_some_and(|c| codes.contains(&c)),
        "{what}: exit {:?}, expected one of {codes:?}: {err}",
        out.status
    );
    if code == Some(0) {
        return;
    }
    // Warnings about the store's configuration (no AOF) come before it.
    assert_eq!(
        err.trim_end()
            .lines()
            .filter(|l| !l.starts_with("dlock: warning: "))
            .count(),
        1,
        "{what}: not one line: {err:?}"
    );
    assert!(err.starts_with("dlock: "), "{what}: {err:?}");
}

/// A small deterministic generator (xorshift64*): the fuzzed cases of a run are the same
/// on every machine.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[(self.next() % from.len() as u64) as usize]
    }

    /// A string of up to `max` chars drawn from digits, units, punctuation, controls,
    /// whitespace and non-ASCII (never NUL: it cannot be an argument).
    fn garbage(&mut self, max: u64) -> String {
        const PIECES: &[&str] = &[
            "0",
            "1",
            "9",
            "42",
            "-",
            "+",
            ".",
            "e",
            "s",
            "ms",
            "m",
            "h",
            "d",
            "y",
            "ns",
            " ",
            "\t",
            "\n",
            "\r",
            "\u{1}",
            "\u{1b}[31m",
            "\u{7f}",
            "é",
            "٣",
            "½",
            "∞",
            "\u{202e}",
            "🔒",
            "{",
            "}",
            ":",
            "/",
            "@",
            "?",
            "&",
            "=",
            "%",
            "%00",
            "\\",
            "'",
            "\"",
            "*",
            "[",
            "x",
        ];
        let len = self.next() % (max + 1);
        (0..len).map(|_| self.pick(PIECES)).collect()
    }
}

/// Durations no command may take: empty, zero, negative, without a unit, overflowing,
/// other digits, garbage.
const BAD_DURATIONS: &[&str] = &[
    "",
    " ",
    "0",
    "0s",
    "0ms",
    "-1s",
    "-5",
    "5",
    "s",
    "1e9s",
    "1.5.5s",
    "5 parsecs",
    "99999999999999999999999999h",
    "18446744073709551616ms",
    "584942417355y",
    "١٠s",
    "½s",
    "∞",
    "10s\u{202e}",
    "\u{1b}[2J",
    "🔒",
];

/// Durations that parse but are absurd: a ttl over the library's cap and a kill grace
/// over a third of the ttl are refused, a wait that long is taken (the lock is free, so
/// the command runs at once).
const HUGE_DURATIONS: &[&str] = &["99999999999999h", "18446744073709551615s", "100000d"];

#[test]
fn hostile_durations_are_usage_errors() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let dead = format!("redis://127.0.0.1:{}/", free_port().expect("port"));
    let mut rng = Gen(0x5eed_0001);
    let cases = BAD_DURATIONS
        .iter()
        .map(|v| ((*v).to_owned(), [USAGE; 3]))
        .chain(
            HUGE_DURATIONS
                .iter()
                .map(|v| ((*v).to_owned(), [USAGE, 0, USAGE])),
        )
        // Garbage may spell a valid duration now and then ("9h"): only typed, no panic.
        .chain((0..24).map(|_| (rng.garbage(8), [-1; 3])));
    for (value, [ttl, wait, grace]) in cases {
        let allowed = |code: i32| -> Vec<i32> {
            if code == -1 {
                vec![0, USAGE]
            } else {
                vec![code]
            }
        };
        // `--flag=value`, so that a value starting with '-' is not taken for a flag.
        let runs = [
            (
                "acquire --ttl",
                ttl,
                vec!["acquire".to_owned(), format!("--ttl={value}"), "d1".into()],
            ),
            ("run --ttl", ttl, run_args(&format!("--ttl={value}"), "d2")),
            (
                "run --wait",
                wait,
                run_args(&format!("--wait={value}"), "d3"),
            ),
            (
                "run --kill-grace",
                grace,
                run_args(&format!("--kill-grace={value}"), "d4"),
            ),
        ];
        for (what, code, args) in runs {
            let out = output(dlock(&url).args(&args));
            assert_typed(&out, &allowed(code), &format!("{what} {value:?}"));
        }
        // With a dead store: a bad duration is a usage error before anything connects.
        let out = output(dlock(&dead).args(["acquire", &format!("--ttl={value}"), "d5"]));
        let codes = if ttl == USAGE && !HUGE_DURATIONS.contains(&value.as_str()) {
            vec![USAGE]
        } else {
            vec![USAGE, UNAVAILABLE]
        };
        assert_typed(&out, &codes, &format!("dead store, --ttl {value:?}"));
    }
}

/// `run <flag> <name> -- true`.
fn run_args(flag: &str, name: &str) -> Vec<String> {
    ["run", flag, name, "--", "true"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
}

#[test]
fn hostile_names_are_refused_or_work_never_panic() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let long = "x".repeat(100_000);
    let limit = "n".repeat(1024);
    let over = "o".repeat(1025);
    let mut names: Vec<(String, &[i32])> = vec![
        (String::new(), &[USAGE]),
        (long.clone(), &[USAGE]),
        (over.clone(), &[USAGE]),
        (limit.clone(), &[0]),
        ("\n".into(), &[0]),
        ("a\nb".into(), &[0]),
        ("\r\n".into(), &[0]),
        ("\u{1}\u{1b}[2J\u{7}".into(), &[0]),
        ("\u{202e}txt.exe".into(), &[0]),
        ("ünïcödé".into(), &[0]),
        ("🔒".into(), &[0]),
        (" ".into(), &[0]),
        ("*".into(), &[0]),
        ("?[".into(), &[0]),
        ("\\".into(), &[0]),
        ("{tag}x".into(), &[0]),
        ("{}".into(), &[USAGE]),
        ("}".into(), &[USAGE]),
        ("a}b".into(), &[USAGE]),
        ("%s%n%x".into(), &[0]),
        ("'; DROP TABLE locks; --".into(), &[0]),
    ];
    let mut rng = Gen(0x5eed_0002);
    for _ in 0..24 {
        names.push((rng.garbage(12), &[0, USAGE]));
    }
    for (name, codes) in &names {
        let shown = format!("{:?}", name.chars().take(40).collect::<String>());
        // After `--` a name may start with '-'.
        let out = output(dlock(&url).args(["status", "--", name]));
        assert_typed(&out, codes, &format!("status {shown}"));
        let out = output(dlock(&url).args(["acquire", "--ttl", "1s", "--", name]));
        assert_typed(&out, codes, &format!("acquire {shown}"));
        let out = output(dlock(&url).args(["force-unlock", "--yes", "--", name]));
        assert_typed(&out, codes, &format!("force-unlock {shown}"));
        if !name.starts_with('-') {
            let out = output(dlock(&url).args(["run", name, "--", "true"]));
            assert_typed(&out, codes, &format!("run {shown}"));
        }
        // Messages about a name are short and never echo a huge one.
        let err = stderr(&out);
        assert!(err.len() < 2048, "{shown}: {} bytes of stderr", err.len());
    }
    // Patterns are names too.
    for (pattern, _) in &names {
        let out = output(dlock(&url).args(["list", "--", pattern]));
        assert_typed(&out, &[0, USAGE], &format!("list {:?}", pattern.len()));
    }
}

/// URL shapes of every scheme, at `port` (nothing listens there): malformed ones and
/// well-formed ones whose store is missing.
fn hostile_urls(port: u16) -> Vec<String> {
    let p = port;
    let mut urls = vec![
        String::new(),
        " ".into(),
        "://".into(),
        "redis".into(),
        "redis:".into(),
        "redis:/127.0.0.1".into(),
        "redis//127.0.0.1".into(),
        "REDIS://127.0.0.1".into(),
        "http://127.0.0.1".into(),
        "memory://".into(),
        "\u{1b}[31mredis://127.0.0.1".into(),
        format!("redis://127.0.0.1:{p}/"),
        format!("redis://127.0.0.1:{p}/x"),
        format!("redis://127.0.0.1:{p}/99999999999999999999"),
        "redis://127.0.0.1:99999/".into(),
        "redis://127.0.0.1:-1/".into(),
        "redis://[::1/".into(),
        "redis://0.0.0.0/".into(),
        format!("redis://127.0.0.1:{p}/?protocol=9"),
        format!("redis://127.0.0.1:{p}/#fragment"),
        format!("rediss://127.0.0.1:{p}/"),
        format!("rediss://127.0.0.1:{p}/#nope"),
        "redis+unix://".into(),
        "redis+unix:///no/such.sock?db=x".into(),
        "unix:///no/such.sock".into(),
        "redis+sentinel://".into(),
        format!("redis+sentinel://127.0.0.1:{p}"),
        format!("redis+sentinel://127.0.0.1:{p}/m/x"),
        format!("redis+sentinel://127.0.0.1:{p}/m/1/2"),
        format!("redis+sentinel://127.0.0.1:{p}/m"),
        "redis+cluster://".into(),
        format!("redis+cluster://127.0.0.1:{p}/0"),
        "redis+cluster://127.0.0.1:x".into(),
        format!("redis+cluster://127.0.0.1:{p},,"),
        "redlock://".into(),
        format!("redlock://127.0.0.1:{p}"),
        format!("redlock://127.0.0.1:{p},127.0.0.1:{p},127.0.0.1:{p}"),
        "memcache://".into(),
        "memcache://127.0.0.1:x".into(),
        "memcache://127.0.0.1:1/x".into(),
        format!("memcache://127.0.0.1:{p}?max_connections=0"),
        format!("memcache://127.0.0.1:{p}?bogus=1"),
        format!("memcached://127.0.0.1:{p}"),
        "etcd://".into(),
        "etcd://127.0.0.1".into(),
        "etcd://127.0.0.1:x".into(),
        "etcd://127.0.0.1:1/path".into(),
        format!("etcd://127.0.0.1:{p}"),
        "postgres://".into(),
        "postgres://127.0.0.1:x/db".into(),
        format!("postgres://127.0.0.1:{p}/db?sslmode=bogus"),
        format!("postgres://127.0.0.1:{p}/db?max_connections=0"),
        format!("postgres://127.0.0.1:{p}/db?schema=Bad-Name"),
        format!("postgres://127.0.0.1:{p}/db?mode=advisory"),
        format!("postgresql://127.0.0.1:{p}/db?bogus=1"),
        format!("postgres://127.0.0.1:{p}/db"),
        "zk://".into(),
        "zk://127.0.0.1".into(),
        format!("zk://127.0.0.1:{p}/a//b"),
        format!("zk://127.0.0.1:{p}?session_timeout=0s"),
        format!("zk://127.0.0.1:{p}?session_timeout=99999999999999999999m"),
        format!("zk://u@127.0.0.1:{p}"),
        format!("zk://127.0.0.1:{p}"),
    ];
    let mut rng = Gen(0x5eed_0003);
    const SCHEMES: &[&str] = &[
        "redis://",
        "rediss://",
        "redis+unix://",
        "redis+sentinel://",
        "redis+cluster://",
        "redlock://",
        "memcache://",
        "etcd://",
        "postgres://",
        "zk://",
        "",
        "x://",
    ];
    for _ in 0..24 {
        let scheme = rng.pick(SCHEMES);
        // Hosts stay on loopback (no name to look up); the rest is garbage.
        let host = rng.pick(&["127.0.0.1", "", "[::1]", "127.0.0.1:", "@", "u:p@127.0.0.1"]);
        urls.push(format!(
            "{scheme}{host}{}{}",
            rng.garbage(3),
            rng.garbage(6)
        ));
    }
    urls
}

#[test]
fn hostile_urls_of_every_scheme_fail_typed() {
    let port = free_port().expect("port");
    let urls = hostile_urls(port);
    let cmds = urls.iter().flat_map(|url| {
        let mut via_env = dlock(url);
        via_env.args(["status", "x"]);
        let mut via_flag = Command::new(env!("CARGO_BIN_EXE_dlock"));
        via_flag.env_remove("DLOCK_URL").stdin(Stdio::null()).args([
            "run",
            "--no-wait",
            "--url",
            url,
            "x",
            "--",
            "true",
        ]);
        [via_env, via_flag]
    });
    let outs = outputs(cmds.collect());
    for (out, url) in outs.iter().zip(urls.iter().flat_map(|u| [u, u])) {
        // Usage for a malformed URL; unavailable for a store that is not there; a valid
        // `memory://` is refused as usage too.
        assert_typed(out, &[USAGE, UNAVAILABLE], &format!("URL {url:?}"));
    }
}

// ---------------------------------------------------------------------------------------
// Secrets never printed.

/// A password no message could contain by accident.
const SECRET: &str = "Zq9-s3cret-PW";

/// One run of `dlock <args>` against a URL holding the secret, and the codes it may end in.
struct Case {
    url: String,
    args: Vec<String>,
    codes: Vec<i32>,
}

fn case(url: &str, args: &[&str], codes: &[i32]) -> Case {
    assert!(url.contains(SECRET), "{url}");
    Case {
        url: url.to_owned(),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        codes: codes.to_vec(),
    }
}

/// The commands of `url` whose messages could show it: `status`, `run`, `acquire`, `list`,
/// `force-unlock`, `elect` and `leader`.
fn every_command(url: &str, codes: &[i32]) -> Vec<Case> {
    [
        &["status", "x"][..],
        &["status", "--json", "x"],
        &["run", "--no-wait", "x", "--", "true"],
        &["acquire", "--ttl", "5s", "x"],
        &["list"],
        &["force-unlock", "--yes", "x"],
        &["elect", "--no-wait", "x", "--", "true"],
        &["leader", "x"],
    ]
    .into_iter()
    .map(|args| case(url, args, codes))
    .collect()
}

/// Runs every case twice, the URL once as `--url` (after the subcommand) and once as
/// `DLOCK_URL`, with tracing asked for in the environment, all at once (a refused
/// connection takes the client half a second of retries), and checks that the secret
/// appears on neither stream and each run ends typed. Returns the outputs, in order
/// (`--url` first).
fn assert_secret_hidden(cases: &[Case]) -> Vec<Output> {
    let runs: Vec<(String, Command)> = cases
        .iter()
        .flat_map(|c| [(c, true), (c, false)])
        .map(|(c, via_flag)| {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlock"));
            cmd.stdin(Stdio::null())
                .env("RUST_LOG", "trace")
                .env("RUST_BACKTRACE", "1");
            if via_flag {
                let (sub, rest) = c.args.split_first().expect("a subcommand");
                cmd.env_remove("DLOCK_URL")
                    .arg(sub)
                    .args(["--url", &c.url])
                    .args(rest);
            } else {
                cmd.env("DLOCK_URL", &c.url).args(&c.args);
            }
            let via = if via_flag { "--url" } else { "DLOCK_URL" };
            (format!("{:?} with {via} {}", c.args, c.url), cmd)
        })
        .collect();
    let codes = cases.iter().flat_map(|c| [&c.codes, &c.codes]);
    let (whats, cmds): (Vec<String>, Vec<Command>) = runs.into_iter().unzip();
    let outs = outputs(cmds);
    for ((out, what), codes) in outs.iter().zip(&whats).zip(codes) {
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !text.contains(SECRET),
            "{what}: the secret was printed: {text}"
        );
        assert_typed(out, codes, what);
    }
    outs
}

/// Runs `cmds` at most 16 at a time; their outputs in order.
fn outputs(cmds: Vec<Command>) -> Vec<Output> {
    let mut outs = Vec::with_capacity(cmds.len());
    let mut cmds = cmds.into_iter().peekable();
    while cmds.peek().is_some() {
        let children: Vec<std::process::Child> = cmds
            .by_ref()
            .take(16)
            .map(|mut cmd| {
                cmd.stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn dlock")
            })
            .collect();
        outs.extend(
            children
                .into_iter()
                .map(|c| c.wait_with_output().expect("dlock output")),
        );
    }
    outs
}

/// A loopback port where nothing listens.
fn closed() -> u16 {
    free_port().expect("port")
}

/// `redis://` (and `unix`/`redis+unix`'s `pass=`): a real server refusing the password, a
/// closed port, and malformed URLs of the scheme.
#[test]
fn redis_passwords_are_never_printed() {
    let server = RedisServer::start().expect("redis-server");
    let mut admin = server.client().get_connection().expect("admin connection");
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("alice")
        .arg("on")
        .arg(">the-right-one")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query(&mut admin)
        .expect("ACL SETUSER");
    let port = server.port();
    let wrong = format!("redis://alice:{SECRET}@127.0.0.1:{port}/");
    let mut cases = every_command(&wrong, &[UNAVAILABLE]);
    let p = closed();
    for url in [
        format!("redis://alice:{SECRET}@127.0.0.1:{p}/"),
        format!("redis://:{SECRET}@127.0.0.1:{p}/"),
        format!("redis://{SECRET}@127.0.0.1:{p}/"),
        format!("redis://alice:{SECRET}@127.0.0.1:{p}/x"),
        format!("redis://alice:{SECRET}@127.0.0.1:notaport/"),
        format!("redis://alice:{SECRET}/@127.0.0.1:{p}/"),
        format!("redis://alice:{SECRET}?@127.0.0.1:{p}/"),
        format!("redis://alice:{SECRET}@127.0.0.1:{p}/?protocol=9"),
        format!("redis+unix:///no/such.sock?pass={SECRET}"),
        format!("redis+unix:///no/such.sock?db=x&pass={SECRET}"),
        format!("unix:///no/such.sock?user=u&pass={SECRET}"),
    ] {
        cases.push(case(&url, &["status", "x"], &[USAGE, UNAVAILABLE]));
    }
    let outs = assert_secret_hidden(&cases);
    // The refusal is reported, as an authentication failure.
    let err = stderr(&outs[0]);
    assert!(err.contains("authentication failed"), "{err}");
}

#[test]
fn rediss_passwords_are_never_printed() {
    let p = closed();
    let mut cases = every_command(
        &format!("rediss://alice:{SECRET}@127.0.0.1:{p}/"),
        &[UNAVAILABLE],
    );
    for url in [
        format!("rediss://alice:{SECRET}@127.0.0.1:{p}/#insecure"),
        format!("rediss://alice:{SECRET}@127.0.0.1:{p}/#bogus"),
    ] {
        cases.push(case(&url, &["status", "x"], &[USAGE, UNAVAILABLE]));
    }
    assert_secret_hidden(&cases);
}

#[test]
fn sentinel_passwords_are_never_printed() {
    let p = closed();
    let mut cases = every_command(
        &format!("redis+sentinel://alice:{SECRET}@127.0.0.1:{p}/mymaster"),
        &[UNAVAILABLE],
    );
    for url in [
        format!("redis+sentinel://alice:{SECRET}@127.0.0.1:{p}/mymaster/x"),
        format!("redis+sentinel://alice:{SECRET}@127.0.0.1:{p}"),
        format!("redis+sentinel://alice:{SECRET}@127.0.0.1:{p}/m/1/2"),
        format!("redis+sentinel://alice:{SECRET}@127.0.0.1 1:{p}/m"),
    ] {
        cases.push(case(&url, &["status", "x"], &[USAGE]));
    }
    assert_secret_hidden(&cases);
}

/// A cluster's seed nodes: until the library's fix, "could not connect to redis at
/// cluster:redis://alice:<password>@…" showed them with their credentials.
#[test]
fn cluster_passwords_are_never_printed() {
    let p = closed();
    let mut cases = every_command(
        &format!("redis+cluster://alice:{SECRET}@127.0.0.1:{p},127.0.0.1:{p}/"),
        &[UNAVAILABLE],
    );
    for url in [
        format!("redis+cluster://alice:{SECRET}@127.0.0.1:{p}/0"),
        format!("redis+cluster://alice:{SECRET}@127.0.0.1:x"),
        format!("redis+cluster://alice:{SECRET}@"),
    ] {
        cases.push(case(&url, &["status", "x"], &[USAGE]));
    }
    assert_secret_hidden(&cases);
}

#[test]
fn redlock_passwords_are_never_printed() {
    let (a, b, c) = (closed(), closed(), closed());
    let mut cases = Vec::new();
    for (url, codes) in [
        (
            format!("redlock://alice:{SECRET}@127.0.0.1:{a},127.0.0.1:{b},127.0.0.1:{c}"),
            &[UNAVAILABLE][..],
        ),
        (
            format!("redlock://alice:{SECRET}@127.0.0.1:{a},127.0.0.1:{b}"),
            &[USAGE],
        ),
        (
            format!("redlock://alice:{SECRET}@127.0.0.1:{a},127.0.0.1:{b},127.0.0.1:{c}/x"),
            &[USAGE],
        ),
    ] {
        cases.push(case(&url, &["run", "--no-wait", "x", "--", "true"], codes));
        cases.push(case(&url, &["status", "x"], &[USAGE, UNAVAILABLE]));
    }
    assert_secret_hidden(&cases);
}

/// memcached takes no credentials: a URL with some is refused, without echoing them.
#[test]
fn memcache_urls_with_credentials_never_print_them() {
    let p = closed();
    let mut cases = every_command(
        &format!("memcache://alice:{SECRET}@127.0.0.1:{p}"),
        &[USAGE],
    );
    for url in [
        format!("memcached://alice:{SECRET}@127.0.0.1:{p}"),
        format!("memcache://127.0.0.1:{p}?password={SECRET}"),
    ] {
        cases.push(case(&url, &["status", "x"], &[USAGE]));
    }
    assert_secret_hidden(&cases);
}

/// etcd URLs take no credentials (the client speaks plain gRPC): refused, not echoed.
#[test]
fn etcd_urls_with_credentials_never_print_them() {
    let p = closed();
    let mut cases = every_command(&format!("etcd://root:{SECRET}@127.0.0.1:{p}"), &[USAGE]);
    for url in [
        format!("etcd://root:{SECRET}@127.0.0.1:{p},127.0.0.1:{p}/"),
        format!("etcd://127.0.0.1:{p}?password={SECRET}"),
    ] {
        cases.push(case(&url, &["status", "x"], &[USAGE]));
    }
    assert_secret_hidden(&cases);
}

#[test]
fn postgres_passwords_are_never_printed() {
    let pg = dlock_test::postgres::PostgresServer::start().expect("postgres");
    // The kit's server authenticates TCP connections by password.
    let wrong = pg.url_as("postgres", SECRET);
    let mut cases = every_command(&wrong, &[USAGE, UNAVAILABLE]);
    cases.push(case(
        &format!("{wrong}?mode=advisory"),
        &["status", "x"],
        &[UNAVAILABLE],
    ));
    let p = closed();
    for url in [
        format!("postgres://app:{SECRET}@127.0.0.1:{p}/db"),
        format!("postgresql://app:{SECRET}@127.0.0.1:{p}/db"),
        format!("postgres://app:{SECRET}@127.0.0.1:x/db"),
        format!("postgres://app:{SECRET}@127.0.0.1:{p}/db?sslmode=bogus"),
        format!("postgres://app:{SECRET}@127.0.0.1:{p}/db?max_connections=0"),
        format!("postgres://app:{SECRET}@127.0.0.1:{p}/db?bogus=1"),
        format!("postgres://app:{SECRET}/@127.0.0.1:{p}/db"),
        format!("postgres://127.0.0.1:{p}/db?user=app&password={SECRET}"),
        format!("postgres://127.0.0.1:{p}/db?password={SECRET}&schema=Bad-Name"),
    ] {
        cases.push(case(&url, &["status", "x"], &[USAGE, UNAVAILABLE]));
    }
    let outs = assert_secret_hidden(&cases);
    // The refusal is reported, as a failed password authentication.
    let err = stderr(&outs[0]);
    assert!(err.contains("password authentication failed"), "{err}");
}

/// ZooKeeper's digest identity (`zk://user:password@…`): a real server (where the digest
/// is added to the session and guards the nodes), a closed port, malformed URLs.
#[test]
fn zookeeper_digests_are_never_printed() {
    let zk = dlock_test::zookeeper::ZooKeeper::standalone().expect("zookeeper");
    let url = format!("zk://alice:{SECRET}@{}/hostile", zk.hosts());
    // ZooKeeper takes any digest: the commands work (acquire is refused: a zk hold lives
    // in the session; the runs, all at once, may find the lock or election taken, or
    // lose it to the force-unlock running beside them, which may find nothing to unlock:
    // 79) and say nothing of it.
    let mut cases = every_command(&url, &[0, USAGE, CONFLICT, LOST, 79]);
    let p = closed();
    for url in [
        format!("zk://alice:{SECRET}@127.0.0.1:{p}"),
        format!("zk://alice:{SECRET}@127.0.0.1"),
        format!("zk://alice:{SECRET}@127.0.0.1:{p}/a//b"),
        format!("zk://alice:{SECRET}@127.0.0.1:{p}?bogus=1"),
        format!("zk://127.0.0.1:{p}?digest=alice:{SECRET}"),
    ] {
        cases.push(case(&url, &["status", "x"], &[USAGE, UNAVAILABLE]));
    }
    let outs = assert_secret_hidden(&cases);
    assert!(outs[0].status.success(), "{}", stderr(&outs[0]));
}

/// Help, version and completions with secrets in the environment (clap would print an
/// env value next to its flag unless told not to).
#[test]
fn help_never_prints_secrets_from_the_environment() {
    let url = format!("redis://alice:{SECRET}@127.0.0.1:1/");
    for args in [
        &["--help"][..],
        &["-h"],
        &["--version"],
        &["help"],
        &["run", "--help"],
        &["run", "-h"],
        &["status", "--help"],
        &["acquire", "--help"],
        &["release", "--help"],
        &["extend", "--help"],
        &["elect", "--help"],
        &["leader", "--help"],
        &["list", "--help"],
        &["force-unlock", "--help"],
        &["completions", "bash"],
        &["run"],
        &["release", "x"],
        &["bogus-command"],
    ] {
        let out = output(
            Command::new(env!("CARGO_BIN_EXE_dlock"))
                .stdin(Stdio::null())
                .env("DLOCK_URL", &url)
                .env("DLOCK_TOKEN", SECRET)
                .env("RUST_LOG", "trace")
                .args(args),
        );
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!text.contains(SECRET), "{args:?}: {text}");
        assert_typed(&out, &[0, USAGE, UNAVAILABLE], &format!("{args:?}"));
    }
}

/// A mistyped scheme separator (`redis:/…`, `redis//…`), a URL without a scheme, or one
/// whose first `://` comes after the credentials: the CLI's own messages ("--url … is not
/// a URL", "unknown backend …") print the URL redacted, never its password.
#[test]
fn urls_without_a_scheme_separator_never_print_their_password() {
    let cases: Vec<Case> = [
        format!("redis:/alice:{SECRET}@127.0.0.1:1/"),
        format!("redis//alice:{SECRET}@127.0.0.1:1/"),
        format!("alice:{SECRET}@127.0.0.1:1"),
        format!("postgres:app:{SECRET}@127.0.0.1/db"),
        format!("alice:{SECRET}@127.0.0.1:1/x?next=http://z"),
    ]
    .iter()
    .map(|url| case(url, &["status", "x"], &[USAGE]))
    .collect();
    assert_secret_hidden(&cases);
}
