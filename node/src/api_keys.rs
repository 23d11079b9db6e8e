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
//! node's replica. A request counts as started before it runs (its request, and a reservation of
//! up to [`RESERVATION_CAP`] tokens of its capped `max_tokens`), so concurrent requests see each
//! other; see docs/operations.md for how far concurrent nodes can pass a budget. Records of days
//! before the previous month are collected ([`Keys::collect`]).
//!
//! This module decides and counts; it speaks no HTTP or protobuf (the front door and
//! `rpc::keys` translate), and it decides nothing about who may add or remove keys (`rpc::keys`
//! does, with the admission policy).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use chrono::{DateTime, Datelike, Months, NaiveDate, Utc};
use mesh_domain::{
    KeyPolicy, Target, Usage,
    api_key::check_key_name,
    keys::{HTTP_KEY_USAGE, HTTP_KEYS},
    time::now_ms as unix_ms,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::{
    config::{HttpConfig, KeySecret},
    memory::{Memory, MemoryError},
    metrics::{labels, metrics},
};

/// How a key made by `mesh-cli keys add` starts.
pub const KEY_PREFIX: &str = "sk-mesh-";
/// The record in `http_keys` that says keys were added at run time (no key name can be it):
/// from then on every front door of the fleet needs a key, also once the keys are removed, so
/// revoking the last key never opens the door to everyone.
const KEYS_REQUIRED: &str = "!required";
/// Most keys the fleet keeps in the memory: each request's authentication reads them all.
pub const MAX_RUNTIME_KEYS: usize = 1000;
/// Most tokens a request reserves against a token limit when it is admitted: the capped
/// `max_tokens` up to this. A larger reservation would serialise a key's requests while a
/// long answer runs; a smaller one lets concurrent requests pass a budget by more.
pub const RESERVATION_CAP: u64 = 4096;
impl Admission {
    /// Tokens reserved for the request while it runs.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }
}

/// Most usage records read for one key's month: 31 days times this many nodes writing.
const MAX_MONTH_RECORDS: usize = 31 * 1000;

/// What can go wrong managing keys.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// No key of that name (to remove).
    #[error("no key named `{0}` was added at run time (`mesh-cli keys list` shows the keys)")]
    NotFound(String),
    /// A key of that name exists.
    #[error(
        "a key named `{0}` exists already: remove it first (`mesh-cli keys rm {0}`) or choose another name"
    )]
    Exists(String),
    /// The key is in this node's config, which only its file changes.
    #[error(
        "key `{0}` is defined in this node's config ([[http.keys]] or http.api_keys): edit the file and restart the node to change it"
    )]
    InConfig(String),
    /// A name, hash or policy that is not valid.
    #[error("{0}")]
    Invalid(String),
    /// The fleet holds [`MAX_RUNTIME_KEYS`] keys.
    #[error(
        "the fleet holds {MAX_RUNTIME_KEYS} keys added at run time, the most it keeps: remove unused ones (`mesh-cli keys rm NAME`)"
    )]
    Full,
    /// A configured key file that cannot be used.
    #[error("http.keys `{name}`: key_file {}: {problem}", path.display())]
    KeyFile {
        /// The key's name.
        name: String,
        /// The file.
        path: PathBuf,
        /// What is wrong and how to fix it.
        problem: String,
    },
    /// The memory failed.
    #[error(transparent)]
    Memory(#[from] MemoryError),
}

/// A key added at run time, as the memory stores it (JSON).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredKey {
    /// The key's SHA-256, hex.
    sha256: String,
    /// What it may do.
    policy: KeyPolicy,
    /// When it was added (Unix ms).
    created_ms: u64,
}

/// Where a key is defined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeySource {
    /// `http.api_keys` (unlimited, not counted).
    ApiKeys,
    /// `[[http.keys]]` of this node's config.
    Config,
    /// Added with `mesh-cli keys add`, in the replicated memory.
    Runtime,
}

impl KeySource {
    /// `api_keys`, `config` or `runtime`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ApiKeys => "api_keys",
            Self::Config => "config",
            Self::Runtime => "runtime",
        }
    }
}

/// A key as `Keys.List` shows it: never its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyInfo {
    /// Its name.
    pub name: String,
    /// Where it is defined.
    pub source: KeySource,
    /// What it may do.
    pub policy: KeyPolicy,
    /// When it was added (Unix ms; 0 for a configured key).
    pub created_ms: u64,
}

/// Who a presented key is: what the front door hands the gateway as the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyGrant {
    /// The key's name (`api_keys[i]` for a plain key).
    pub name: String,
    /// Where it is defined.
    pub source: KeySource,
    /// What it may do.
    pub policy: KeyPolicy,
}

