//! Hostile input for the property tests of dlock's parsers (durations, URLs, names,
//! tokens, the command line): one set of generators for the library and the command, so
//! that both are tried with the same malformed input. Hostile input must end in a value
//! or a typed failure, never a panic, and show no secret.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

/// `cases` cases (or `PROPTEST_CASES`, for a deeper run), failures not persisted to
/// files (a failure found is then a named case of its module's tests).
pub fn cases(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(cases),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A password that cannot turn up in a message by accident: a marker plus printable
/// ASCII, URL delimiters and quotes included (`/ ? # : @ & = ' ,` and spaces, which end a
/// URL parser's user info, a clap value or a word early), but no `%` (decoded forms would
/// differ), `"` or `\` (escaped by `Debug`, which would hide a leak from `contains`).
/// Some have a `://` of their own, which a mangled URL's scheme separator (`redis:/`)
/// leaves as the first one.
pub fn password() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[A-Za-z0-9!$*()_+=.~:/?#&;,@' -]{6,16}".prop_map(|tail| format!("Zq{tail}")),
        1 => ("[A-Za-z0-9]{1,6}", "[A-Za-z0-9!$*()_+=.~:/?#&;,@' -]{0,8}")
            .prop_map(|(head, tail)| format!("Zq{head}://{tail}")),
    ]
}

/// What follows the user info: realistic hosts, ports, paths and queries, or garbage.
fn rest() -> impl Strategy<Value = String> {
    prop_oneof![
        concat!(
            "(127\\.0\\.0\\.1|localhost|h|\\[::1\\]|)(:[0-9a-z]{0,7})?(,h:[0-9]{1,5}){0,4}",
            "(/[a-z0-9/]{0,10})?(\\?[a-z_]{1,10}=[a-z0-9]{0,4})?",
        ),
        any::<String>(),
    ]
}

/// A URL of one of `schemes` whose secret is `password`, in one of the places a password
/// goes (user info, or a `password=` / `pass=` query parameter), often malformed: a
/// mangled `://`, garbage after it. Yields `(url, secret)`.
pub fn url_with_password(
    schemes: &'static [&'static str],
) -> impl Strategy<Value = (String, String)> {
    (
        prop::sample::select(schemes),
        prop::sample::select(&["://", ":/", ":", "//", ":///", "://:", ""][..]),
        "[a-z]{0,6}",
        password(),
        rest(),
        0..3u8,
    )
        .prop_filter_map(
            "the rest must not contain the password",
            |(scheme, sep, user, password, rest, place)| {
                let url = match place {
                    0 => format!("{scheme}{sep}{user}:{password}@{rest}"),
                    // A parameter of the query, whether or not `rest` started it.
                    1 if rest.contains('?') => format!("{scheme}{sep}{rest}&password={password}"),
                    1 => format!("{scheme}{sep}{rest}?password={password}"),
                    _ => format!("{scheme}{sep}{rest}?db=0&pass={password}"),
                };
                // A query password is one only up to the next '&' or '#'.
                let secret = if place == 0 {
                    password
                } else {
                    password
                        .split(['&', '#'])
                        .next()
                        .unwrap_or_default()
                        .to_owned()
                };
                (secret.len() >= 6 && !rest.contains(&secret)).then_some((url, secret))
            },
        )
}

/// Any string; strings that start like a URL of one of `schemes`; printable ASCII after
/// one.
pub fn any_url(schemes: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        (prop::sample::select(schemes), any::<String>())
            .prop_map(|(scheme, rest)| format!("{scheme}://{rest}")),
        (prop::sample::select(schemes), "[ -~]{0,60}")
            .prop_map(|(scheme, rest)| format!("{scheme}://{rest}")),
    ]
}

/// Checks that `text` (a message, or a `Debug` form) shows nothing of `secret` (if any).
///
/// # Errors
/// The failed check, for proptest.
pub fn hidden(text: &str, secret: &str) -> Result<(), TestCaseError> {
    if !secret.is_empty() {
        prop_assert!(!text.contains(secret), "leak of {:?}: {}", secret, text);
    }
    Ok(())
}
