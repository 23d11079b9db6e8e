//! Front-door API keys: which presented key is which ([`Keys::authenticate`]), whether a request
//! of that key may run now ([`Keys::admit`]) and what it spent ([`Keys::record`]), the keys added
//! and revoked at run time ([`Keys::add`], [`Keys::remove`]) and the fleet's usage per key and
//! model ([`Keys::usage`]).
//!
//! Keys come from three places: `http.api_keys` (plain, unlimited and not counted, named
//! `api_keys[i]`), `[[http.keys]]` of this node's config, and keys added with `mesh-cli keys add`,
//! stored (SHA-256 and policy only, never the key) in the system namespace `http_keys` of the
//! replicated memory, so every node knows them within replication time.
//!
//! Usage is counted per key name, per model, per node and per UTC day in the system namespace
//! `http_key_usage` (key `name/YYYY-MM-DD/node id`): each node writes only its own records, so
//! there is no write conflict, and the fleet's total is the sum over nodes, read from this
//! node's replica. A request counts as started before it runs, with a reservation of everything
//! it is granted: an upper bound of its prompt (what [`Ask`] says) and the `max_tokens` it may
//! write. So concurrent requests see each other, and on one node a key's token limits hold
//! whatever the concurrency; see docs/src/operations/keys.md for how far concurrent nodes can
//! pass a budget. A request's [`Charge`] settles once with what it spent, or, dropped unsettled,
//! with its whole reservation. Records of days before the previous month are collected
//! ([`Keys::collect`]).
//!
//! This module decides and counts; it speaks no HTTP or protobuf (the front door and
//! `rpc::keys` translate), and it decides nothing about who may add or remove keys (`rpc::keys`
//! does, with the admission policy).

mod limits;
mod store;
mod usage;