impl KeyGrant {
    /// A grant of key `name` from the config, without limits (for tests of what keys own).
    #[cfg(test)]
    pub fn named(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            source: KeySource::Config,
            policy: KeyPolicy::default(),
        }
    }

    /// Whether its usage is counted (plain `http.api_keys` are not: they stay as cheap as
    /// they were).
    fn counted(&self) -> bool {
        self.source != KeySource::ApiKeys
    }
}

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// `max_tokens_per_day`.
    MaxTokensPerDay,
    /// `max_tokens_per_month`.
    MaxTokensPerMonth,
    /// `requests_per_minute`.
    RequestsPerMinute,
    /// `tokens_per_minute`.
    TokensPerMinute,
}

impl LimitKind {
    /// The setting's name, as the config and the CLI spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MaxTokensPerDay => "max_tokens_per_day",
            Self::MaxTokensPerMonth => "max_tokens_per_month",
            Self::RequestsPerMinute => "requests_per_minute",
            Self::TokensPerMinute => "tokens_per_minute",
        }
    }
}

/// Why a key may not run a request now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The key may not ask for this model or role (HTTP 403).
    #[error(
        "key `{key}` may not use `{model}` (it may use: {allowed}); ask the mesh's operator for a key that allows it"
    )]
    Model {
        /// The key's name.
        key: String,
        /// What was asked for.
        model: String,
        /// What it may use.
        allowed: String,
    },
    /// A limit is reached (HTTP 429).
    #[error("key `{key}` reached its {} of {limit} ({used} used, fleet-wide); it resets in {retry_after_s} s (at {})", kind.as_str(), iso(*resets_at_ms))]
    Limit {
        /// The key's name.
        key: String,
        /// Which limit.
        kind: LimitKind,
        /// The limit.
        limit: u64,
        /// How much of it the fleet used.
        used: u64,
        /// When it resets (Unix ms).
        resets_at_ms: u64,
        /// Seconds until then, at least 1 (the `Retry-After` header).
        retry_after_s: u64,
    },
    /// Counting the request failed (the memory): it is not run uncounted.
    #[error("cannot count this request against key `{key}`: {problem}")]
    Unavailable {
        /// The key's name.
        key: String,
        /// What failed.
        problem: String,
    },
}

/// A request admitted: what it may ask of the model, and what [`Keys::record`] needs to settle
/// its count. Dropping it without recording leaves its reservation in place until the day ends
/// (the conservative side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// `max_tokens` to send to the model: the request's, capped to what the key's token limits
    /// have left (`None`: the request's own, unlimited).
    pub max_tokens: Option<u32>,
    /// The key's name.
    key: String,
    /// Whether it is counted in the memory (plain `http.api_keys` are not).
    counted: bool,
    /// The model or role asked for, as the usage is kept.
    model: String,
    /// The UTC day it was counted in.
    day: NaiveDate,
    /// Tokens reserved.
    reserved: u64,
}

/// One model's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelCount {
    /// Requests started (failed ones too).
    pub requests: u64,
    /// Prompt tokens the models reported.
    pub prompt_tokens: u64,
    /// Completion tokens the models reported.
    pub completion_tokens: u64,
}

impl ModelCount {
    fn add(&mut self, other: &Self) {
        self.requests += other.requests;
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
    }

    fn tokens(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }
}

/// One node's usage of one key on one UTC day: the value of a usage record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct NodeDay {
    /// Counts by model (or role) asked for.
    models: BTreeMap<String, ModelCount>,
    /// Tokens reserved by requests still running.
    reserved: u64,
    /// The calendar minute the minute counts are of (Unix ms / 60 000).
    minute: u64,
    /// Requests started in that minute.
    minute_requests: u64,
    /// Tokens (and reservations) counted in that minute.
    minute_tokens: u64,
}

/// A key's fleet-wide usage now, with its limits and when each resets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyUsage {
    /// The key's name.
    pub name: String,
    /// Its limits (default: none, for a name this node has no key of).
    pub policy: KeyPolicy,
    /// Today's counts by model.
    pub today: BTreeMap<String, ModelCount>,
    /// This month's counts by model.
    pub month: BTreeMap<String, ModelCount>,
    /// Tokens today, reservations of running requests included (what `max_tokens_per_day` is
    /// checked against).
    pub tokens_today: u64,
    /// Tokens this month, reservations included.
    pub tokens_month: u64,
    /// Requests started this minute.
    pub requests_this_minute: u64,
    /// Tokens this minute, reservations included.
    pub tokens_this_minute: u64,
    /// When the day's budget resets (next UTC midnight, Unix ms).
    pub day_resets_at_ms: u64,
    /// When the month's budget resets (the 1st of next month, UTC, Unix ms).
    pub month_resets_at_ms: u64,
    /// When the per-minute limits reset (Unix ms).
    pub minute_resets_at_ms: u64,
}

