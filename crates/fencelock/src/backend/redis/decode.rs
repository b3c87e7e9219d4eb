//! Reading the server's replies: pure functions from `redis::Value`s to dlock's types.
//!
//! Every reply the backend reads beyond one typed conversion (an inspection's
//! transaction, a listing's `SCAN` and `PTTL` pages, `CLUSTER SLOTS`, a renewal batch) is
//! decoded by a function of its own, without I/O, so that property tests can hand it any
//! value tree: whatever a server (or a proxy, or a tampered key) answers, a decoder
//! returns a value or a `Backend` error, never panics, never wraps a number around.

use std::time::Duration;

use redis::{FromRedisValue, ServerErrorKind, Value};

use super::{map_err, not_replicated, server_ms};
use crate::engine::Renewal;
use crate::error::{Error, ErrorKind, Result};
use crate::raw::LockState;

/// The most of a reply a message shows (a reply may be any size).
const SHOWN: usize = 200;

/// The error of a reply that is not what the command or script returns: `Backend`, not
/// retryable, naming what was being done.
pub(super) fn malformed(doing: &str, why: impl std::fmt::Display) -> Error {
    let mut why = why.to_string();
    if why.len() > SHOWN {
        let mut end = SHOWN;
        while !why.is_char_boundary(end) {
            end -= 1;
        }
        why.truncate(end);
        why.push('…');
    }
    Error::new(
        ErrorKind::Backend,
        format!("{doing}: unexpected reply from redis: {why}"),
    )
}

/// `value` as a `T` (redis-rs's conversion), or a [`malformed`] error.
pub(super) fn typed<T: FromRedisValue>(value: &Value, doing: &str) -> Result<T> {
    redis::from_redis_value_ref(value).map_err(|e| malformed(doing, e))
}

/// The `N` replies of a transaction (`MULTI` … `EXEC`), each command's in order: exactly
/// `N`, or a [`malformed`] error.
pub(super) fn replies<const N: usize>(reply: Vec<Value>, doing: &str) -> Result<[Value; N]> {
    let len = reply.len();
    <[Value; N]>::try_from(reply)
        .map_err(|_| malformed(doing, format!("{len} replies where {N} were sent")))
}

/// The plain lock's state from its inspection transaction: `GET` lock, `PTTL` lock, `GET`
/// fence counter, `ZCARD` waiters.
pub(super) fn lock_state(reply: Vec<Value>) -> Result<LockState> {
    const DOING: &str = "inspecting";
    let [holder, pttl, fence, queued] = replies(reply, DOING)?;
    let holder: Option<String> = typed(&holder, DOING)?;
    let pttl: i64 = typed(&pttl, DOING)?;
    let fence: Option<u64> = typed(&fence, DOING)?;
    let queued: u64 = typed(&queued, DOING)?;
    let remaining = u64::try_from(pttl).ok().map(Duration::from_millis);
    // Every waiter of the lock has a place in its queue.
    Ok(LockState::new(holder, remaining, fence)
        .with_queued(u32::try_from(queued).unwrap_or(u32::MAX))
        .with_waiting_clients(queued))
}

/// A semaphore's state from its inspection transaction: `TIME`, `ZRANGE` leases
/// `WITHSCORES`, `HGETALL` permit counts.
pub(super) fn permit_snapshot(reply: Vec<Value>) -> Result<LockState> {
    const DOING: &str = "inspecting a semaphore";
    let [time, leases, counts] = replies(reply, DOING)?;
    let (secs, micros): (i64, i64) = typed(&time, DOING)?;
    let leases: Vec<(String, f64)> = typed(&leases, DOING)?;
    let counts: Vec<(String, u32)> = typed(&counts, DOING)?;
    Ok(permit_state(server_ms(secs, micros), &leases, &counts))
}

/// `sem_count.lua`'s `{permits in use, the permit count or -1 if none is stored}`, as
/// (in use, count): no count stored is `permits`, the semaphore's configured count. Uses
/// above `u32::MAX` saturate (tampered permit counts may sum to anything); a negative use
/// or a count outside `-1..=u32::MAX` is a [`malformed`] error.
pub(super) fn permit_count(reply: &Value, permits: u32) -> Result<(u32, u32)> {
    const DOING: &str = "counting permits";
    let (used, count): (i64, i64) = typed(reply, DOING)?;
    let used = match u64::try_from(used) {
        Ok(used) => u32::try_from(used).unwrap_or(u32::MAX),
        Err(_) => return Err(malformed(DOING, format!("{used} permits in use"))),
    };
    let count = match count {
        -1 => permits,
        n => u32::try_from(n).map_err(|_| malformed(DOING, format!("a permit count of {n}")))?,
    };
    Ok((used, count))
}

