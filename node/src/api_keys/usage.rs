//! The fleet's usage per key: each node's records per key, model and UTC day in the system
//! namespace `http_key_usage`, summed over the fleet ([`Keys::usage`]), and old records
//! collected ([`Keys::collect`]).

use std::collections::BTreeMap;

use chrono::{DateTime, Datelike, Months, NaiveDate, Utc};
use mesh_domain::{KeyPolicy, keys::HTTP_KEY_USAGE, time::now_ms as unix_ms};
use serde::{Deserialize, Serialize};

use super::store::{KeySource, Keys};
use crate::memory::MemoryError;

/// Most usage records read for one key's month: 31 days times this many nodes writing.
const MAX_MONTH_RECORDS: usize = 31 * 1000;

/// One model's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ModelCount {
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
pub(super) struct NodeDay {
    /// Counts by model (or role) asked for.
    pub(super) models: BTreeMap<String, ModelCount>,
    /// Tokens reserved by requests still running.
    pub(super) reserved: u64,
    /// The calendar minute the minute counts are of (Unix ms / 60 000).
    pub(super) minute: u64,
    /// Requests started in that minute.
    pub(super) minute_requests: u64,
    /// Tokens (and reservations) counted in that minute.
    pub(super) minute_tokens: u64,
}

/// A key's fleet-wide usage now, with its limits and when each resets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct KeyUsage {
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

impl Keys {
    /// Reads, changes and writes this node's record of key `name` for `day`. Called with
    /// `counting` held.
    pub(super) async fn update_own(
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
    pub(super) fn fleet_usage(&self, name: &str, now_ms: u64) -> Result<KeyUsage, MemoryError> {
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
    pub(crate) fn usage(&self) -> Result<Vec<KeyUsage>, MemoryError> {
        self.usage_at(unix_ms())
    }

    /// [`Keys::usage`] at `now_ms`.
    pub(crate) fn usage_at(&self, now_ms: u64) -> Result<Vec<KeyUsage>, MemoryError> {
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
    pub(crate) async fn collect(&self, now_ms: u64) -> Result<usize, MemoryError> {
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

pub(super) fn datetime(ms: u64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(i64::try_from(ms).unwrap_or(i64::MAX)).unwrap_or_default()
}

pub(super) fn day_of(ms: u64) -> NaiveDate {
    datetime(ms).date_naive()
}

pub(super) fn midnight_ms(day: NaiveDate) -> u64 {
    u64::try_from(
        day.and_time(chrono::NaiveTime::MIN)
            .and_utc()
            .timestamp_millis(),
    )
    .unwrap_or(0)
}

/// `ms` as an RFC 3339 UTC time, for people.
pub(super) fn iso(ms: u64) -> String {
    datetime(ms).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
