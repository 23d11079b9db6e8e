//! The keys themselves: where each comes from (`http.api_keys`, `[[http.keys]]`, the ones added
//! at run time in the system namespace `http_keys`), which presented key is which
//! ([`Keys::authenticate`]), and adding, listing and removing them.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use mesh_domain::{
    KeyPolicy, Principal,
    api_key::{KEYS_REQUIRED, KeyStatement, MAX_SIGNING_SKEW_MS, RuntimeKey, check_key_name},
    keys::HTTP_KEYS,
    statement::{Signed, StatementKind},
    time::now_ms as unix_ms,
};
use serde::Serialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::{
    config::{HttpConfig, KeySecret},
    memory::{Memory, MemoryError},
};

/// Most keys the fleet keeps in the memory: each request's authentication reads them all.
pub(super) const MAX_RUNTIME_KEYS: usize = 1000;

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
pub(crate) enum KeySource {
    /// `http.api_keys` (unlimited, not counted).
    ApiKeys,
    /// `[[http.keys]]` of this node's config.
    Config,
    /// Added with `mesh-cli keys add`, in the replicated memory.
    Runtime,
}

impl KeySource {
    /// `api_keys`, `config` or `runtime`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::ApiKeys => "api_keys",
            Self::Config => "config",
            Self::Runtime => "runtime",
        }
    }
}

/// A key as `Keys.List` shows it: never its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct KeyInfo {
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
pub(crate) struct KeyGrant {
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
pub(super) fn key_id(sha256: &[u8; 32]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"agentmesh front-door key id\0");
    hasher.update(sha256);
    hex::encode(&hasher.finalize()[..16])
}

impl KeyGrant {
    /// A grant of the key `secret` named `name` from the config, without limits (for tests of
    /// what keys own).
    #[cfg(test)]
    pub(crate) fn named(name: &str, secret: &str) -> Self {
        Self {
            name: name.to_owned(),
            id: key_id(&key_sha256(secret)),
            source: KeySource::Config,
            policy: KeyPolicy::default(),
        }
    }
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
pub(crate) struct Keys {
    pub(super) memory: Arc<Memory>,
    /// `http.api_keys` and `[[http.keys]]`, hashed.
    configured: Vec<ConfiguredKey>,
    /// Held while this node reads and rewrites its own usage records: an admission's check and
    /// its count must not interleave with another's on this node.
    pub(super) counting: tokio::sync::Mutex<()>,
    /// `http.loopback_without_key` (a runtime setting): a caller on this machine needs no key.
    loopback_without_key: AtomicBool,
}

/// SHA-256 of a key.
pub fn key_sha256(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl Keys {
    /// The keys of `http` (reading and checking key files) and those the memory holds.
    pub(crate) fn new(memory: Arc<Memory>, http: &HttpConfig) -> Result<Self, KeysError> {
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
    pub(crate) fn set_loopback_without_key(&self, exempt: bool) {
        self.loopback_without_key.store(exempt, Ordering::Relaxed);
    }

    /// Whether a request from a caller on this machine (`loopback`) or elsewhere needs a key:
    /// [`Keys::required`], unless the caller is on this machine and `http.loopback_without_key`
    /// lets it in.
    pub(crate) fn required_from(&self, loopback: bool) -> Result<bool, MemoryError> {
        if loopback && self.loopback_without_key.load(Ordering::Relaxed) {
            return Ok(false);
        }
        self.required()
    }

    /// Whether the front door needs a key: one is configured here, or the fleet ever added
    /// one at run time.
    pub(crate) fn required(&self) -> Result<bool, MemoryError> {
        Ok(!self.configured.is_empty()
            || self
                .memory
                .get(HTTP_KEYS, KEYS_REQUIRED)?
                .is_some_and(|record| !record.tombstone))
    }

    /// The key `presented` is, if any. Hashes are compared in constant time (a configured
    /// plain key is only as secret as its hash here).
    pub(crate) fn authenticate(&self, presented: &str) -> Result<Option<KeyGrant>, MemoryError> {
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
    pub(crate) fn list(&self) -> Result<Vec<KeyInfo>, MemoryError> {
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
    pub(crate) async fn add(
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
    pub(crate) async fn remove(&self, name: &str) -> Result<(), KeysError> {
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
pub(super) fn read_key_file(name: &str, path: &Path) -> Result<[u8; 32], KeysError> {
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