pub(crate) use limits::{Ask, Charge, Refusal};
#[cfg(test)]
pub(crate) use store::KeySource;
pub use store::key_sha256;
pub(crate) use store::{KeyGrant, KeyInfo, Keys, KeysError};
pub(crate) use usage::{KeyUsage, ModelCount};

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use mesh_domain::{
        KeyLimits, KeyPolicy, Usage,
        api_key::{KeyStatement, MAX_SIGNING_SKEW_MS},
        keys::HTTP_KEY_USAGE,
        statement::StatementKind,
        time::now_ms as unix_ms,
    };

    use super::{
        limits::{DEFAULT_GRANT, LimitKind},
        store::read_key_file,
        *,
    };
    use crate::{
        config::{HttpConfig, HttpKey, KeySecret, Listen},
        memory::{
            MemoryOptions, sync_from,
            test_support::{InProcess, id, open_memory},
        },
    };

    /// 2026-11-25 10:00:30 UTC.
    const NOW: u64 = 1_795_600_830_000;

    fn http(keys: Vec<HttpKey>, api_keys: &[&str]) -> HttpConfig {
        HttpConfig {
            listen: Listen {
                addr: "127.0.0.1:0".parse().expect("addr"),
                fallback: false,
            },
            api_keys: api_keys.iter().map(|k| (*k).to_owned()).collect(),
            keys,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            unknown_fields: crate::config::UnknownFields::default(),
            model_aliases: Vec::new(),
            loopback_without_key: false,
        }
    }

    fn configured(name: &str, key: &str, policy: KeyPolicy) -> HttpKey {
        HttpKey {
            name: name.into(),
            secret: KeySecret::Sha256(key_sha256(key)),
            policy,
        }
    }

    fn limited(limits: KeyLimits) -> KeyPolicy {
        KeyPolicy {
            limits,
            ..KeyPolicy::default()
        }
    }

    /// Two nodes knowing the key `team` (`sk-team-0123456789`) with `limits`, and its grant.
    fn team(limits: KeyLimits, tag: &str) -> (Fleet, KeyGrant) {
        let config = http(
            vec![configured("team", "sk-team-0123456789", limited(limits))],
            &[],
        );
        let fleet = Fleet::new(&config, tag);
        let grant = fleet
            .a
            .authenticate("sk-team-0123456789")
            .expect("read")
            .expect("the configured key");
        (fleet, grant)
    }

    /// Two nodes' key registries with the same config, and a link to pull between them.
    struct Fleet {
        _dirs: Vec<tempfile::TempDir>,
        a: Keys,
        b: Keys,
        link: InProcess,
    }

    impl Fleet {
        fn new(config: &HttpConfig, tag: &str) -> Self {
            let (ida, idb) = (id(&format!("{tag}-a")), id(&format!("{tag}-b")));
            let (da, ma) = open_memory(&ida, MemoryOptions::default());
            let (db, mb) = open_memory(&idb, MemoryOptions::default());
            let link = InProcess::default();
            link.0
                .lock()
                .expect("lock")
                .extend([(ida.to_string(), ma.clone()), (idb.to_string(), mb.clone())]);
            Self {
                _dirs: vec![da, db],
                a: Keys::new(ma, config).expect("keys"),
                b: Keys::new(mb, config).expect("keys"),
                link,
            }
        }

        /// `to` pulls everything `from` wrote.
        async fn replicate(&self, from: &Keys, to: &Keys) {
            let peer = from.memory.own_id().clone();
            sync_from(&to.memory, &self.link, &peer, peer.as_str())
                .await
                .expect("sync");
        }
    }

    fn usage(prompt: u64, completion: u64) -> Usage {
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
        }
    }

    /// A request with no prompt to speak of, asking `max_tokens` in each of `choices`.
    fn asks(max_tokens: Option<u64>, choices: u32) -> Ask {
        Ask {
            prompt: 0,
            completion: max_tokens,
            choices,
        }
    }

    #[tokio::test]
    async fn a_day_budget_holds_whichever_node_is_used_and_names_when_it_resets() {
        let (fleet, grant) = team(
            KeyLimits {
                max_tokens_per_day: Some(100),
                ..KeyLimits::default()
            },
            "budget",
        );
        // Node A: no max_tokens asked, so the model may write what the day has left.
        let first = fleet
            .a
            .admit_at(&grant, "m1", asks(None, 1), NOW)
            .await
            .expect("admitted");
        assert_eq!(first.max_tokens, Some(100));
        fleet.a.record_at(first, usage(10, 50), NOW).await;
        fleet.fleet_sync_a_to_b().await;
        // Node B sees A's 60 tokens: a request there may spend 40 more at most.
        let second = fleet
            .b
            .admit_at(&grant, "m1", asks(Some(500), 1), NOW + 1000)
            .await
            .expect("admitted");
        assert_eq!(second.max_tokens, Some(40));
        fleet.b.record_at(second, usage(5, 35), NOW + 1000).await;
        fleet.replicate(&fleet.b, &fleet.a).await;
        let refused = fleet
            .a
            .admit_at(&grant, "m1", asks(None, 1), NOW + 2000)
            .await
            .expect_err("the day's budget is spent");
        let tomorrow = 1_795_651_200_000; // 2026-11-26 00:00 UTC
        assert_eq!(
            refused,
            Refusal::Limit {
                key: "team".into(),
                kind: LimitKind::MaxTokensPerDay,
                limit: 100,
                used: 100,
                needed: 0,
                resets_at_ms: tomorrow,
                retry_after_s: (tomorrow - NOW - 2000) / 1000,
            }
        );
        assert!(
            refused.to_string().contains("max_tokens_per_day"),
            "{refused}"
        );
        // The next UTC day starts afresh.
        fleet
            .a
            .admit_at(&grant, "m1", asks(None, 1), tomorrow + 1)
            .await
            .expect("a new day");
    }

    impl Fleet {
        async fn fleet_sync_a_to_b(&self) {
            self.replicate(&self.a, &self.b).await;
        }
    }

    #[tokio::test]
    async fn a_running_request_reserves_its_tokens_so_concurrent_ones_see_them() {
        let (fleet, grant) = team(
            KeyLimits {
                max_tokens_per_day: Some(100),
                ..KeyLimits::default()
            },
            "reserve",
        );
        let running = fleet
            .a
            .admit_at(&grant, "m1", asks(Some(80), 1), NOW)
            .await
            .expect("first");
        assert_eq!(running.max_tokens, Some(80));
        let second = fleet
            .a
            .admit_at(&grant, "m1", asks(None, 1), NOW)
            .await
            .expect("second");
        assert_eq!(second.max_tokens, Some(20), "80 are reserved by the first");
        fleet
            .a
            .admit_at(&grant, "m1", asks(None, 1), NOW)
            .await
            .expect_err("the reservations take the whole day");
        // The first ends having spent 30: its 50 unspent tokens are free again.
        fleet.a.record_at(running, usage(10, 20), NOW).await;
        let third = fleet
            .a
            .admit_at(&grant, "m1", asks(None, 1), NOW)
            .await
            .expect("third");
        assert_eq!(third.max_tokens, Some(50));
        fleet.a.record_at(third, usage(0, 0), NOW).await;
        // Two choices share what is left (the second's 20 are still reserved): 25 each.
        let two = fleet
            .a
            .admit_at(&grant, "m1", asks(Some(40), 2), NOW)
            .await
            .expect("n = 2");
        assert_eq!((two.max_tokens, two.reserved()), (Some(25), 50));
    }

    /// Issue 26, item 4: every concurrent request of a key was granted all the key had left,
    /// reserved at most 4,096 tokens of it and nothing for its prompt, so what the requests
    /// running at once could spend grew with their number. Each now reserves its prompt's
    /// upper bound and every token it is granted: however many run at once on a node, all
    /// they may spend together stays within the limit, and one past it is refused.
    #[tokio::test]
    async fn concurrent_requests_on_a_node_cannot_spend_past_a_token_limit() {
        const LIMIT: u64 = 100_000;
        const PROMPT: u64 = 300;
        let (fleet, grant) = team(
            KeyLimits {
                max_tokens_per_day: Some(LIMIT),
                ..KeyLimits::default()
            },
            "concurrent",
        );
        let ask = Ask {
            prompt: PROMPT,
            completion: None,
            choices: 1,
        };
        let mut running = Vec::new();
        let refusal = loop {
            match fleet.a.admit_at(&grant, "m1", ask, NOW).await {
                Ok(admission) => running.push(admission),
                Err(refusal) => break refusal,
            }
            assert!(running.len() < 1000, "admitted without end");
        };
        assert!(
            running.len() > 1,
            "requests of a key still run side by side"
        );
        assert_eq!(running[0].max_tokens, Some(DEFAULT_GRANT as u32));
        // The worst each may spend: its prompt at its bound, its answer at its max_tokens.
        let worst: Vec<u64> = running
            .iter()
            .map(|a| PROMPT + u64::from(a.max_tokens.expect("limited")))
            .collect();
        assert!(
            worst.iter().sum::<u64>() <= LIMIT,
            "{} requests may spend {} of a limit of {LIMIT}",
            running.len(),
            worst.iter().sum::<u64>()
        );
        assert!(
            matches!(
                refusal,
                Refusal::Limit {
                    kind: LimitKind::MaxTokensPerDay,
                    ..
                }
            ),
            "{refusal:?}"
        );
        for (admission, worst) in running.into_iter().zip(worst) {
            fleet
                .a
                .record_at(admission, usage(PROMPT, worst - PROMPT), NOW)
                .await;
        }
        let spent = fleet.a.usage_at(NOW).expect("usage")[0].tokens_today;
        assert!(spent <= LIMIT, "{spent} spent of {LIMIT}");
    }

    /// A request whose prompt may be more than the key has left is refused before it runs,
    /// with what it needs; while running requests hold what it needs, the refusal says to
    /// retry when they end (`Retry-After: 1`).
    #[tokio::test]
    async fn a_prompt_larger_than_what_is_left_is_refused_before_it_runs() {
        let (fleet, grant) = team(
            KeyLimits {
                max_tokens_per_day: Some(1000),
                ..KeyLimits::default()
            },
            "prompt",
        );
        let big = Ask {
            prompt: 1000,
            completion: None,
            choices: 1,
        };
        let refused = fleet
            .a
            .admit_at(&grant, "m1", big, NOW)
            .await
            .expect_err("1000 prompt tokens and an answer do not fit in 1000");
        assert!(
            refused
                .to_string()
                .contains("less than this request may take: 1001"),
            "{refused}"
        );
        let holding = fleet
            .a
            .admit_at(&grant, "m1", asks(Some(600), 1), NOW)
            .await
            .expect("600 fit");
        let held = fleet
            .a
            .admit_at(&grant, "m1", Ask { prompt: 500, ..big }, NOW)
            .await
            .expect_err("600 are held");
        assert!(
            matches!(
                held,
                Refusal::Limit {
                    retry_after_s: 1,
                    needed: 501,
                    ..
                }
            ),
            "{held:?}"
        );
        fleet.a.record_at(holding, usage(0, 10), NOW).await;
        let admitted = fleet
            .a
            .admit_at(&grant, "m1", Ask { prompt: 500, ..big }, NOW)
            .await
            .expect("fits once the first ended");
        assert_eq!(admitted.max_tokens, Some(490));
        assert_eq!(admitted.reserved(), 990);
    }

    /// A charge dropped unsettled (its handler dropped as the client hung up) is settled with
    /// its whole reservation, as tokens spent, not left as a reservation that never shows in
    /// the key's usage.
    #[tokio::test]
    async fn a_charge_dropped_unsettled_is_charged_its_reservation() {
        let (fleet, grant) = team(
            KeyLimits {
                max_tokens_per_day: Some(1000),
                ..KeyLimits::default()
            },
            "drop",
        );
        let keys = Arc::new(fleet.a);
        let charge = keys
            .admit(
                &grant,
                "m1",
                Ask {
                    prompt: 20,
                    completion: Some(100),
                    choices: 1,
                },
            )
            .await
            .expect("admitted");
        assert_eq!(charge.reserved(), 120);
        drop(charge);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let usage = loop {
            let usage = keys.usage().expect("usage").remove(0);
            if usage.reserved_today == 0 || std::time::Instant::now() > deadline {
                break usage;
            }
            tokio::time::sleep(Duration::from_millis(10)).await; // poll again until the deadline
        };
        assert_eq!(usage.reserved_today, 0, "the reservation was never settled");
        assert_eq!(usage.tokens_today, 120);
        assert_eq!(usage.today["m1"].completion_tokens, 120);
    }

    /// A key's id is the key's, not its name's: the same key under two names has one id, and
    /// two keys under one name have two. Only a plain key or one with the `mcp` scope may use
    /// `/mcp`.
    #[test]
    fn a_keys_id_follows_its_secret_and_mcp_needs_the_scope() {
        let alice = KeyGrant::named("alice", "sk-alice-0123456789");
        assert_eq!(
            alice.id,
            KeyGrant::named("renamed", "sk-alice-0123456789").id
        );
        assert_ne!(alice.id, KeyGrant::named("alice", "sk-other-0123456789").id);
        assert_ne!(alice.id, hex::encode(key_sha256("sk-alice-0123456789")));
        let refused = alice.may_use_mcp().expect_err("no scope");
        assert!(refused.to_string().contains("mcp = true"), "{refused}");
        let scoped = KeyGrant {
            policy: KeyPolicy {
                mcp: true,
                ..KeyPolicy::default()
            },
            ..alice.clone()
        };
        assert!(scoped.may_use_mcp().is_ok());
        let plain = KeyGrant {
            source: KeySource::ApiKeys,
            ..alice
        };
        assert!(plain.may_use_mcp().is_ok());
    }

    #[tokio::test]
    async fn requests_per_minute_are_counted_over_the_fleet_and_reset_with_the_minute() {
        let config = http(
            vec![configured(
                "bot",
                "sk-bot-0123456789ab",
                limited(KeyLimits {
                    requests_per_minute: Some(2),
                    ..KeyLimits::default()
                }),
            )],
            &[],
        );
        let fleet = Fleet::new(&config, "rpm");
        let grant = fleet
            .a
            .authenticate("sk-bot-0123456789ab")
            .expect("read")
            .expect("key");
        let one = fleet
            .a
            .admit_at(&grant, "m1", asks(None, 1), NOW)
            .await
            .expect("one");
        assert_eq!(one.max_tokens, None, "no token limit: nothing capped");
        // A failed request still counts.
        fleet.a.record_at(one, Usage::default(), NOW).await;
        fleet.replicate(&fleet.a, &fleet.b).await;
        fleet
            .b
            .admit_at(&grant, "m1", asks(None, 1), NOW)
            .await
            .expect("two");
        fleet.replicate(&fleet.b, &fleet.a).await;
        let refused = fleet
            .a
            .admit_at(&grant, "m1", asks(None, 1), NOW + 5_000)
            .await
            .expect_err("two this minute already");
        let Refusal::Limit {
            kind,
            retry_after_s,
            ..
        } = refused
        else {
            panic!("a limit: {refused:?}")
        };
        assert_eq!(kind, LimitKind::RequestsPerMinute);
        assert_eq!(retry_after_s, 25, "the minute ends at 10:01:00");
        fleet
            .a
            .admit_at(&grant, "m1", asks(None, 1), NOW + 30_000)
            .await
            .expect("the next minute");
    }

    #[tokio::test]
    async fn a_key_may_use_only_its_models_and_the_refusal_names_both() {
        let policy = KeyPolicy {
            models: vec!["small".into()],
            ..KeyPolicy::default()
        };
        let config = http(vec![configured("team", "sk-team-0123456789", policy)], &[]);
        let fleet = Fleet::new(&config, "models");
        let grant = fleet
            .a
            .authenticate("sk-team-0123456789")
            .expect("read")
            .expect("key");
        fleet
            .a
            .admit_at(&grant, "small", asks(None, 1), NOW)
            .await
            .expect("allowed");
        let refused = fleet
            .a
            .admit_at(&grant, "big", asks(None, 1), NOW)
            .await
            .expect_err("not its model");
        let message = refused.to_string();
        assert!(matches!(refused, Refusal::Model { .. }), "{refused:?}");
        assert!(
            message.contains("`team`") && message.contains("`big`"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn keys_added_at_run_time_authenticate_until_removed_and_config_names_stay() {
        let config = http(
            vec![configured(
                "team",
                "sk-team-0123456789",
                KeyPolicy::default(),
            )],
            &["plain-key-0123456789"],
        );
        let fleet = Fleet::new(&config, "runtime");
        assert!(fleet.a.authenticate("sk-mesh-new").expect("read").is_none());
        let hash = hex::encode(key_sha256("sk-mesh-new"));
        let (info, first) = fleet
            .a
            .add(
                "new",
                &hash,
                limited(KeyLimits {
                    requests_per_minute: Some(3),
                    ..KeyLimits::default()
                }),
                None,
                None,
            )
            .await
            .expect("added");
        assert_eq!(info.source, KeySource::Runtime);
        assert!(!first, "the node's config has keys already");
        fleet.replicate(&fleet.a, &fleet.b).await;
        let grant = fleet
            .b
            .authenticate("sk-mesh-new")
            .expect("read")
            .expect("replicated");
        assert_eq!(grant.name, "new");
        assert_eq!(grant.policy.limits.requests_per_minute, Some(3));
        assert!(matches!(
            fleet
                .b
                .add("new", &hash, KeyPolicy::default(), None, None)
                .await,
            Err(KeysError::Exists(_))
        ));
        assert!(matches!(
            fleet
                .b
                .add("team", &hash, KeyPolicy::default(), None, None)
                .await,
            Err(KeysError::InConfig(_))
        ));
        assert!(matches!(
            fleet.b.remove("team").await,
            Err(KeysError::InConfig(_))
        ));
        assert!(matches!(
            fleet
                .b
                .add("x", "abc", KeyPolicy::default(), None, None)
                .await,
            Err(KeysError::Invalid(_))
        ));
        let names: Vec<(String, KeySource)> = fleet
            .b
            .list()
            .expect("list")
            .into_iter()
            .map(|k| (k.name, k.source))
            .collect();
        assert_eq!(
            names,
            [
                ("api_keys[0]".to_owned(), KeySource::ApiKeys),
                ("team".to_owned(), KeySource::Config),
                ("new".to_owned(), KeySource::Runtime)
            ]
        );
        fleet.b.remove("new").await.expect("removed");
        fleet.replicate(&fleet.b, &fleet.a).await;
        assert!(fleet.a.authenticate("sk-mesh-new").expect("read").is_none());
        assert!(
            fleet
                .a
                .list()
                .expect("list")
                .iter()
                .all(|k| k.name != "!required")
        );
        assert!(matches!(
            fleet.a.remove("new").await,
            Err(KeysError::NotFound(_))
        ));
        // A plain key is known by its index, and never counted in the memory.
        let plain = fleet
            .a
            .authenticate("plain-key-0123456789")
            .expect("read")
            .expect("plain");
        assert_eq!(plain.name, "api_keys[0]");
        for wrong in [
            "",
            "plain-key-012345678",
            "plain-key-0123456789 ",
            "PLAIN-KEY-0123456789",
        ] {
            assert!(
                fleet.a.authenticate(wrong).expect("read").is_none(),
                "{wrong:?}"
            );
        }
        let admitted = fleet
            .a
            .admit_at(&plain, "m1", asks(Some(7), 1), NOW)
            .await
            .expect("ok");
        assert_eq!(admitted.max_tokens, Some(7));
        fleet.a.record_at(admitted, usage(1, 1), NOW).await;
        assert!(
            fleet
                .a
                .memory
                .list(HTTP_KEY_USAGE, "", 10)
                .expect("list")
                .is_empty()
        );
    }

    /// Regression: revoking the last key added at run time must not open the front door to
    /// everyone again.
    #[tokio::test]
    async fn a_fleet_that_added_a_key_keeps_needing_keys_after_removing_it() {
        let fleet = Fleet::new(&http(Vec::new(), &[]), "required");
        assert!(!fleet.a.required().expect("read"), "no keys: open");
        let hash = hex::encode(key_sha256("sk-mesh-only"));
        let (_, first) = fleet
            .a
            .add("only", &hash, KeyPolicy::default(), None, None)
            .await
            .expect("add");
        assert!(first, "the first key closes the door");
        fleet.replicate(&fleet.a, &fleet.b).await;
        assert!(fleet.b.required().expect("read"));
        fleet.b.remove("only").await.expect("remove");
        fleet.replicate(&fleet.b, &fleet.a).await;
        for keys in [&fleet.a, &fleet.b] {
            assert!(keys.required().expect("read"), "still keyed");
            assert!(keys.authenticate("sk-mesh-only").expect("read").is_none());
            assert!(keys.list().expect("list").is_empty());
        }
        let (_, first) = fleet
            .a
            .add("again", &hash, KeyPolicy::default(), None, None)
            .await
            .expect("add");
        assert!(!first, "the door was closed already");
        // A caller on the node's own machine needs a key too, unless the node says otherwise.
        assert!(fleet.a.required_from(true).expect("read"));
        fleet.a.set_loopback_without_key(true);
        assert!(!fleet.a.required_from(true).expect("read"));
        assert!(fleet.a.required_from(false).expect("read"), "only loopback");
    }

    #[tokio::test]
    async fn usage_sums_the_fleet_per_model_for_the_day_and_the_month() {
        let config = http(
            vec![configured(
                "team",
                "sk-team-0123456789",
                KeyPolicy::default(),
            )],
            &[],
        );
        let fleet = Fleet::new(&config, "usage");
        let grant = fleet
            .a
            .authenticate("sk-team-0123456789")
            .expect("read")
            .expect("key");
        let yesterday = NOW - 24 * 3600 * 1000;
        for (keys, model, at, (p, c)) in [
            (&fleet.a, "m1", yesterday, (1, 2)),
            (&fleet.a, "m1", NOW, (10, 20)),
            (&fleet.b, "m1", NOW, (100, 200)),
            (&fleet.b, "m2", NOW, (5, 5)),
        ] {
            let admitted = keys
                .admit_at(&grant, model, asks(None, 1), at)
                .await
                .expect("admit");
            keys.record_at(admitted, usage(p, c), at).await;
        }
        fleet.replicate(&fleet.b, &fleet.a).await;
        let all = fleet.a.usage_at(NOW).expect("usage");
        assert_eq!(all.len(), 1);
        let team = &all[0];
        assert_eq!(
            team.today["m1"],
            ModelCount {
                requests: 2,
                prompt_tokens: 110,
                completion_tokens: 220
            }
        );
        assert_eq!(team.month["m1"].requests, 3);
        assert_eq!(team.month["m1"].completion_tokens, 222);
        assert_eq!(team.today["m2"].prompt_tokens, 5);
        assert_eq!(team.tokens_today, 340);
        assert_eq!(team.tokens_month, 343);
        assert_eq!(team.day_resets_at_ms, 1_795_651_200_000);
        assert_eq!(team.month_resets_at_ms, 1_796_083_200_000); // 2026-12-01
    }

    #[tokio::test]
    async fn a_nodes_usage_records_older_than_the_previous_month_are_collected() {
        let config = http(
            vec![configured(
                "team",
                "sk-team-0123456789",
                KeyPolicy::default(),
            )],
            &[],
        );
        let fleet = Fleet::new(&config, "collect");
        let grant = fleet
            .a
            .authenticate("sk-team-0123456789")
            .expect("read")
            .expect("key");
        let day = Duration::from_secs(24 * 3600).as_millis() as u64;
        // Today, in October (the previous month: kept) and in September (collected); B's old
        // record is B's to collect.
        for (keys, at) in [
            (&fleet.a, NOW),
            (&fleet.a, NOW - 30 * day),
            (&fleet.a, NOW - 60 * day),
            (&fleet.b, NOW - 60 * day),
        ] {
            let admitted = keys
                .admit_at(&grant, "m1", asks(None, 1), at)
                .await
                .expect("admit");
            keys.record_at(admitted, usage(1, 1), at).await;
        }
        fleet.replicate(&fleet.b, &fleet.a).await;
        assert_eq!(fleet.a.collect(NOW).await.expect("collect"), 1);
        let left: Vec<String> = fleet
            .a
            .memory
            .list(HTTP_KEY_USAGE, "", 10)
            .expect("list")
            .into_iter()
            .map(|e| e.key)
            .collect();
        assert_eq!(left.len(), 3, "{left:?}");
        assert!(
            !left
                .iter()
                .any(|k| k.contains("2026-09-") && k.ends_with(fleet.a.memory.own_id().as_str()))
        );
        assert_eq!(fleet.a.collect(NOW).await.expect("again"), 0);
    }

    #[cfg(unix)]
    /// Issue 26, item 1: a key is stored only with the calling operator's own signed
    /// statement of exactly this key, signed now (every node checks it again before storing
    /// the record; `memory::writers`).
    #[tokio::test]
    async fn a_key_is_added_only_with_its_operators_own_statement_of_it() {
        use mesh_cert::{CertIdentity, OriginSigner, statement::sign};
        use mesh_domain::CertRole;

        let mesh = crate::memory::test_support::CaMesh::new("keys-me");
        let keys = Keys::new(mesh.memory.clone(), &http(Vec::new(), &[])).expect("keys");
        let ada = mesh.member("ada", CertRole::Client);
        let bob = mesh.member("bob", CertRole::Client);
        let node = mesh.member("laptop", CertRole::Node);
        let by = CertIdentity::from_der(ada.certificate())
            .expect("certificate")
            .principal();
        let hash = hex::encode(key_sha256("sk-mesh-signed"));
        let statement = |by: &OriginSigner, name: &str, signed_ms: u64| {
            let statement = KeyStatement {
                name: name.into(),
                sha256: hash.clone(),
                policy: KeyPolicy::default(),
                signed_ms,
            };
            sign(
                by,
                StatementKind::KeyAdd,
                serde_json::to_vec(&statement).expect("json"),
            )
            .expect("sign")
        };
        let now = unix_ms();
        for (what, grant) in [
            ("no statement", None),
            ("a node's", Some(statement(&node, "k", now))),
            ("another person's", Some(statement(&bob, "k", now))),
            ("another key's", Some(statement(&ada, "other", now))),
            (
                "an old one",
                Some(statement(&ada, "k", now - 2 * MAX_SIGNING_SKEW_MS)),
            ),
        ] {
            let refused = keys
                .add("k", &hash, KeyPolicy::default(), Some(&by), grant)
                .await;
            assert!(
                matches!(refused, Err(KeysError::Statement(_))),
                "{what}: {refused:?}"
            );
        }
        assert!(keys.authenticate("sk-mesh-signed").expect("read").is_none());
        keys.add(
            "k",
            &hash,
            KeyPolicy::default(),
            Some(&by),
            Some(statement(&ada, "k", now)),
        )
        .await
        .expect("the operator's own statement");
        assert!(keys.authenticate("sk-mesh-signed").expect("read").is_some());
    }

    #[test]
    fn a_key_file_must_be_the_owners_alone_and_hold_a_key() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("team.key");
        std::fs::write(&path, "sk-team-0123456789\n").expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let message = read_key_file("team", &path)
            .expect_err("readable by others")
            .to_string();
        assert!(
            message.contains("chmod 600") && message.contains("team"),
            "{message}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert_eq!(
            read_key_file("team", &path).expect("read"),
            key_sha256("sk-team-0123456789")
        );
        std::fs::write(&path, "short\n").expect("write");
        assert!(read_key_file("team", &path).is_err());
    }
}