/// One page of `SCAN`: the next cursor (0: done) and the keys. Keys that are not UTF-8
/// are skipped: no lock name is (a name is a `&str`), so no lock key is either.
pub(super) fn scan_page(reply: &Value) -> Result<(u64, Vec<String>)> {
    let (cursor, keys): (u64, Vec<Vec<u8>>) = typed(reply, "listing locks (SCAN)")?;
    let keys = keys
        .into_iter()
        .filter_map(|k| String::from_utf8(k).ok())
        .collect();
    Ok((cursor, keys))
}

/// The keys of a `SCAN` page that carry an expiry (every lock key does; fence counters
/// never do), from one `PTTL` reply per key, in order: as many as there are keys, or a
/// [`malformed`] error.
pub(super) fn expiring_keys(keys: Vec<String>, ttls: &[Value]) -> Result<Vec<String>> {
    const DOING: &str = "listing locks (PTTL)";
    if keys.len() != ttls.len() {
        return Err(malformed(
            DOING,
            format!("{} replies for {} keys", ttls.len(), keys.len()),
        ));
    }
    let mut live = Vec::with_capacity(keys.len());
    for (key, ttl) in keys.into_iter().zip(ttls) {
        if typed::<i64>(ttl, DOING)? >= 0 {
            live.push(key);
        }
    }
    Ok(live)
}

/// The masters' addresses in a `CLUSTER SLOTS` reply, each once, in order of appearance.
/// Each range is `[first slot, last slot, [host, port, id, …], replicas…]`; a range of
/// another shape is a [`malformed`] error. A master whose address is not a string and a
/// `u16` (the server reports an unknown endpoint as nil) is skipped, as it always was:
/// its keys cannot be listed.
pub(super) fn cluster_masters(reply: &Value) -> Result<Vec<(String, u16)>> {
    const DOING: &str = "listing the cluster's masters";
    let ranges: Vec<Value> = typed(reply, DOING)?;
    let mut masters = Vec::new();
    for range in &ranges {
        let Value::Array(parts) = range else {
            return Err(malformed(DOING, format!("a slot range {range:?}")));
        };
        let Some(Value::Array(master)) = parts.get(2) else {
            return Err(malformed(
                DOING,
                format!("a slot range without a master {parts:?}"),
            ));
        };
        let (Some(host), Some(port)) = (master.first(), master.get(1)) else {
            return Err(malformed(DOING, format!("a master {master:?}")));
        };
        let (Ok(host), Ok(port)) = (
            redis::from_redis_value_ref::<String>(host),
            redis::from_redis_value_ref::<u16>(port),
        ) else {
            continue;
        };
        if !masters.iter().any(|(h, p)| *h == host && *p == port) {
            masters.push((host, port));
        }
    }
    Ok(masters)
}

/// Whether a renewal batch's replies hold a `NOSCRIPT` error (the script cache was
/// flushed: load the scripts and send the batch again).
pub(super) fn lacks_a_script(replies: &[Value]) -> bool {
    replies
        .iter()
        .any(|r| matches!(r, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript)))
}

/// The outcome of each renewal of a batch from the batch's replies: one renewal script's
/// reply per renewal, in order (`1` renewed, `0` not held), then `WAIT`'s count of
/// acknowledging replicas if `replicas` must acknowledge. One result per renewal, always:
/// a batch with too few or too many replies fails every renewal with a [`malformed`]
/// error; one reply of another type fails its renewal.
pub(super) fn renewal_results(
    mut replies: Vec<Value>,
    renewals: &[Renewal],
    replicas: Option<u32>,
) -> Vec<Result<bool>> {
    const DOING: &str = "renewing a lease";
    let expected = renewals.len() + usize::from(replicas.is_some());
    if replies.len() != expected {
        let why = format!("{} replies for {expected} commands", replies.len());
        return renewals
            .iter()
            .map(|_| Err(malformed("renewing leases", &why)))
            .collect();
    }
    let replicated = match replicas {
        // The last reply is WAIT's count of acknowledging replicas.
        Some(n) => replies
            .pop()
            .is_some_and(|acks| typed::<i64>(&acks, DOING).is_ok_and(|a| a >= i64::from(n))),
        None => true,
    };
    replies
        .into_iter()
        .zip(renewals)
        .map(|(reply, renewal)| match reply {
            Value::ServerError(e) => Err(map_err(e.into(), DOING)),
            reply => match typed::<i64>(&reply, DOING)? {
                1 if !replicated => Err(not_replicated(&renewal.keys, "the renewal")),
                n => Ok(n == 1),
            },
        })
        .collect()
}

