//! [`LogThrottle`]: counts events that a flood could repeat (a connection refused at a cap, an
//! advert dropped) and says when a log line is due, at most one per period, with the count
//! since the last line, so a flood cannot flood the log too.

use std::time::{Duration, Instant};

/// Events counted between log lines; see the module doc.
#[derive(Debug, Clone)]
pub struct LogThrottle {
    every: Duration,
    /// When the last line was due; `None` before the first.
    last: Option<Instant>,
    /// Events since then, the current one included.
    unlogged: u64,
}

impl LogThrottle {
    /// At most one line per `every`.
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            last: None,
            unlogged: 0,
        }
    }

    /// Counts one event at `now`; the count to log when a line is due (the first event's is).
    pub fn note(&mut self, now: Instant) -> Option<u64> {
        self.unlogged = self.unlogged.saturating_add(1);
        let due = self
            .last
            .is_none_or(|last| now.saturating_duration_since(last) >= self.every);
        if !due {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_period_with_the_count_since_the_last() {
        let start = Instant::now();
        let at = |s: f64| start + Duration::from_secs_f64(s);
        let mut log = LogThrottle::new(Duration::from_secs(10));
        assert_eq!(log.note(at(0.0)), Some(1), "the first event is logged");
        assert_eq!(log.note(at(1.0)), None);
        assert_eq!(log.note(at(9.9)), None);
        assert_eq!(log.note(at(10.0)), Some(3));
        assert_eq!(log.note(at(10.5)), None);
        assert_eq!(log.note(at(25.0)), Some(2));
    }
}
