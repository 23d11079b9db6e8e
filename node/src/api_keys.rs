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
    KeyPolicy, Principal, Target, Usage,
    api_key::{KEYS_REQUIRED, KeyStatement, MAX_SIGNING_SKEW_MS, RuntimeKey, check_key_name},
    keys::{HTTP_KEY_USAGE, HTTP_KEYS},
    statement::{Signed, StatementKind},
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
/// Most keys the fleet keeps in the memory: each request's authentication reads them all.
pub const MAX_RUNTIME_KEYS: usize = 1000;
/// `max_tokens` granted to a request of a key with a token limit that names none: what it
/// reserves of the key's budget while it runs. Everything the key has left would hold the
/// key's other requests off until it ends.
pub const DEFAULT_GRANT: u64 = 16_384;

impl Admission {
    /// Tokens reserved for the request while it runs: its prompt's upper bound and its granted
    /// `max_tokens`, per choice (0 for a key without token limits).
    pub fn reserved(&self) -> u64 {
        self.reserved
    }
}

/// An admitted request's charge against its key, settled once: with what the request spent
/// ([`Charge::settle`]), or, when it is dropped unsettled (the handler holding it was dropped:
/// its client went away before the outcome, or the node is stopping), in the background with
/// its whole reservation, the most the request was granted. A client cannot spend unseen by
/// hanging up.
#[derive(Debug)]
pub struct Charge {
    keys: Arc<Keys>,
    /// Until settled.
    admission: Option<Admission>,
}

impl Charge {
    /// `max_tokens` to send to the model (see [`Admission::max_tokens`]).
    pub fn max_tokens(&self) -> Option<u32> {
        self.admission.as_ref().and_then(|a| a.max_tokens)
    }

    /// Tokens reserved for the request while it runs.
    pub fn reserved(&self) -> u64 {
        self.admission.as_ref().map_or(0, Admission::reserved)
    }

    /// Settles the request with what it `spent`.
    pub async fn settle(mut self, spent: Usage) {
        if let Some(admission) = self.admission.take() {
            self.keys.record(admission, spent).await;
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let Some(admission) = self.admission.take() else {
            return;
        };
        let spent = Usage {
            prompt_tokens: 0,
            completion_tokens: admission.reserved,
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let keys = Arc::clone(&self.keys);
                runtime.spawn(async move { keys.record(admission, spent).await });
            }
            // No runtime (the node is gone): the reservation stays counted for the day.
            Err(_) => tracing::warn!(
                key = %admission.key,
                "a front-door request's charge was dropped outside the runtime; its reservation stays counted"
            ),
        }
    }
}

/// What a request asks of a key's budget, known before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    /// At most how many tokens one choice's prompt is (`mesh_domain::chat::prompt_token_bound`).
    pub prompt: u64,
    /// Tokens one choice may write (`max_tokens`); `None`: up to [`DEFAULT_GRANT`].
    pub completion: Option<u64>,
    /// How many choices: each reads the prompt and writes its own answer.
    pub choices: u32,
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
    /// The operator's signed statement of the key is missing, does not verify, or says
    /// something else than the request.
    #[error("{0}")]
    Statement(String),
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
    /// The key's name (`api_keys[i]` for a plain key): what its usage and limits are counted
    /// by, fleet-wide.
    pub name: String,
    /// The key's id ([`key_id`]): what it owns (stored responses) is owned by the key itself,
    /// so another key given the same name (on another node's config, or added after this one
    /// was revoked) owns none of it.
    pub id: String,
    /// Where it is defined.
    pub source: KeySource,
    /// What it may do.
    pub policy: KeyPolicy,
}

/// A key's id: a hash of its SHA-256 (domain-separated, so the id is no key hash a node
/// compares presented keys with), the same on every node that knows the key, in hex.
pub fn key_id(sha256: &[u8; 32]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"agentmesh front-door key id\0");
    hasher.update(sha256);
    hex::encode(&hasher.finalize()[..16])
}

impl KeyGrant {
    /// A grant of the key `secret` named `name` from the config, without limits (for tests of
    /// what keys own).
    #[cfg(test)]
    pub fn named(name: &str, secret: &str) -> Self {
        Self {
            name: name.to_owned(),
            id: key_id(&key_sha256(secret)),
            source: KeySource::Config,
            policy: KeyPolicy::default(),
        }
    }