/// A semaphore's state from its leases (`token -> expiry ms` by the server's clock),
/// permit counts (`token -> permits`) and the server's time `now` (ms). Counts saturate:
/// the hash may hold anything someone wrote to it.
pub(super) fn permit_state(
    now: i64,
    leases: &[(String, f64)],
    counts: &[(String, u32)],
) -> LockState {
    // `as` saturates (NaN becomes 0): a score is whatever the sorted set holds.
    let live: Vec<(&str, i64)> = leases
        .iter()
        .map(|(token, expiry)| (token.as_str(), *expiry as i64))
        .filter(|(_, expiry)| *expiry > now)
        .collect();
    let used = live
        .iter()
        .filter_map(|(token, _)| counts.iter().find(|(t, _)| t == token))
        .fold(0u32, |sum, (_, n)| sum.saturating_add(*n));
    let last = live
        .iter()
        .map(|(_, expiry)| expiry.saturating_sub(now))
        .max()
        .and_then(|ms| u64::try_from(ms).ok())
        .map(Duration::from_millis);
    LockState::new(None, last, None)
        .with_hold_count(used)
        .with_holders(u32::try_from(live.len()).unwrap_or(u32::MAX))
}

/// Strategies for property tests of the decoders: any value tree, and the replies a
/// server sends.
#[cfg(test)]
pub(super) mod strategy {
    use proptest::prelude::*;
    use redis::{PushKind, Value, VerbatimFormat};

    /// A server error (`-CODE detail`), as the parser makes it (the type has no public
    /// constructor).
    pub(crate) fn server_error(code: &str, detail: &str) -> Value {
        match redis::parse_redis_value(format!("-{code} {detail}\r\n").as_bytes()) {
            Ok(v @ Value::ServerError(_)) => v,
            other => Value::SimpleString(format!("{other:?}")),
        }
    }

