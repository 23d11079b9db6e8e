//! Cron expressions and time zones: parse, then ask for next times and what is due. The input
//! is `expression\ntimezone\n` followed by 16 bytes of times.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mesh_node::cron::{Timetable, due};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(3, '\n');
    let (Some(expression), Some(zone)) = (parts.next(), parts.next()) else {
        return;
    };
    let Ok(table) = Timetable::parse(expression, zone) else {
        return;
    };
    let tail = data.len().saturating_sub(16);
    let mut numbers = data[tail..].chunks(8).map(|c| {
        let mut b = [0u8; 8];
        b[..c.len()].copy_from_slice(c);
        i64::from_le_bytes(b)
    });
    // Times within ±300 years of 1970, in milliseconds.
    let span = 300 * 365 * 86_400_000_i64;
    let after = numbers.next().unwrap_or(0) % span;
    let now = after.saturating_add(numbers.next().unwrap_or(0).rem_euclid(span / 300));
    if let Some(next) = table.next_after(after) {
        assert!(next > after, "next_after({after}) = {next}");
    }
    let _ = due(&table, after, now, 3_600_000);
});
