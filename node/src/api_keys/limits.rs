//! What a key may run: the admission of a request against its key's policy and limits over
//! the fleet's usage ([`Keys::admit`]), with a reservation of all it is granted, and its
//! settlement ([`Charge`], [`Keys::record`]).

use std::sync::Arc;

use chrono::NaiveDate;
use mesh_domain::{KeyPolicy, Target, Usage, time::now_ms as unix_ms};
use serde::Serialize;

use super::{
    store::{KeyGrant, KeySource, Keys},
    usage::{day_of, iso},
};
use crate::{
    memory::MemoryError,
    metrics::{labels, metrics},
};

/// `max_tokens` granted to a request of a key with a token limit that names none: what it
/// reserves of the key's budget while it runs. Everything the key has left would hold the
/// key's other requests off until it ends.
pub(super) const DEFAULT_GRANT: u64 = 16_384;

impl Reservation {
    /// Tokens reserved for the request while it runs: its prompt's upper bound and its granted
    /// `max_tokens`, per choice (0 for a key without token limits).
    pub(crate) fn reserved(&self) -> u64 {
        self.reserved
    }
}

/// An admitted request's charge against its key, settled once: with what the request spent
/// ([`Charge::settle`]), or, when it is dropped unsettled (the handler holding it was dropped:
/// its client went away before the outcome, or the node is stopping), in the background with
/// its whole reservation, the most the request was granted. A client cannot spend unseen by
/// hanging up.
#[derive(Debug)]
pub(crate) struct Charge {
    keys: Arc<Keys>,
    /// Until settled.
    reservation: Option<Reservation>,
}

impl Charge {
    /// `max_tokens` to send to the model (see [`Reservation::max_tokens`]).
    pub(crate) fn max_tokens(&self) -> Option<u32> {
        self.reservation.as_ref().and_then(|a| a.max_tokens)
    }

    /// Tokens reserved for the request while it runs.
    pub(crate) fn reserved(&self) -> u64 {
        self.reservation.as_ref().map_or(0, Reservation::reserved)
    }

    /// Settles the request with what it `spent`.
    pub(crate) async fn settle(mut self, spent: Usage) {
        if let Some(reservation) = self.reservation.take() {
            self.keys.record(reservation, spent).await;
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let Some(reservation) = self.reservation.take() else {
            return;
        };
        let spent = Usage {
            prompt_tokens: 0,
            completion_tokens: reservation.reserved,
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let keys = Arc::clone(&self.keys);
                runtime.spawn(async move { keys.record(reservation, spent).await });
            }
            // No runtime (the node is gone): the reservation stays counted for the day.
            Err(_) => tracing::warn!(
                key = %reservation.key,
                "a front-door request's charge was dropped outside the runtime; its reservation stays counted"
            ),
        }
    }
}

/// What a request asks of a key's budget, known before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ask {
    /// At most how many tokens one choice's prompt is (`mesh_domain::chat::prompt_token_bound`).
    pub prompt: u64,
    /// Tokens one choice may write (`max_tokens`); `None`: up to [`DEFAULT_GRANT`].
    pub completion: Option<u64>,
    /// How many choices: each reads the prompt and writes its own answer.
    pub choices: u32,
}

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum LimitKind {
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
    pub(crate) fn as_str(self) -> &'static str {
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
pub(crate) enum Refusal {
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
        problem: String,
    },
}

/// A request admitted: what it may ask of the model, and what [`Keys::record`] needs to settle
/// its count. Dropping it without recording leaves its reservation counted for the day (the
/// conservative side); the front door holds it in a [`Charge`], which settles it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reservation {
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

impl Keys {
    /// Admits a request of `grant` for `model` asking `ask`, now: the [`Charge`] that settles
    /// it, whichever way it ends.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        grant: &KeyGrant,
        model: &str,
        ask: Ask,
    ) -> Result<Charge, Refusal> {
        let reservation = self.admit_at(grant, model, ask, unix_ms()).await?;
        Ok(Charge {
            keys: Arc::clone(self),
            reservation: Some(reservation),
        })
    }

    /// [`Keys::admit`] at `now_ms`: checks the model, then every limit against the fleet's
    /// usage; refuses a request that would not fit in what the token limits have left (its
    /// prompt's upper bound and one token per choice); grants each choice `max_tokens` up to
    /// what is asked ([`DEFAULT_GRANT`] when nothing is) and what is left; and counts the
    /// request, reserving all it is granted, before it runs.
    pub(crate) async fn admit_at(
        &self,
        grant: &KeyGrant,
        model: &str,
        ask: Ask,
        now_ms: u64,
    ) -> Result<Reservation, Refusal> {
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
            return Ok(Reservation {
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
        Ok(Reservation {
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
    pub(crate) async fn record(&self, reservation: Reservation, spent: Usage) {
        self.record_at(reservation, spent, unix_ms()).await;
    }

    /// [`Keys::record`] at `now_ms`. A failure to write is logged: the request already ran.
    pub(crate) async fn record_at(&self, reservation: Reservation, spent: Usage, now_ms: u64) {
        let (prompt, completion) = (spent.prompt_tokens, spent.completion_tokens);
        let name = reservation.key.as_str();
        let tokens = metrics();
        for (kind, n) in [("prompt", prompt), ("completion", completion)] {
            tokens
                .http_key_tokens
                .get_or_create(&labels(&[
                    ("key", name),
                    ("model", &reservation.model),
                    ("kind", kind),
                ]))
                .inc_by(n);
        }
        if !reservation.counted {
            // Not counted in the memory; the metrics above say what a plain key spent.
            return;
        }
        let _counting = self.counting.lock().await;
        let written = self
            .update_own(name, reservation.day, |record| {
                let count = record.models.entry(reservation.model.clone()).or_default();
                count.prompt_tokens += prompt;
                count.completion_tokens += completion;
                record.reserved = record.reserved.saturating_sub(reservation.reserved);
                let minute = now_ms / 60_000;
                if record.minute == minute {
                    record.minute_tokens =
                        record.minute_tokens.saturating_sub(reservation.reserved)
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
}

/// What a policy allows, for a refusal.
fn allowed(policy: &KeyPolicy) -> String {
    let mut names: Vec<String> = policy.models.clone();
    names.extend(policy.roles.iter().map(|r| format!("role:{r}")));
    names.join(", ")
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

impl KeyGrant {
    /// Whether it may use the front door's `/mcp`: a plain `http.api_keys` key (the node's
    /// own, unlimited) may, a named key only with the `mcp` scope.
    pub(crate) fn may_use_mcp(&self) -> Result<(), Refusal> {
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
    pub(super) fn counted(&self) -> bool {
        self.source != KeySource::ApiKeys
    }
}

/// Counts a refusal of key `name` by `limit` (`model` for a model it may not use).
fn count_refusal(name: &str, limit: &str) {
    metrics()
        .http_key_refusals
        .get_or_create(&labels(&[("key", name), ("limit", limit)]))
        .inc();
}
