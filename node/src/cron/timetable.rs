//! Timetables: a cron expression read in an IANA time zone ([`Timetable`]), and which
//! scheduled times between the last handled one and now run and which are missed ([`due`]).
//! Pure functions of times, no I/O and no clock of their own: the scheduler passes `now`. It
//! must not know schedules, owners or the memory.

use std::collections::VecDeque;

use chrono::TimeZone;
use chrono_tz::Tz;

use super::error::CronError;

/// Most `missed` records one catch-up writes (the most recent ones).
const MAX_MISSED_RECORDED: usize = 100;
/// How far back a catch-up looks beyond the catch-up window.
const LOOKBACK_MS: i64 = 24 * 3600 * 1000;

/// A parsed cron expression in its time zone.
#[derive(Debug, Clone)]
pub struct Timetable {
    cron: croner::Cron,
    tz: Tz,
}

impl Timetable {
    /// Parses `expression` (5 fields, 6 with leading seconds, or an `@` alias) in `timezone`
    /// (empty: UTC). Errors name the bad field.
    pub fn parse(expression: &str, timezone: &str) -> Result<Self, CronError> {
        let fields = expression.split_whitespace().count();
        if !expression.trim_start().starts_with('@') && fields != 5 && fields != 6 {
            return Err(CronError::Invalid(format!(
                "schedule: `{expression}` has {fields} fields; use 5 (minute hour day-of-month month day-of-week, e.g. \"0 2 * * *\") or 6 with a leading seconds field"
            )));
        }
        // croner takes an empty list item (`5 , * * *`) as a field that matches nothing, and
        // then searches for ~0.5 s before it gives up (the cron fuzz target found it).
        if let Some(field) = expression
            .split_whitespace()
            .find(|f| f.split(',').any(str::is_empty))
        {
            return Err(CronError::Invalid(format!(
                "schedule: the field `{field}` of `{expression}` has an empty list item; separate values with commas, e.g. `1,15`"
            )));
        }
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .build()
            .parse(expression)
            .map_err(|e| {
                CronError::Invalid(format!(
                    "schedule: `{expression}` is not a valid cron expression: {e}"
                ))
            })?;
        let tz = if timezone.is_empty() {
            Tz::UTC
        } else {
            timezone.parse::<Tz>().map_err(|_| {
                CronError::Invalid(format!(
                    "timezone: `{timezone}` is not an IANA time zone; use a name such as `UTC`, `Europe/Berlin` or `America/New_York`"
                ))
            })?
        };
        Ok(Self { cron, tz })
    }

    /// Checks that the schedule fires at all: `0 0 31 2 *` (February 31) parses but never does.
    pub fn check_fires(&self, expression: &str, now_ms: i64) -> Result<(), CronError> {
        match self.next_after(now_ms) {
            Some(_) => Ok(()),
            None => Err(CronError::Invalid(format!(
                "schedule: `{expression}` never fires (no such date, e.g. February 31); check its day-of-month, month and day-of-week fields"
            ))),
        }
    }

    /// The first scheduled time strictly after `after_ms` (Unix ms).
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        let mut from = self.tz.timestamp_millis_opt(after_ms).single()?;
        // A few rounds at most: croner works in whole seconds.
        for _ in 0..3 {
            let next = self.cron.find_next_occurrence(&from, false).ok()?;
            if next.timestamp_millis() > after_ms {
                return Some(next.timestamp_millis());
            }
            from = next;
        }
        None
    }
}

/// What is due for a schedule between the last handled time and now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Due {
    /// The time to fire now, if any: the latest due time, when within the catch-up window.
    pub run: Option<i64>,
    /// Due times that will not run, oldest first (at most the most recent 100).
    pub missed: Vec<i64>,
    /// Missed times not listed in `missed`.
    pub unrecorded: u64,
    /// The latest due time (or `after` when none): the next call starts after it.
    pub last: i64,
}