/// A configured key: its name, hash and policy.
#[derive(Debug, Clone)]
struct ConfiguredKey {
    name: String,
    sha256: [u8; 32],
    source: KeySource,
    policy: KeyPolicy,
}

/// The node's keys and their usage.
#[derive(Debug)]
pub struct Keys {
    memory: Arc<Memory>,
    /// `http.api_keys` and `[[http.keys]]`, hashed.
    configured: Vec<ConfiguredKey>,
    /// Held while this node reads and rewrites its own usage records: an admission's check and
    /// its count must not interleave with another's on this node.
    counting: tokio::sync::Mutex<()>,
    /// `http.loopback_without_key` (a runtime setting): a caller on this machine needs no key.
    loopback_without_key: AtomicBool,
}

/// SHA-256 of a key.
pub fn key_sha256(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl Keys {
    /// The keys of `http` (reading and checking key files) and those the memory holds.
    pub fn new(memory: Arc<Memory>, http: &HttpConfig) -> Result<Self, KeysError> {
        let mut configured: Vec<ConfiguredKey> = http
            .api_keys
            .iter()
            .enumerate()
            .map(|(i, key)| ConfiguredKey {
                name: format!("api_keys[{i}]"),
                sha256: key_sha256(key),
                source: KeySource::ApiKeys,
                policy: KeyPolicy::default(),
            })
            .collect();
        for key in &http.keys {
            let sha256 = match &key.secret {
                KeySecret::Sha256(hash) => *hash,
                KeySecret::File(path) => read_key_file(&key.name, path)?,
            };
            configured.push(ConfiguredKey {
                name: key.name.clone(),
                sha256,
                source: KeySource::Config,
                policy: key.policy.clone(),
            });
        }
        Ok(Self {
            memory,
            configured,
            counting: tokio::sync::Mutex::new(()),
            loopback_without_key: AtomicBool::new(http.loopback_without_key),
        })
    }

    /// Changes `http.loopback_without_key` (a runtime setting).
    pub fn set_loopback_without_key(&self, exempt: bool) {
        self.loopback_without_key.store(exempt, Ordering::Relaxed);
    }

    /// Whether a request from a caller on this machine (`loopback`) or elsewhere needs a key:
    /// [`Keys::required`], unless the caller is on this machine and `http.loopback_without_key`
    /// lets it in.
    pub fn required_from(&self, loopback: bool) -> Result<bool, MemoryError> {
        if loopback && self.loopback_without_key.load(Ordering::Relaxed) {
            return Ok(false);
        }
        self.required()
    }

    /// Whether the front door needs a key: one is configured here, or the fleet ever added
    /// one at run time.
    pub fn required(&self) -> Result<bool, MemoryError> {
        Ok(!self.configured.is_empty()
            || self
                .memory
                .get(HTTP_KEYS, KEYS_REQUIRED)?
                .is_some_and(|record| !record.tombstone))
    }

    /// The key `presented` is, if any. Hashes are compared in constant time (a configured
    /// plain key is only as secret as its hash here).
    pub fn authenticate(&self, presented: &str) -> Result<Option<KeyGrant>, MemoryError> {
        let hash = key_sha256(presented);
        let mut found = None;
        for key in &self.configured {
            if bool::from(key.sha256.ct_eq(&hash)) && found.is_none() {
                found = Some(KeyGrant {
                    name: key.name.clone(),
                    source: key.source,
                    policy: key.policy.clone(),
                });
            }
        }
        if found.is_some() {
            return Ok(found);
        }
        let hex = hex::encode(hash);
        for (name, stored) in self.runtime_keys()? {
            if bool::from(stored.sha256.as_bytes().ct_eq(hex.as_bytes())) {
                return Ok(Some(KeyGrant {
                    name,
                    source: KeySource::Runtime,
                    policy: stored.policy,
                }));
            }
        }
        Ok(None)
    }

    /// The keys added at run time, by name (a record that does not decode is skipped and
    /// logged: one bad record must not lock every key out).
    fn runtime_keys(&self) -> Result<Vec<(String, StoredKey)>, MemoryError> {
        Ok(self
            .memory
            .list(HTTP_KEYS, "", MAX_RUNTIME_KEYS + 2)?
            .into_iter()
            .filter(|entry| entry.key != KEYS_REQUIRED)
            .filter_map(|entry| match serde_json::from_slice(&entry.record.value) {
                Ok(stored) => Some((entry.key, stored)),
                Err(e) => {
                    tracing::warn!(key = %entry.key, error = %e, "skipping a stored front-door key that does not decode");
                    None
                }
            })
            .collect())
    }

    /// Every key: this node's configured ones, then those added at run time.
    pub fn list(&self) -> Result<Vec<KeyInfo>, MemoryError> {
        let mut keys: Vec<KeyInfo> = self
            .configured
            .iter()
            .map(|key| KeyInfo {
                name: key.name.clone(),
                source: key.source,
                policy: key.policy.clone(),
                created_ms: 0,
            })
            .collect();
        keys.extend(
            self.runtime_keys()?
                .into_iter()
                .map(|(name, stored)| KeyInfo {
                    name,
                    source: KeySource::Runtime,
                    policy: stored.policy,
                    created_ms: stored.created_ms,
                }),
        );
        Ok(keys)
    }

    /// Adds a key known by its SHA-256 (`sha256_hex`, 64 hex digits): the key itself never
    /// reaches the node. Also says whether it is the first key the front doors need (from now
    /// on every one of them needs a key).
    pub async fn add(
        &self,
        name: &str,
        sha256_hex: &str,
        policy: KeyPolicy,
    ) -> Result<(KeyInfo, bool), KeysError> {
        check_key_name(name).map_err(KeysError::Invalid)?;
        let hash = hex::decode(sha256_hex)
            .ok()
            .filter(|bytes| bytes.len() == 32)
            .ok_or_else(|| KeysError::Invalid("sha256: must be 64 hex digits".into()))?;
        check_policy(&policy)?;
        if self.configured.iter().any(|key| key.name == name) {
            return Err(KeysError::InConfig(name.to_owned()));
        }
        let existing = self.runtime_keys()?;
        if existing.iter().any(|(have, _)| have == name) {
            return Err(KeysError::Exists(name.to_owned()));
        }
        if existing.len() >= MAX_RUNTIME_KEYS {
            return Err(KeysError::Full);
        }
        let stored = StoredKey {
            sha256: hex::encode(hash),
            policy,
            created_ms: unix_ms(),
        };
        let first = !self.required()?;
        if first {
            self.memory
                .put(HTTP_KEYS, KEYS_REQUIRED, Some(b"1".to_vec()))
                .await?;
        }
        let value = serde_json::to_vec(&stored).expect("a key serialises");
        self.memory.put(HTTP_KEYS, name, Some(value)).await?;
        let info = KeyInfo {
            name: name.to_owned(),
            source: KeySource::Runtime,
            policy: stored.policy,
            created_ms: stored.created_ms,
        };
        Ok((info, first))
    }

    /// Revokes a key added at run time: every node refuses it once the tombstone reaches it.
    pub async fn remove(&self, name: &str) -> Result<(), KeysError> {
        if self.configured.iter().any(|key| key.name == name) {
            return Err(KeysError::InConfig(name.to_owned()));
        }
        match self.memory.get(HTTP_KEYS, name) {
            Ok(Some(record)) if !record.tombstone => {}
            Ok(_) | Err(MemoryError::Invalid(_)) => return Err(KeysError::NotFound(name.into())),
            Err(e) => return Err(e.into()),
        }
        self.memory.put(HTTP_KEYS, name, None).await?;
        Ok(())
    }

    /// Admits a request of `grant` for `model` asking for `max_tokens` in each of `choices`
    /// answers, now.
    pub async fn admit(
        &self,
        grant: &KeyGrant,
        model: &str,
        max_tokens: Option<u32>,
        choices: u32,
    ) -> Result<Admission, Refusal> {
        self.admit_at(grant, model, max_tokens, choices, unix_ms())
            .await
    }

    /// [`Keys::admit`] at `now_ms`: checks the model, then every limit against the fleet's
    /// usage, caps `max_tokens` so that all `choices` together fit in what the token limits
    /// have left, and counts the request (with its reservation) before it runs.
    pub async fn admit_at(
        &self,
        grant: &KeyGrant,
        model: &str,
        max_tokens: Option<u32>,
        choices: u32,
        now_ms: u64,
    ) -> Result<Admission, Refusal> {
        let target = model
            .parse::<Target>()
            .unwrap_or_else(|_| Target::Model(model.to_owned()));
        if !grant.policy.allows(&target) {
            count_refusal(&grant.name, "model");
            return Err(Refusal::Model {
                key: grant.name.clone(),
                model: model.to_owned(),
                allowed: allowed(&grant.policy),
            });
        }
        let day = day_of(now_ms);
        if !grant.counted() {
            metrics()
                .http_key_requests
                .get_or_create(&labels(&[("key", &grant.name), ("model", model)]))
                .inc();
            return Ok(Admission {
                max_tokens,
                key: grant.name.clone(),
                counted: false,
                model: model.to_owned(),
                day,
                reserved: 0,
            });
        }
        let unavailable = |e: MemoryError| Refusal::Unavailable {
            key: grant.name.clone(),
            problem: e.to_string(),
        };
        let _counting = self.counting.lock().await;
        let usage = self.fleet_usage(&grant.name, now_ms).map_err(unavailable)?;
        let limits = grant.policy.limits;
        let minute_end = (now_ms / 60_000 + 1) * 60_000;
        let checks = [
            (
                LimitKind::MaxTokensPerMonth,
                limits.max_tokens_per_month,
                usage.tokens_month,
                usage.month_resets_at_ms,
            ),
            (
                LimitKind::MaxTokensPerDay,
                limits.max_tokens_per_day,
                usage.tokens_today,
                usage.day_resets_at_ms,
            ),
            (
                LimitKind::TokensPerMinute,
                limits.tokens_per_minute,
                usage.tokens_this_minute,
                minute_end,
            ),
            (
                LimitKind::RequestsPerMinute,
                limits.requests_per_minute,
                usage.requests_this_minute,
                minute_end,
            ),
        ];
        // Of the limits reached, the one that resets last: retrying earlier cannot help.
        if let Some((kind, limit, used, resets_at_ms)) = checks
            .iter()
            .filter_map(|&(kind, limit, used, resets)| {
                limit
                    .filter(|&l| used >= l)
                    .map(|l| (kind, l, used, resets))
            })
            .max_by_key(|&(_, _, _, resets)| resets)
        {
            count_refusal(&grant.name, kind.as_str());
            return Err(Refusal::Limit {
                key: grant.name.clone(),
                kind,
                limit,
                used,
                resets_at_ms,
                retry_after_s: resets_at_ms.saturating_sub(now_ms).div_ceil(1000).max(1),
            });
        }
        let left = checks
            .iter()
            .filter(|(kind, ..)| *kind != LimitKind::RequestsPerMinute)
            .filter_map(|&(_, limit, used, _)| limit.map(|l| l - used))
            .min();
        let (max_tokens, reserved) = match left {
            None => (max_tokens, 0),
            Some(left) => {
                let choices = u64::from(choices.max(1));
                let share = (left / choices).max(1);
                let capped = max_tokens.map_or(share, |asked| u64::from(asked).min(share));
                (
                    Some(u32::try_from(capped).unwrap_or(u32::MAX)),
                    (capped * choices).min(RESERVATION_CAP),
                )
            }
        };
        self.update_own(&grant.name, day, |record| {
            record.models.entry(model.to_owned()).or_default().requests += 1;
            record.reserved += reserved;
            let minute = now_ms / 60_000;
            if record.minute != minute {
                record.minute = minute;
                record.minute_requests = 0;
                record.minute_tokens = 0;
            }
            record.minute_requests += 1;
            record.minute_tokens += reserved;
        })
        .await
        .map_err(unavailable)?;
        metrics()
            .http_key_requests
            .get_or_create(&labels(&[("key", &grant.name), ("model", model)]))
            .inc();
        Ok(Admission {
            max_tokens,
            key: grant.name.clone(),
            counted: true,
            model: model.to_owned(),
            day,
            reserved,
        })
    }

    /// Settles an admitted request: what the model reported (`None` for a request that failed:
    /// it stays counted as a request, with no tokens), releasing its reservation.
    pub async fn record(&self, admission: Admission, usage: Option<Usage>) {
        self.record_at(admission, usage, unix_ms()).await;
    }

    /// [`Keys::record`] at `now_ms`. A failure to write is logged: the request already ran.
    pub async fn record_at(&self, admission: Admission, usage: Option<Usage>, now_ms: u64) {
        let (prompt, completion) = usage.map_or((0, 0), |u| (u.prompt_tokens, u.completion_tokens));
        let name = admission.key.as_str();
        let tokens = metrics();
        for (kind, n) in [("prompt", prompt), ("completion", completion)] {
            tokens
                .http_key_tokens
                .get_or_create(&labels(&[
                    ("key", name),
                    ("model", &admission.model),
                    ("kind", kind),
                ]))
                .inc_by(n);
        }
        if !admission.counted {
            // Not counted in the memory; the metrics above say what a plain key spent.
            return;
        }
        let _counting = self.counting.lock().await;
        let written = self
            .update_own(name, admission.day, |record| {
                let count = record.models.entry(admission.model.clone()).or_default();
                count.prompt_tokens += prompt;
                count.completion_tokens += completion;
                record.reserved = record.reserved.saturating_sub(admission.reserved);
                let minute = now_ms / 60_000;
                if record.minute == minute {
                    record.minute_tokens = record.minute_tokens.saturating_sub(admission.reserved)
                        + prompt
                        + completion;
                } else {
                    record.minute = minute;
                    record.minute_requests = 0;
                    record.minute_tokens = prompt + completion;
                }
            })
            .await;
        if let Err(e) = written {
            tracing::warn!(key = name, error = %e, "cannot record a front-door request's usage");
        }
    }

    /// Reads, changes and writes this node's record of key `name` for `day`. Called with
    /// `counting` held.
    async fn update_own(
        &self,
        name: &str,
        day: NaiveDate,
        change: impl FnOnce(&mut NodeDay),
    ) -> Result<(), MemoryError> {
        let key = format!("{name}/{day}/{}", self.memory.own_id());
        let mut record: NodeDay = match self.memory.get(HTTP_KEY_USAGE, &key)? {
            Some(stored) if !stored.tombstone => {
                serde_json::from_slice(&stored.value).unwrap_or_default()
            }
            _ => NodeDay::default(),
        };
        change(&mut record);
        let value = serde_json::to_vec(&record).expect("a usage record serialises");
        self.memory.put(HTTP_KEY_USAGE, &key, Some(value)).await?;
        Ok(())
    }

    /// The fleet's usage of key `name` at `now_ms`, summed over every node's records in this
    /// node's replica.
    fn fleet_usage(&self, name: &str, now_ms: u64) -> Result<KeyUsage, MemoryError> {
        let now = datetime(now_ms);
        let today = now.date_naive();
        let month_start = today.with_day(1).expect("day 1 exists");
        let next_month = month_start + Months::new(1);
        let minute = now_ms / 60_000;
        let mut usage = KeyUsage {
            name: name.to_owned(),
            policy: KeyPolicy::default(),
            today: BTreeMap::new(),
            month: BTreeMap::new(),
            tokens_today: 0,
            tokens_month: 0,
            requests_this_minute: 0,
            tokens_this_minute: 0,
            day_resets_at_ms: midnight_ms(today.succ_opt().expect("a next day")),
            month_resets_at_ms: midnight_ms(next_month),
            minute_resets_at_ms: (minute + 1) * 60_000,
        };
        let prefix = format!("{name}/{}", month_start.format("%Y-%m-"));
        for entry in self
            .memory
            .list(HTTP_KEY_USAGE, &prefix, MAX_MONTH_RECORDS)?
        {
            let Some(day) = entry
                .key
                .split('/')
                .nth(1)
                .and_then(|d| d.parse::<NaiveDate>().ok())
            else {
                continue;
            };
            let Ok(record) = serde_json::from_slice::<NodeDay>(&entry.record.value) else {
                continue;
            };
            let tokens: u64 = record.models.values().map(ModelCount::tokens).sum();
            usage.tokens_month += tokens + record.reserved;
            for (model, count) in &record.models {
                usage.month.entry(model.clone()).or_default().add(count);
            }
            if day == today {
                usage.tokens_today += tokens + record.reserved;
                for (model, count) in &record.models {
                    usage.today.entry(model.clone()).or_default().add(count);
                }
                if record.minute == minute {
                    usage.requests_this_minute += record.minute_requests;
                    usage.tokens_this_minute += record.minute_tokens;
                }
            }
        }
        Ok(usage)
    }

    /// Usage of every key this node knows, and of every name the fleet counted this month.
    pub fn usage(&self) -> Result<Vec<KeyUsage>, MemoryError> {
        self.usage_at(unix_ms())
    }

    /// [`Keys::usage`] at `now_ms`.
    pub fn usage_at(&self, now_ms: u64) -> Result<Vec<KeyUsage>, MemoryError> {
        let mut names: BTreeMap<String, KeyPolicy> = self
            .list()?
            .into_iter()
            .filter(|key| key.source != KeySource::ApiKeys)
            .map(|key| (key.name, key.policy))
            .collect();
        // Names counted by other nodes' configs, or revoked this month.
        let month = datetime(now_ms).format("%Y-%m-").to_string();
        let mut after = String::new();
        loop {
            let page = self
                .memory
                .page(HTTP_KEY_USAGE, "", &after, 1000, usize::MAX)?;
            for entry in &page.entries {
                let mut parts = entry.key.split('/');
                if let (Some(name), Some(day)) = (parts.next(), parts.next())
                    && day.starts_with(&month)
                {
                    names.entry(name.to_owned()).or_default();
                }
            }
            match page.next_after {
                Some(next) => after = next,
                None => break,
            }
        }
        names
            .into_iter()
            .map(|(name, policy)| {
                let mut usage = self.fleet_usage(&name, now_ms)?;
                usage.policy = policy;
                Ok(usage)
            })
            .collect()
    }

    /// Deletes this node's usage records of days before the previous month (a month's budget
    /// needs only its own days; the previous month stays for `keys usage` history), so the
    /// records stay bounded by keys × nodes × about 62 days. Returns how many it deleted.
    pub async fn collect(&self, now_ms: u64) -> Result<usize, MemoryError> {
        let keep_from = datetime(now_ms)
            .date_naive()
            .with_day(1)
            .expect("day 1 exists")
            - Months::new(1);
        let own = format!("/{}", self.memory.own_id());
        let mut old = Vec::new();
        let mut after = String::new();
        loop {
            let page = self
                .memory
                .page(HTTP_KEY_USAGE, "", &after, 1000, usize::MAX)?;
            for entry in &page.entries {
                let day = entry
                    .key
                    .split('/')
                    .nth(1)
                    .and_then(|d| d.parse::<NaiveDate>().ok());
                if entry.key.ends_with(&own) && day.is_none_or(|day| day < keep_from) {
                    old.push(entry.key.clone());
                }
            }
            match page.next_after {
                Some(next) => after = next,
                None => break,
            }
        }
        for key in &old {
            self.memory.put(HTTP_KEY_USAGE, key, None).await?;
        }
        Ok(old.len())
    }
}

/// Checks a policy from the wire as the config checks one.
fn check_policy(policy: &KeyPolicy) -> Result<(), KeysError> {
    for (field, list) in [("models", &policy.models), ("roles", &policy.roles)] {
        if list.iter().any(|name| name.trim().is_empty()) {
            return Err(KeysError::Invalid(format!(
                "{field}: a name is empty; list names, or none to allow everything"
            )));
        }
    }
    let limits = policy.limits;
    for (field, value) in [
        ("max_tokens_per_day", limits.max_tokens_per_day),
        ("max_tokens_per_month", limits.max_tokens_per_month),
        ("requests_per_minute", limits.requests_per_minute),
        ("tokens_per_minute", limits.tokens_per_minute),
    ] {
        if value == Some(0) {
            return Err(KeysError::Invalid(format!(
                "{field}: 0 would refuse every request; leave it out for no limit"
            )));
        }
    }
    Ok(())
}

/// Reads a configured key file: the key on its first line, the file the owner's alone.
fn read_key_file(name: &str, path: &Path) -> Result<[u8; 32], KeysError> {
    let problem = |problem: String| KeysError::KeyFile {
        name: name.to_owned(),
        path: path.to_owned(),
        problem,
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)
            .map_err(|e| problem(format!("cannot read it ({e})")))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(problem(format!(
                "is readable by others (mode {:o}): run `chmod 600 {}`",
                mode & 0o777,
                path.display()
            )));
        }
    }
    let text =
        std::fs::read_to_string(path).map_err(|e| problem(format!("cannot read it ({e})")))?;
    let key = text.lines().next().unwrap_or_default().trim();
    if key.len() < 16 {
        return Err(problem(
            "holds no key of at least 16 characters: write one (e.g. `openssl rand -hex 32`) on its first line".into(),
        ));
    }
    Ok(key_sha256(key))
}