    /// Text that numeric conversions find interesting, and any text.
    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "-?[0-9]{1,20}",
            "-?[0-9]{0,5}\\.[0-9]{0,5}(e-?[0-9]{1,3})?",
            Just("inf".to_owned()),
            Just("-inf".to_owned()),
            Just("nan".to_owned()),
            Just(String::new()),
            "[a-z:/{}]{1,12}",
            any::<String>(),
        ]
    }

    /// Any leaf a RESP2 or RESP3 reply holds.
    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Nil),
            Just(Value::Okay),
            any::<i64>().prop_map(Value::Int),
            prop_oneof![Just(0i64), Just(1), Just(-1), Just(-2), 0..70_000i64].prop_map(Value::Int),
            prop::collection::vec(any::<u8>(), 0..24).prop_map(Value::BulkString),
            text().prop_map(|s| Value::BulkString(s.into_bytes())),
            text().prop_map(Value::SimpleString),
            any::<f64>().prop_map(Value::Double),
            prop_oneof![
                Just(f64::NAN),
                Just(f64::INFINITY),
                Just(f64::NEG_INFINITY),
                Just(-0.0)
            ]
            .prop_map(Value::Double),
            any::<bool>().prop_map(Value::Boolean),
            text().prop_map(|text| Value::VerbatimString {
                format: VerbatimFormat::Text,
                text,
            }),
            ("[A-Z]{1,10}", "[ -~]{0,20}").prop_map(|(code, detail)| server_error(&code, &detail)),
        ]
    }

    /// Any value tree, nested a few levels: arrays, maps, sets, attributes and pushes of
    /// any leaves.
    pub(crate) fn value() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(3, 24, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec((inner.clone(), inner.clone()), 0..4).prop_map(Value::Map),
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Set),
                (
                    inner.clone(),
                    prop::collection::vec((inner.clone(), inner.clone()), 0..2)
                )
                    .prop_map(|(data, attributes)| Value::Attribute {
                        data: Box::new(data),
                        attributes,
                    }),
                prop::collection::vec(inner, 0..3).prop_map(|data| Value::Push {
                    kind: PushKind::Message,
                    data,
                }),
            ]
        })
    }

    /// A transaction's reply: `n` values (sometimes one more or one fewer), each any
    /// tree, or the reply as it should be (`ok`) with one element replaced by any tree.
    pub(crate) fn transaction(ok: Vec<Value>) -> impl Strategy<Value = Vec<Value>> {
        let n = ok.len();
        prop_oneof![
            prop::collection::vec(value(), n.saturating_sub(1)..n + 2),
            (0..n.max(1), value()).prop_map(move |(i, v)| {
                let mut reply = ok.clone();
                if let Some(slot) = reply.get_mut(i) {
                    *slot = v;
                }
                reply
            }),
        ]
    }

    /// A bulk string of `text`, as RESP2 sends strings (and integers as text).
    pub(crate) fn bulk(text: impl ToString) -> Value {
        Value::BulkString(text.to_string().into_bytes())
    }

    /// A sorted set's `ZRANGE … WITHSCORES` reply: flat pairs (RESP2) or one array per
    /// member with a double (RESP3).
    pub(crate) fn zrange(members: &[(String, i64)], resp3: bool) -> Value {
        Value::Array(if resp3 {
            members
                .iter()
                .map(|(m, s)| Value::Array(vec![bulk(m), Value::Double(*s as f64)]))
                .collect()
        } else {
            members
                .iter()
                .flat_map(|(m, s)| [bulk(m), bulk(s)])
                .collect()
        })
    }

    /// A hash's `HGETALL` reply: flat pairs (RESP2) or a map (RESP3).
    pub(crate) fn hgetall(fields: &[(String, String)], resp3: bool) -> Value {
        if resp3 {
            Value::Map(fields.iter().map(|(f, v)| (bulk(f), bulk(v))).collect())
        } else {
            Value::Array(
                fields
                    .iter()
                    .flat_map(|(f, v)| [bulk(f), bulk(v)])
                    .collect(),
            )
        }
    }

    /// `TIME`'s reply for `ms` milliseconds since the epoch.
    pub(crate) fn time(ms: i64) -> Value {
        Value::Array(vec![bulk(ms / 1000), bulk((ms % 1000) * 1000)])
    }

    /// A `GET` reply: the value, or nil.
    pub(crate) fn get(value: Option<impl ToString>) -> Value {
        value.map_or(Value::Nil, bulk)
    }
}

/// Hostile input: the conversions every reply goes through, on any value tree.
#[cfg(test)]
mod props {
    use proptest::prelude::*;
    use redis::{RedisResult, Value};

    use std::time::Duration;

    use super::strategy::{bulk, get, hgetall, server_error, time, transaction, value, zrange};
    use super::{
        SHOWN, cluster_masters, expiring_keys, lacks_a_script, lock_state, malformed, permit_count,
        permit_snapshot, renewal_results, replies, scan_page, typed,
    };
    use crate::backend::redis::parse_acquire;
    use crate::engine::{LeaseKind, Renewal};
    use crate::keys::LockKeys;
    use crate::token::Token;

    fn fail(e: impl std::fmt::Display) -> TestCaseError {
        TestCaseError::fail(e.to_string())
    }

    /// A decoder's result: any value, or a `Backend` error.
    pub(crate) fn backend_error<T>(decoded: &crate::Result<T>) -> Result<(), TestCaseError> {
        if let Err(e) = decoded {
            prop_assert_eq!(e.kind(), crate::ErrorKind::Backend, "{}", e);
        }
        Ok(())
    }

    /// `n` renewals of plain locks.
    fn renewals(n: usize) -> Result<Vec<Renewal>, TestCaseError> {
        (0..n)
            .map(|i| {
                Ok(Renewal::new(
                    LockKeys::new("dlock:", &format!("n{i}")).map_err(fail)?,
                    Token::random().map_err(fail)?,
                    Duration::from_secs(1),
                    LeaseKind::Lock,
                ))
            })
            .collect()
    }

    /// `typed` on `v`: a value or a `Backend` error.
    fn converts<T: redis::FromRedisValue>(v: &Value) -> Result<(), TestCaseError> {
        if let Err(e) = typed::<T>(v, "t") {
            prop_assert_eq!(e.kind(), crate::ErrorKind::Backend);
            prop_assert!(e.message().len() < SHOWN + 60, "{}", e.message());
        }
        Ok(())
    }