/// The scheduled times in (`after`, `now`]: the latest runs when it is at most `catch_up_ms`
/// old, every other one is missed. Looks back at most a day beyond the catch-up window.
pub(super) fn due(table: &Timetable, after: i64, now: i64, catch_up_ms: i64) -> Due {
    let floor = now - catch_up_ms - LOOKBACK_MS;
    let mut cursor = after.max(floor);
    let mut times: VecDeque<i64> = VecDeque::new();
    let mut unrecorded = 0;
    while let Some(t) = table.next_after(cursor) {
        if t > now {
            break;
        }
        times.push_back(t);
        if times.len() > MAX_MISSED_RECORDED + 1 {
            times.pop_front();
            unrecorded += 1;
        }
        cursor = t;
    }
    let Some(&latest) = times.back() else {
        return Due {
            run: None,
            missed: Vec::new(),
            unrecorded,
            last: after,
        };
    };
    let run = (now - latest <= catch_up_ms).then_some(latest);
    if run.is_some() {
        times.pop_back();
    } else if times.len() > MAX_MISSED_RECORDED {
        times.pop_front();
        unrecorded += 1;
    }
    Due {
        run,
        missed: times.into(),
        unrecorded,
        last: latest,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-01-01T00:00:00Z.
    const T0: i64 = 1_767_225_600_000;

    fn at(text: &str) -> i64 {
        chrono::DateTime::parse_from_rfc3339(text)
            .expect("time")
            .timestamp_millis()
    }

    fn times(table: &Timetable, from: i64, until: i64) -> Vec<i64> {
        let mut out = Vec::new();
        let mut cursor = from;
        while let Some(t) = table.next_after(cursor) {
            if t > until {
                break;
            }
            out.push(t);
            cursor = t;
        }
        out
    }

    #[test]
    fn the_latest_due_time_runs_within_the_window_and_older_ones_are_missed() {
        let every_10s = Timetable::parse("*/10 * * * * *", "").expect("parse");
        let due_now = due(&every_10s, T0, T0 + 35_000, 60_000);
        assert_eq!(due_now.run, Some(T0 + 30_000));
        assert_eq!(due_now.missed, [T0 + 10_000, T0 + 20_000]);
        assert_eq!(due_now.last, T0 + 30_000);
        let too_late = due(&every_10s, T0, T0 + 35_000, 3_000);
        assert_eq!(too_late.run, None);
        assert_eq!(too_late.missed, [T0 + 10_000, T0 + 20_000, T0 + 30_000]);
        let nothing = due(&every_10s, T0, T0 + 5_000, 60_000);
        assert_eq!(
            (nothing.run, nothing.missed.len(), nothing.last),
            (None, 0, T0)
        );
        // A long outage records the most recent 100 and counts the rest.
        let long = due(&every_10s, T0, T0 + 3_600_000, 60_000);
        assert_eq!(long.run, Some(T0 + 3_600_000));
        assert_eq!(long.missed.len(), 100);
        assert_eq!(long.unrecorded, 359 - 100);
    }

    #[test]
    fn five_and_six_field_expressions_and_bad_input_name_the_field() {
        let nightly = Timetable::parse("0 2 * * *", "UTC").expect("5 fields");
        assert_eq!(nightly.next_after(T0), Some(T0 + 2 * 3_600_000));
        let seconds = Timetable::parse("30 0 2 * * *", "").expect("6 fields");
        assert_eq!(seconds.next_after(T0), Some(T0 + 2 * 3_600_000 + 30_000));
        assert!(Timetable::parse("@daily", "").is_ok());
        for (expression, zone, field) in [
            ("61 * * * *", "", "schedule:"),
            ("* * *", "", "schedule:"),
            ("0 2 * * * * * *", "", "schedule:"),
            ("0 2 * * *", "Mars/Olympus", "timezone:"),
            ("5 , * * *", "", "schedule:"),
            ("1,,2 * * * *", "", "schedule:"),
        ] {
            let error = Timetable::parse(expression, zone)
                .expect_err("rejected")
                .to_string();
            assert!(error.starts_with(field), "{expression} {zone}: {error}");
        }
        let february_31 = Timetable::parse("0 0 31 2 *", "UTC").expect("parses");
        let error = february_31
            .check_fires("0 0 31 2 *", 1_700_000_000_000)
            .expect_err("never fires")
            .to_string();
        assert!(error.contains("never fires"), "{error}");
        assert!(
            Timetable::parse("0 0 29 2 *", "UTC")
                .expect("parses")
                .check_fires("0 0 29 2 *", 1_700_000_000_000)
                .is_ok(),
            "February 29 comes every four years"
        );
    }

    #[test]
    fn daylight_saving_gaps_and_overlaps_fire_once_in_a_real_zone() {
        let berlin = Timetable::parse("30 2 * * *", "Europe/Berlin").expect("parse");
        // 2026-03-29: 02:00 CET jumps to 03:00 CEST, so 02:30 does not exist that day; the
        // job runs at the first instant after the gap, once.
        assert_eq!(
            times(
                &berlin,
                at("2026-03-28T12:00:00Z"),
                at("2026-03-30T12:00:00Z")
            ),
            [at("2026-03-29T01:00:00Z"), at("2026-03-30T00:30:00Z")]
        );
        // 2026-10-25: 03:00 CEST falls back to 02:00 CET, so 02:30 happens twice; once.
        assert_eq!(
            times(
                &berlin,
                at("2026-10-24T12:00:00Z"),
                at("2026-10-26T12:00:00Z")
            ),
            [at("2026-10-25T00:30:00Z"), at("2026-10-26T01:30:00Z")]
        );
        // An hourly job follows real hours: 23 on the short day, 25 on the long one.
        let hourly = Timetable::parse("0 * * * *", "Europe/Berlin").expect("parse");
        let short_day = times(
            &hourly,
            at("2026-03-28T22:59:59Z"),
            at("2026-03-29T21:59:59Z"),
        );
        assert_eq!(short_day.len(), 23);
        let long_day = times(
            &hourly,
            at("2026-10-24T21:59:59Z"),
            at("2026-10-25T22:59:59Z"),
        );
        assert_eq!(long_day.len(), 25);
        assert!(long_day.windows(2).all(|w| w[1] - w[0] == 3_600_000));
    }
}
