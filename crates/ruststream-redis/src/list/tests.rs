//! Unit tests of the list source's options, checks and key names.

use std::time::Duration;

use super::*;
use crate::keys::KeySpace;
use crate::policy::PublishPolicy;
use crate::transport::Transport;

/// The configuration error `l` is refused with.
fn err(l: &RedisList) -> ruststream_core::ConfigError {
    let e = l.validate(&KeySpace::default()).unwrap_err();
    e.config_error().cloned().expect("a configuration error")
}

#[test]
fn a_bad_option_is_refused_naming_the_option_and_the_list() {
    let e = err(&RedisList::new("jobs").reliable().concurrency(0));
    assert_eq!(e.option, "concurrency");
    assert_eq!(e.subject.as_deref(), Some("jobs"));
    assert_eq!(
        e.to_string(),
        "`concurrency` of `jobs`: must be at least 1; set it to 1 or more, how many messages are handled at once"
    );
    let e = err(&RedisList::new("jobs").max_attempts(0));
    assert_eq!(e.option, "max_attempts");
    assert_eq!(e.subject.as_deref(), Some("jobs"));
}

#[test]
fn recovery_needs_min_idle_and_a_longer_ttl() {
    let l = RedisList::new("{t}").reliable().recovery_zset("{t}.claims");
    let e = err(&l);
    assert_eq!(
        (e.option.as_ref(), e.subject.as_deref()),
        ("recovery_zset", Some("{t}"))
    );
    assert!(e.problem.contains("needs min_idle"), "{e}");
    let l = l.min_idle(Duration::from_secs(60));
    assert!(l.validate(&KeySpace::default()).is_ok());
    assert_eq!(
        err(&l.recovery_ttl(Duration::from_secs(60))).option,
        "recovery_ttl"
    );
    // Recovery is on by default: min_idle alone sets how soon a dead worker's claims return.
    assert!(
        RedisList::new("q")
            .reliable()
            .min_idle(Duration::from_secs(1))
            .validate(&KeySpace::default())
            .is_ok()
    );
    let both = RedisList::new("q")
        .reliable()
        .no_recovery()
        .min_idle(Duration::from_secs(1));
    assert_eq!(err(&both).option, "no_recovery");
    let simple = err(&RedisList::new("q").no_recovery());
    assert_eq!(simple.option, "recovery options");
    assert_eq!(simple.fix, "add `.reliable()`");
}

#[test]
fn a_reliable_list_records_its_claims_unless_told_not_to() {
    let space = KeySpace::new(String::new(), true);
    let keys = RedisList::new("{t}").reliable().keys(&space);
    assert_eq!(keys.recovery.as_deref(), Some("{t}.claims"));
    let none = RedisList::new("{t}").reliable().no_recovery().keys(&space);
    assert_eq!(none.recovery, None);
    let named = RedisList::new("{t}")
        .reliable()
        .recovery_zset("{t}.z")
        .min_idle(Duration::from_secs(5))
        .keys(&space);
    assert_eq!(named.recovery.as_deref(), Some("{t}.z"));
    assert_eq!(RedisList::new("q").keys(&space).recovery, None);
}

#[test]
fn on_a_cluster_untagged_simple_lists_pass_and_untagged_reliable_ones_get_the_tag() {
    let cluster = KeySpace::new("app:".into(), true);
    let simple = RedisList::new("cache.warmups");
    let keys = simple.keys(&cluster).used_together();
    assert!(
        keys.contains(&"{app:cache.warmups}.delayed".to_owned()),
        "{keys:?}"
    );
    assert!(
        keys.contains(&"{app:cache.warmups}.dead".to_owned()),
        "{keys:?}"
    );
    assert!(simple.validate(&cluster).is_ok());
    let e = err_on(&RedisList::new("jobs").reliable(), &cluster);
    assert_eq!(
        (e.option.as_ref(), e.subject.as_deref()),
        ("key", Some("jobs"))
    );
    assert!(e.fix.contains("hash tag: `{jobs}`"), "{e}");
    let tagged = RedisList::new("{thumbnails}")
        .reliable()
        .recovery_zset("{thumbnails}.claims")
        .min_idle(Duration::from_secs(1));
    assert!(tagged.validate(&cluster).is_ok());
    let stray = RedisList::new("{t}")
        .reliable()
        .recovery_zset("claims")
        .min_idle(Duration::from_secs(1));
    assert!(stray.validate(&cluster).is_err());
}

fn err_on(l: &RedisList, space: &KeySpace) -> ruststream_core::ConfigError {
    let e = l.validate(space).unwrap_err();
    e.config_error().cloned().expect("a configuration error")
}