    #[test]
    fn server_errors_are_constructible() {
        assert!(matches!(
            server_error("NOSCRIPT", "No matching script"),
            Value::ServerError(e) if e.kind() == Some(redis::ServerErrorKind::NoScript)
        ));
    }

    #[test]
    fn long_reasons_are_cut_on_a_character_boundary() {
        let e = malformed("x", "é".repeat(SHOWN));
        assert!(e.message().ends_with('…'), "{}", e.message());
        assert!(e.message().len() < SHOWN + 40);
    }

    proptest! {
        #![proptest_config(crate::backend::hostile::cases(256))]

        /// The typed conversions the backend asks redis-rs for (script replies, `SET NX`,
        /// `HMGET`, transactions' pieces) never panic on any tree.
        #[test]
        fn every_conversion_of_any_tree_is_a_value_or_a_backend_error(v in value()) {
            converts::<i64>(&v)?;
            converts::<u64>(&v)?;
            converts::<u16>(&v)?;
            converts::<f64>(&v)?;
            converts::<String>(&v)?;
            converts::<Option<String>>(&v)?;
            converts::<Option<u64>>(&v)?;
            converts::<Vec<u8>>(&v)?;
            converts::<Vec<i64>>(&v)?;
            converts::<Vec<Value>>(&v)?;
            converts::<Vec<RedisResult<i64>>>(&v)?;
            converts::<(i64, i64)>(&v)?;
            converts::<(Option<String>, Option<String>)>(&v)?;
            converts::<Option<(String, u16)>>(&v)?;
            converts::<Vec<(String, f64)>>(&v)?;
            converts::<Vec<(String, u32)>>(&v)?;
            converts::<Vec<(String, String)>>(&v)?;
            converts::<(u64, Vec<Vec<u8>>)>(&v)?;
        }

        /// An acquire script's reply of any shape: decoded, or a `Backend` error.
        #[test]
        fn any_tree_as_an_acquire_reply_decodes_or_is_a_backend_error(v in value()) {
            if let Ok(reply) = typed::<Vec<i64>>(&v, "t")
                && let Err(e) = parse_acquire(&reply, "t")
            {
                prop_assert_eq!(e.kind(), crate::ErrorKind::Backend);
            }
        }

        #[test]
        fn any_lock_inspection_decodes_or_is_a_backend_error(
            reply in transaction(vec![bulk("tok"), Value::Int(5), bulk(7), Value::Int(0)]),
        ) {
            backend_error(&lock_state(reply))?;
        }

        #[test]
        fn lock_inspections_round_trip(
            holder in proptest::option::of("[0-9a-f]{32}(~p=[0-9]{1,5})?"),
            pttl in prop_oneof![Just(-2i64), Just(-1), 0..i64::MAX],
            fence in proptest::option::of(any::<u64>()),
            queued in prop_oneof![0..100i64, 0..i64::MAX],
        ) {
            let reply = vec![get(holder.as_ref()), Value::Int(pttl), get(fence), Value::Int(queued)];
            let state = lock_state(reply).map_err(fail)?;
            let queued = u64::try_from(queued).map_err(fail)?;
            prop_assert_eq!(state.holder, holder);
            prop_assert_eq!(state.remaining, u64::try_from(pttl).ok().map(Duration::from_millis));
            prop_assert_eq!(state.last_fence, fence);
            prop_assert_eq!(state.waiting_clients, Some(queued));
            prop_assert_eq!(state.queued, Some(u32::try_from(queued).unwrap_or(u32::MAX)));
        }

        #[test]
        fn any_semaphore_inspection_decodes_or_is_a_backend_error(
            reply in transaction(vec![time(1_000), zrange(&[("a".into(), 2_000)], false), hgetall(&[("a".into(), "1".into())], false)]),
        ) {
            backend_error(&permit_snapshot(reply))?;
        }

        #[test]
        fn semaphore_inspections_round_trip(
            now in 0..4_000_000_000_000i64,
            leases in prop::collection::btree_map("[a-f0-9]{1,8}", (-10_000..10_000i64, proptest::option::of(any::<u32>())), 0..8),
            strays in prop::collection::btree_map("[g-z]{1,8}", any::<u32>(), 0..3),
            resp3 in any::<bool>(),
        ) {
            // Each holder's lease (expiry relative to now) and, mostly, its permit count;
            // counts of tokens without a lease (left behind) count for nothing.
            let members: Vec<(String, i64)> = leases.iter().map(|(t, (dt, _))| (t.clone(), now + dt)).collect();
            let mut fields: Vec<(String, String)> = leases
                .iter()
                .filter_map(|(t, (_, n))| n.map(|n| (t.clone(), n.to_string())))
                .collect();
            fields.extend(strays.iter().map(|(t, n)| (t.clone(), n.to_string())));
            let reply = vec![time(now), zrange(&members, resp3), hgetall(&fields, resp3)];
            let state = permit_snapshot(reply).map_err(fail)?;
            let live: Vec<_> = leases.values().filter(|(dt, _)| *dt > 0).collect();
            let used = live.iter().filter_map(|(_, n)| *n).fold(0u32, u32::saturating_add);
            let last = live.iter().map(|(dt, _)| *dt).max();
            prop_assert_eq!(state.holders, Some(live.len() as u32));
            prop_assert_eq!(state.hold_count, Some(used));
            prop_assert_eq!(state.remaining, last.map(|ms| Duration::from_millis(ms as u64)));
            prop_assert_eq!(state.holder, None);
        }

        #[test]
        fn any_permit_count_decodes_or_is_a_backend_error(reply in value(), permits in any::<u32>()) {
            backend_error(&permit_count(&reply, permits))?;
        }

        #[test]
        fn permit_counts_round_trip(
            used in any::<i64>(),
            count in prop_oneof![Just(-1i64), 1..=i64::from(u32::MAX), any::<i64>()],
            permits in any::<u32>(),
        ) {
            let reply = Value::Array(vec![Value::Int(used), Value::Int(count)]);
            match permit_count(&reply, permits) {
                Ok((u, c)) => {
                    prop_assert_eq!(i64::from(u), used.min(i64::from(u32::MAX)));
                    prop_assert_eq!(c, if count == -1 { permits } else { u32::try_from(count).map_err(fail)? });
                }
                Err(e) => {
                    prop_assert_eq!(e.kind(), crate::ErrorKind::Backend);
                    prop_assert!(used < 0 || (count != -1 && u32::try_from(count).is_err()));
                }
            }
        }

        #[test]
        fn any_scan_page_decodes_or_is_a_backend_error(reply in value()) {
            backend_error(&scan_page(&reply))?;
        }

        #[test]
        fn scan_pages_round_trip(
            cursor in any::<u64>(),
            keys in prop::collection::vec(prop_oneof![
                "dlock:[a-z{}:]{1,10}".prop_map(String::into_bytes),
                prop::collection::vec(any::<u8>(), 0..12),
            ], 0..8),
        ) {
            let reply = Value::Array(vec![bulk(cursor), Value::Array(keys.iter().cloned().map(Value::BulkString).collect())]);
            let (next, names) = scan_page(&reply).map_err(fail)?;
            let utf8: Vec<String> = keys.into_iter().filter_map(|k| String::from_utf8(k).ok()).collect();
            prop_assert_eq!(next, cursor);
            prop_assert_eq!(names, utf8);
        }

        #[test]
        fn expiring_keys_decode_or_are_a_backend_error(
            keys in prop::collection::vec("[a-z]{1,4}", 0..5),
            ttls in prop::collection::vec(value(), 0..6),
        ) {
            let (n, m) = (keys.len(), ttls.len());
            let decoded = expiring_keys(keys, &ttls);
            backend_error(&decoded)?;
            prop_assert!(decoded.is_err() || n == m);
        }

        #[test]
        fn expiring_keys_round_trip(keys in prop::collection::vec(("[a-z]{1,4}", prop_oneof![Just(-2i64), Just(-1), 0..100_000i64]), 0..8)) {
            let ttls: Vec<Value> = keys.iter().map(|(_, t)| Value::Int(*t)).collect();
            let names: Vec<String> = keys.iter().map(|(k, _)| k.clone()).collect();
            let live: Vec<String> = keys.iter().filter(|(_, t)| *t >= 0).map(|(k, _)| k.clone()).collect();
            prop_assert_eq!(expiring_keys(names, &ttls).map_err(fail)?, live);
        }

        #[test]
        fn any_cluster_slots_reply_decodes_or_is_a_backend_error(reply in value()) {
            backend_error(&cluster_masters(&reply))?;
        }

        #[test]
        fn cluster_slots_round_trip(
            ranges in prop::collection::vec((
                proptest::option::of(("[a-c]\\.example|10\\.0\\.0\\.[1-3]", prop_oneof![Just(6379u16), any::<u16>()])),
                0..3usize,
                any::<bool>(),
            ), 0..8),
        ) {
            // Each range's master: an address, or an unknown endpoint (nil host); some
            // with replicas, some with RESP3's metadata map (Redis 7).
            let node = |host: Value, port: u16, meta: bool| {
                let mut node = vec![host, Value::Int(i64::from(port)), bulk("0123abcd")];
                if meta {
                    node.push(Value::Map(vec![(bulk("hostname"), bulk("h"))]));
                }
                Value::Array(node)
            };
            let mut expected: Vec<(String, u16)> = Vec::new();
            let reply = Value::Array(ranges.iter().enumerate().map(|(i, (master, replicas, meta))| {
                let slot = i as i64 * 100;
                let mut range = vec![Value::Int(slot), Value::Int(slot + 99)];
                match master {
                    Some((host, port)) => {
                        if !expected.contains(&(host.clone(), *port)) {
                            expected.push((host.clone(), *port));
                        }
                        range.push(node(bulk(host), *port, *meta));
                    }
                    None => range.push(node(Value::Nil, 6379, *meta)),
                }
                range.extend((0..*replicas).map(|r| node(bulk(format!("replica{r}")), 7000, *meta)));
                Value::Array(range)
            }).collect());
            prop_assert_eq!(cluster_masters(&reply).map_err(fail)?, expected);
        }

        #[test]
        fn any_renewal_replies_give_one_result_per_renewal(
            replies in prop::collection::vec(value(), 0..6),
            n in 0..5usize,
            replicas in proptest::option::of(0..3u32),
        ) {
            let batch = renewals(n)?;
            let results = renewal_results(replies, &batch, replicas);
            prop_assert_eq!(results.len(), n);
            for r in &results {
                if let Err(e) = r {
                    prop_assert!(matches!(e.kind(), crate::ErrorKind::Backend | crate::ErrorKind::NotReplicated) || e.is_retryable(), "{:?}", e);
                }
            }
        }

        #[test]
        fn renewal_replies_round_trip(
            outcomes in prop::collection::vec(0..4u8, 0..6),
            wait in proptest::option::of((0..4u32, 0..5i64)),
        ) {
            // Per renewal: renewed, not held, an error reply, NOSCRIPT; then WAIT's acks.
            let mut replies: Vec<Value> = outcomes.iter().map(|o| match o {
                0 => Value::Int(1),
                1 => Value::Int(0),
                2 => server_error("WRONGTYPE", "Operation against a key holding the wrong kind of value"),
                _ => server_error("NOSCRIPT", "No matching script"),
            }).collect();
            prop_assert_eq!(lacks_a_script(&replies), outcomes.contains(&3));
            if let Some((_, acks)) = wait {
                replies.push(Value::Int(acks));
            }
            let batch = renewals(outcomes.len())?;
            let results = renewal_results(replies, &batch, wait.map(|(n, _)| n));
            let replicated = wait.is_none_or(|(n, acks)| acks >= i64::from(n));
            prop_assert_eq!(results.len(), outcomes.len());
            for (o, r) in outcomes.iter().zip(&results) {
                match (o, r) {
                    (0, Ok(true)) => prop_assert!(replicated),
                    (0, Err(e)) => {
                        prop_assert!(!replicated);
                        prop_assert_eq!(e.kind(), crate::ErrorKind::NotReplicated);
                    }
                    (1, Ok(false)) => {}
                    (2 | 3, Err(e)) => prop_assert_eq!(e.kind(), crate::ErrorKind::Backend),
                    _ => prop_assert!(false, "{} gave {:?}", o, r),
                }
            }
        }

        #[test]
        fn transactions_split_into_exactly_their_replies(reply in prop::collection::vec(value(), 0..6)) {
            let len = reply.len();
            match replies::<3>(reply, "t") {
                Ok(parts) => prop_assert_eq!(parts.len(), len),
                Err(e) => {
                    prop_assert_ne!(len, 3);
                    prop_assert_eq!(e.kind(), crate::ErrorKind::Backend);
                }
            }
        }
    }
}