/// What a policy allows, for a refusal.
fn allowed(policy: &KeyPolicy) -> String {
    let mut names: Vec<String> = policy.models.clone();
    names.extend(policy.roles.iter().map(|r| format!("role:{r}")));
    names.join(", ")
}

/// Counts a refusal of key `name` by `limit` (`model` for a model it may not use).
fn count_refusal(name: &str, limit: &str) {
    metrics()
        .http_key_refusals
        .get_or_create(&labels(&[("key", name), ("limit", limit)]))
        .inc();
}

fn datetime(ms: u64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(i64::try_from(ms).unwrap_or(i64::MAX)).unwrap_or_default()
}

fn day_of(ms: u64) -> NaiveDate {
    datetime(ms).date_naive()
}

fn midnight_ms(day: NaiveDate) -> u64 {
    u64::try_from(
        day.and_time(chrono::NaiveTime::MIN)
            .and_utc()
            .timestamp_millis(),
    )
    .unwrap_or(0)
}

/// `ms` as an RFC 3339 UTC time, for people.
fn iso(ms: u64) -> String {
    datetime(ms).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use mesh_domain::KeyLimits;

    use super::*;
    use crate::{
        config::{HttpConfig, HttpKey, Listen},
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

    fn usage(prompt: u64, completion: u64) -> Option<Usage> {
        Some(Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
        })
    }

    #[tokio::test]
    async fn a_day_budget_holds_whichever_node_is_used_and_names_when_it_resets() {
        let config = http(
            vec![configured(
                "team",
                "sk-team-0123456789",
                limited(KeyLimits {
                    max_tokens_per_day: Some(100),
                    ..KeyLimits::default()
                }),
            )],
            &[],
        );
        let fleet = Fleet::new(&config, "budget");
        let grant = fleet
            .a
            .authenticate("sk-team-0123456789")
            .expect("read")
            .expect("the configured key");
        // Node A: no max_tokens asked, so the model may write what the day has left.
        let first = fleet
            .a
            .admit_at(&grant, "m1", None, 1, NOW)
            .await
            .expect("admitted");
        assert_eq!(first.max_tokens, Some(100));
        fleet.a.record_at(first, usage(10, 50), NOW).await;
        fleet.fleet_sync_a_to_b().await;
        // Node B sees A's 60 tokens: a request there may spend 40 more at most.
        let second = fleet
            .b
            .admit_at(&grant, "m1", Some(500), 1, NOW + 1000)
            .await
            .expect("admitted");
        assert_eq!(second.max_tokens, Some(40));
        fleet.b.record_at(second, usage(5, 35), NOW + 1000).await;
        fleet.replicate(&fleet.b, &fleet.a).await;
        let refused = fleet
            .a
            .admit_at(&grant, "m1", None, 1, NOW + 2000)
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
            .admit_at(&grant, "m1", None, 1, tomorrow + 1)
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
        let config = http(
            vec![configured(
                "team",
                "sk-team-0123456789",
                limited(KeyLimits {
                    max_tokens_per_day: Some(100),
                    ..KeyLimits::default()
                }),
            )],
            &[],
        );
        let fleet = Fleet::new(&config, "reserve");
        let grant = fleet
            .a
            .authenticate("sk-team-0123456789")
            .expect("read")
            .expect("key");
        let running = fleet
            .a
            .admit_at(&grant, "m1", Some(80), 1, NOW)
            .await
            .expect("first");
        assert_eq!(running.max_tokens, Some(80));
        let second = fleet
            .a
            .admit_at(&grant, "m1", None, 1, NOW)
            .await
            .expect("second");
        assert_eq!(second.max_tokens, Some(20), "80 are reserved by the first");
        fleet
            .a
            .admit_at(&grant, "m1", None, 1, NOW)
            .await
            .expect_err("the reservations take the whole day");
        // The first ends having spent 30: its 50 unspent tokens are free again.
        fleet.a.record_at(running, usage(10, 20), NOW).await;
        let third = fleet
            .a
            .admit_at(&grant, "m1", None, 1, NOW)
            .await
            .expect("third");
        assert_eq!(third.max_tokens, Some(50));
        fleet.a.record_at(third, usage(0, 0), NOW).await;
        // Two choices share what is left (the second's 20 are still reserved): 25 each.
        let two = fleet
            .a
            .admit_at(&grant, "m1", Some(40), 2, NOW)
            .await
            .expect("n = 2");
        assert_eq!((two.max_tokens, two.reserved()), (Some(25), 50));
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
            .admit_at(&grant, "m1", None, 1, NOW)
            .await
            .expect("one");
        assert_eq!(one.max_tokens, None, "no token limit: nothing capped");
        // A failed request still counts.
        fleet.a.record_at(one, None, NOW).await;
        fleet.replicate(&fleet.a, &fleet.b).await;
        fleet
            .b
            .admit_at(&grant, "m1", None, 1, NOW)
            .await
            .expect("two");
        fleet.replicate(&fleet.b, &fleet.a).await;
        let refused = fleet
            .a
            .admit_at(&grant, "m1", None, 1, NOW + 5_000)
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
            .admit_at(&grant, "m1", None, 1, NOW + 30_000)
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
            .admit_at(&grant, "small", None, 1, NOW)
            .await
            .expect("allowed");
        let refused = fleet
            .a
            .admit_at(&grant, "big", None, 1, NOW)
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
            fleet.b.add("new", &hash, KeyPolicy::default()).await,
            Err(KeysError::Exists(_))
        ));
        assert!(matches!(
            fleet.b.add("team", &hash, KeyPolicy::default()).await,
            Err(KeysError::InConfig(_))
        ));
        assert!(matches!(
            fleet.b.remove("team").await,
            Err(KeysError::InConfig(_))
        ));
        assert!(matches!(
            fleet.b.add("x", "abc", KeyPolicy::default()).await,
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
            .admit_at(&plain, "m1", Some(7), 1, NOW)
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
            .add("only", &hash, KeyPolicy::default())
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
            .add("again", &hash, KeyPolicy::default())
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
                .admit_at(&grant, model, None, 1, at)
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
                .admit_at(&grant, "m1", None, 1, at)
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