#[test]
fn priority_levels_live_in_the_queues_slot_and_bad_counts_are_refused() {
    let cluster = KeySpace::new("app:".into(), true);
    let simple = RedisList::new("jobs").priorities(3);
    assert_eq!(
        simple.keys(&cluster).levels,
        ["{app:jobs}.p1", "{app:jobs}.p2"]
    );
    assert!(simple.validate(&cluster).is_ok());
    let route = simple.route().expect("a route with the levels");
    assert_eq!(route.partitions(), None);
    assert!(matches!(route, PublishPolicy::List(p) if p.layout.priorities == Some(3)));
    for n in [0, 1, 17] {
        let e = err(&RedisList::new("q").priorities(n));
        assert_eq!(e.option, "priorities");
        assert_eq!(e.subject.as_deref(), Some("q"));
        assert!(e.problem.contains("between 2 and 16"), "{e}");
    }
    assert!(
        err(&RedisList::new("q").priorities(1))
            .fix
            .contains("leave priorities out")
    );
    assert_eq!(RedisList::new("q").level_keys(), ["q"]);
    assert!(RedisList::new("q").route().is_none());
}

#[test]
fn a_rate_limit_and_priority_levels_combine() {
    let space = KeySpace::new(String::new(), false);
    let per = std::time::Duration::from_secs(1);
    for both in [
        RedisList::new("{q}")
            .reliable()
            .priorities(2)
            .rate_limit(10, per),
        RedisList::new("{q}")
            .priorities(3)
            .rate_limit_by("customer", 10, per),
    ] {
        both.validate(&space)
            .expect("a rate limit with priority levels starts");
    }
}

/// A settle with recovery sends its entries in their batches' order, as runs of consecutive
/// indices: five entries of two batches, interleaved and with a gap, are three runs.
#[test]
fn a_settle_sends_its_entries_as_runs_of_their_batches() {
    use bytes::Bytes;
    use fred::types::Value;

    use super::settle::{SettleKeys, SettleList};
    use crate::back::Dest;
    use crate::settle::Op;
    use crate::transport::InBatch;

    let at = |member: &'static str, index: usize| {
        Some(InBatch {
            member: Bytes::from_static(member.as_bytes()),
            index,
        })
    };
    let entries = vec![
        (Bytes::from_static(b"a0"), at("A", 0), Op::Ack),
        (Bytes::from_static(b"b0"), at("B", 0), Op::Ack),
        (Bytes::from_static(b"a1"), at("A", 1), Op::Ack),
        (
            Bytes::from_static(b"a3"),
            at("A", 3),
            Op::Retry {
                frame: Bytes::from_static(b"a3'"),
            },
        ),
        (Bytes::from_static(b"b1"), at("B", 1), Op::Ack),
    ];
    let keys = SettleKeys {
        processing: "q.processing".into(),
        dead: "q.dead".into(),
        delayed: "q.delayed".into(),
        payloads: "q.delayed.payloads".into(),
        record: "q.claims".into(),
        cancels: "q.cancels".into(),
    };
    let dest = Dest::list(vec!["q".into()]);
    let call = SettleList {
        keys: &keys,
        dest: &dest,
        token: None,
        entries,
    };
    let (_, args) = crate::lua::Call::build(&call);
    let bytes: Vec<Vec<u8>> = args
        .iter()
        .map(|v| match v {
            Value::Bytes(b) => b.to_vec(),
            Value::String(s) => s.as_bytes().to_vec(),
            other => format!("{other:?}").into_bytes(),
        })
        .collect();
    // The token, the destination (three), then the ops, runs, members and entries.
    let rest = &bytes[4..];
    assert_eq!(rest[0], b"aaraa", "ops in the batches' order");
    let run = |n: u16, first: u32, len: u16| {
        [
            &n.to_be_bytes()[..],
            &first.to_be_bytes(),
            &len.to_be_bytes(),
        ]
        .concat()
    };
    assert_eq!(
        rest[1],
        [run(1, 0, 2), run(1, 3, 1), run(2, 0, 2)].concat(),
        "three runs"
    );
    assert_eq!(rest[2], b"2");
    assert_eq!(&rest[3..5], [b"A".to_vec(), b"B".to_vec()]);
    let values: Vec<&[u8]> = rest[5..].iter().map(Vec::as_slice).collect();
    assert_eq!(values, [&b"a0"[..], b"a1", b"a3", b"a3'", b"b0", b"b1"]);
}

#[test]
fn a_lists_route_is_its_layout() {
    let list = RedisList::new("q").partitions(2).groups();
    let route = list.route().expect("a route with the layout");
    assert_eq!(
        route,
        PublishPolicy::List(crate::list::Publish::new().partitions(2).groups())
    );
    let levels = RedisList::new("q").priorities(3).route();
    assert_eq!(
        levels,
        Some(PublishPolicy::List(
            crate::list::Publish::new().priorities(3)
        ))
    );
}

#[test]
fn a_partition_keeps_the_layout_but_not_the_partitions_nor_the_rate_limit() {
    let per = Duration::from_secs(1);
    let list = RedisList::new("q")
        .reliable()
        .partitions(2)
        .priorities(3)
        .rate_limit(5, per);
    let parts = Transport::partitions(&list);
    assert_eq!(parts.len(), 2);
    let first = parts[0].describe().bindings;
    assert_eq!(first["priorities"], 3, "{first}");
    assert!(first.get("partitions").is_none(), "{first}");
    assert!(first.get("rateLimit").is_none(), "{first}");
    let whole = list.describe().bindings;
    assert_eq!(
        (whole["partitions"].clone(), whole["rateLimit"]["n"].clone()),
        (2.into(), 5.into())
    );
}