    /// Whether it may use the front door's `/mcp`: a plain `http.api_keys` key (the node's
    /// own, unlimited) may, a named key only with the `mcp` scope.
    pub fn may_use_mcp(&self) -> Result<(), Refusal> {
        if self.source == KeySource::ApiKeys || self.policy.mcp {
            return Ok(());
        }
        count_refusal(&self.name, "mcp");
        Err(Refusal::Scope {
            key: self.name.clone(),
            scope: "mcp",
        })
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
    /// The key may not use this endpoint: it lacks the scope (HTTP 403).
    #[error(
        "key `{key}` has no `{scope}` scope, so it may not use /{scope}; ask the mesh's operator for a key with it ([[http.keys]] {scope} = true, or `mesh-cli keys add NAME --{scope}`)"
    )]
    Scope {
        /// The key's name.
        key: String,
        /// The scope it lacks.
        scope: &'static str,
    },
    /// A limit is reached, or what it has left is less than the request may take (HTTP 429).
    #[error("{}", limit_message(key, *kind, *limit, *used, *needed, *retry_after_s, *resets_at_ms))]
    Limit {
        /// The key's name.
        key: String,
        /// Which limit.
        kind: LimitKind,
        /// The limit.
        limit: u64,
        /// How much of it the fleet used, or reserved for requests still running.
        used: u64,
        /// What the request may take (its prompt's upper bound and one token per answer, per
        /// choice); 0 when the limit is simply reached.
        needed: u64,
        /// When it resets (Unix ms).
        resets_at_ms: u64,
        /// Seconds until it is worth retrying, at least 1 (the `Retry-After` header): when the
        /// limit resets, or, when running requests hold what the request needs, 1.
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
/// its count. Dropping it without recording leaves its reservation counted for the day (the
/// conservative side); the front door holds it in a [`Charge`], which settles it.
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
    /// Tokens reserved today by requests still running (part of `tokens_today`).
    pub reserved_today: u64,
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
                    id: key_id(&hash),
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
                    id: key_id(&hash),
                    source: KeySource::Runtime,
                    policy: stored.policy,
                }));
            }
        }
        Ok(None)
    }

    /// The keys added at run time, by name (a record that does not decode is skipped and
    /// logged: one bad record must not lock every key out).
    fn runtime_keys(&self) -> Result<Vec<(String, RuntimeKey)>, MemoryError> {
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
    /// reaches the node. With a CA, `grant` must be the caller's (`by`) own signed
    /// [`KeyStatement`] of this name, hash and policy, signed now; it is stored with the key,
    /// and every node checks it before it stores the key (the memory's writer rules). Also
    /// says whether it is the first key the front doors need (from now on every one of them
    /// needs a key).
    pub async fn add(
        &self,
        name: &str,
        sha256_hex: &str,
        policy: KeyPolicy,
        by: Option<&Principal>,
        grant: Option<Signed>,
    ) -> Result<(KeyInfo, bool), KeysError> {
        check_key_name(name).map_err(KeysError::Invalid)?;
        let hash = hex::decode(sha256_hex)
            .ok()
            .filter(|bytes| bytes.len() == 32)
            .ok_or_else(|| KeysError::Invalid("sha256: must be 64 hex digits".into()))?;
        check_policy(&policy)?;
        let grant = self.check_grant(name, &hex::encode(&hash), &policy, by, grant)?;
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
        let stored = RuntimeKey {
            sha256: hex::encode(hash),
            policy,
            created_ms: unix_ms(),
            grant,
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

    /// The statement a key is stored with: with a CA, `by`'s own signed statement of exactly
    /// this key, signed within [`MAX_SIGNING_SKEW_MS`] of now; without one (insecure mode),
    /// none.
    fn check_grant(
        &self,
        name: &str,
        sha256: &str,
        policy: &KeyPolicy,
        by: Option<&Principal>,
        grant: Option<Signed>,
    ) -> Result<Option<Signed>, KeysError> {
        let (Some(by), true) = (by, self.memory.has_ca()) else {
            return Ok(None);
        };
        let grant = grant.ok_or_else(|| {
            KeysError::Statement(
                "grant: a key must come with its operator's statement, signed with their own client key (mesh-cli keys add does it; upgrade an older mesh-cli)".into(),
            )
        })?;
        let statement: KeyStatement = grant.parse().map_err(KeysError::Statement)?;
        let now = unix_ms();
        if statement.signed_ms.abs_diff(now) > MAX_SIGNING_SKEW_MS {
            return Err(KeysError::Statement(format!(
                "grant: signed at {} ms, more than {} s from this node's clock; check the clocks and add the key again",
                statement.signed_ms,
                MAX_SIGNING_SKEW_MS / 1000
            )));
        }
        let signer = self
            .memory
            .verify_statement(StatementKind::KeyAdd, &grant, statement.signed_ms)
            .map_err(|e| KeysError::Statement(format!("grant: {e}")))?;
        if signer.id != by.id {
            return Err(KeysError::Statement(
                "grant: signed with another certificate than the one this call comes with".into(),
            ));
        }
        if statement.name != name || statement.sha256 != sha256 || &statement.policy != policy {
            return Err(KeysError::Statement(
                "grant: the signed statement names another key, hash or policy than the request"
                    .into(),
            ));
        }
        Ok(Some(grant))
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

    /// Admits a request of `grant` for `model` asking `ask`, now: the [`Charge`] that settles
    /// it, whichever way it ends.
    pub async fn admit(
        self: &Arc<Self>,
        grant: &KeyGrant,
        model: &str,
        ask: Ask,
    ) -> Result<Charge, Refusal> {
        let admission = self.admit_at(grant, model, ask, unix_ms()).await?;
        Ok(Charge {
            keys: Arc::clone(self),
            admission: Some(admission),
        })
    }

    /// [`Keys::admit`] at `now_ms`: checks the model, then every limit against the fleet's
    /// usage; refuses a request that would not fit in what the token limits have left (its
    /// prompt's upper bound and one token per choice); grants each choice `max_tokens` up to
    /// what is asked ([`DEFAULT_GRANT`] when nothing is) and what is left; and counts the
    /// request, reserving all it is granted, before it runs.
    pub async fn admit_at(
        &self,
        grant: &KeyGrant,
        model: &str,
        ask: Ask,
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
                max_tokens: ask.completion.map(saturating_u32),
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
                needed: 0,
                resets_at_ms,
                retry_after_s: resets_at_ms.saturating_sub(now_ms).div_ceil(1000).max(1),
            });
        }
        let choices = u64::from(ask.choices.max(1));
        // One token per answer, unless it writes none (embeddings).
        let least_answer = u64::from(ask.completion != Some(0));
        let needed = choices * (ask.prompt + least_answer);
        // The token limit with the least left decides the grant.
        let tightest = checks
            .iter()
            .filter(|(kind, ..)| *kind != LimitKind::RequestsPerMinute)
            .filter_map(|&(kind, limit, used, resets)| {
                limit.map(|l| (kind, l, used, resets, l - used))
            })
            .min_by_key(|&(.., left)| left);
        let (max_tokens, reserved) = match tightest {
            None => (ask.completion.map(saturating_u32), 0),
            Some((kind, limit, used, resets_at_ms, left)) if left < needed => {
                count_refusal(&grant.name, kind.as_str());
                // Running requests hold part of it: worth retrying once they end.
                let held = usage.reserved_today > 0
                    && limit >= needed + used.saturating_sub(usage.reserved_today);
                let retry_after_s = if held {
                    1
                } else {
                    resets_at_ms.saturating_sub(now_ms).div_ceil(1000).max(1)
                };
                return Err(Refusal::Limit {
                    key: grant.name.clone(),
                    kind,
                    limit,
                    used,
                    needed,
                    resets_at_ms,
                    retry_after_s,
                });
            }
            Some((.., left)) => {
                let share = left / choices - ask.prompt;
                let granted = ask.completion.unwrap_or(DEFAULT_GRANT).min(share);
                (
                    Some(saturating_u32(granted)),
                    choices * (ask.prompt + granted),
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

    /// Settles an admitted request with what it `spent` (the request stays counted, with these
    /// tokens), releasing its reservation.
    pub async fn record(&self, admission: Admission, spent: Usage) {
        self.record_at(admission, spent, unix_ms()).await;
    }

    /// [`Keys::record`] at `now_ms`. A failure to write is logged: the request already ran.
    pub async fn record_at(&self, admission: Admission, spent: Usage, now_ms: u64) {
        let (prompt, completion) = (spent.prompt_tokens, spent.completion_tokens);
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
            reserved_today: 0,
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
                usage.reserved_today += record.reserved;
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

/// `value` as a `u32`, `u32::MAX` when it is larger (a `max_tokens`).
fn saturating_u32(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

/// A [`Refusal::Limit`] for people: reached, or too little left for the request.
fn limit_message(
    key: &str,
    kind: LimitKind,
    limit: u64,
    used: u64,
    needed: u64,
    retry_after_s: u64,
    resets_at_ms: u64,
) -> String {
    let resets = format!("it resets in {retry_after_s} s (at {})", iso(resets_at_ms));
    if needed == 0 {
        return format!(
            "key `{key}` reached its {} of {limit} ({used} used, fleet-wide); {resets}",
            kind.as_str()
        );
    }
    let when = if retry_after_s == 1 {
        format!(
            "requests of the key still running hold part of it: retry when they end (it resets at {})",
            iso(resets_at_ms)
        )
    } else {
        resets
    };
    format!(
        "key `{key}` has {} of its {} of {limit} left ({used} used or held by running requests, fleet-wide), less than this request may take: {needed} tokens (its prompt counted as one token per byte, an upper bound, and one per answer); {when}",
        limit.saturating_sub(used),
        kind.as_str()
    )
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
