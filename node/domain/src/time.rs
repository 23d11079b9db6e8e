//! Wall-clock time as the mesh stores and sends it.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 for a time before it).
pub fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Now, in milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    unix_ms(SystemTime::now())
}

/// Now, in seconds since the Unix epoch (0 before it).
pub fn now_s() -> u64 {
    now_ms() / 1000
}
