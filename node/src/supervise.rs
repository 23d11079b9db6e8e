//! Supervised background loops: every long-running loop of a node (membership, replication,
//! discovery, the scheduler, the model prober, the health checks) runs under [`Supervisor`], so
//! none can die silently while the node looks healthy.
//!
//! A loop that panics, returns an error, or returns at all while the node is not stopping is
//! logged, named in the node's health (`degraded`, through the [`LoopHealth`] port that
//! `capabilities` implements) and started again after an exponential back-off ([`Backoff`],
//! capped). Once a restarted loop has run for [`Backoff::healthy_after`] the reason clears and
//! the back-off starts over. A loop that ends because its cancellation token fired is not
//! restarted. This module decides nothing about what the loops do; it only keeps them running.

use std::{fmt::Display, future::Future, sync::Arc, time::Duration};

use tokio::{task::JoinSet, time::Instant};
use tokio_util::{sync::CancellationToken, task::AbortOnDropHandle};

/// Where a supervisor reports a failing loop (a port: `capabilities` turns it into a
/// `degraded` health reason named after the loop).
pub trait LoopHealth: Send + Sync + 'static {
    /// Sets (`Some`) or clears (`None`) the reason the loop `name` is not running well.
    fn loop_failing(&self, name: &str, reason: Option<String>);
}

/// How long a failed loop waits before it runs again: `first`, doubled per failure in a row up
/// to `max`; a run that lasted `healthy_after` counts as well again (reason cleared, back-off
/// reset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    /// The wait after the first failure.
    pub first: Duration,
    /// The longest wait, however often the loop fails.
    pub max: Duration,
    /// How long a restarted loop must run before it counts as well again.
    pub healthy_after: Duration,
}

impl Default for Backoff {
    /// 1 s, doubling to at most 60 s; well again after 30 s.
    fn default() -> Self {
        Self {
            first: Duration::from_secs(1),
            max: Duration::from_secs(60),
            healthy_after: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// The wait after the `failures`-th failure in a row (1-based): `first · 2^(failures-1)`,
    /// at most `max`; saturating, so no count of failures overflows.
    pub(crate) fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.first.saturating_mul(1u32 << doublings).min(self.max)
    }
}

/// One way a loop stopped that was not asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Failure {
    /// It returned `Ok` although the node is not stopping.
    Ended,
    /// It returned an error.
    Error(String),
    /// It panicked.
    Panic(String),
}

impl Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ended => write!(f, "stopped on its own"),
            Self::Error(e) => write!(f, "failed: {e}"),
            Self::Panic(message) => write!(f, "panicked: {message}"),
        }
    }
}

/// Owns a node's background loops: each is started with [`Supervisor::spawn`] and restarted
/// when it fails; [`Supervisor::shutdown`] waits for them all once their tokens fired.
#[derive(Debug)]
pub(crate) struct Supervisor {
    /// Where failures are reported.
    health: Arc<dyn LoopHealth>,
    /// The waits between restarts.
    backoff: Backoff,
    /// One supervising task per loop.
    loops: JoinSet<()>,
    /// The loops' names, in start order (what [`Supervisor::names`] shows).
    names: Vec<String>,
}

impl std::fmt::Debug for dyn LoopHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LoopHealth")
    }
}

impl Supervisor {
    /// A supervisor reporting to `health`, restarting after `backoff`.
    pub(crate) fn new(health: Arc<dyn LoopHealth>, backoff: Backoff) -> Self {
        Self {
            health,
            backoff,
            loops: JoinSet::new(),
            names: Vec::new(),
        }
    }

    /// Runs the loop that `start` builds (given a child of `cancel`), again after each failure,
    /// until `cancel` fires. A loop that does not return `Result` is wrapped with [`no_error`].
    pub(crate) fn spawn<F, Fut, E>(&mut self, name: &str, cancel: CancellationToken, start: F)
    where
        F: FnMut(CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Display + Send + 'static,
    {
        self.names.push(name.to_owned());
        self.loops.spawn(supervise(
            name.to_owned(),
            self.health.clone(),
            self.backoff,
            cancel,
            start,
        ));
    }

    /// The names of the loops started, in order.
    pub(crate) fn names(&self) -> &[String] {
        &self.names
    }

    /// Waits for every loop to end (their tokens must have fired, or this waits for ever).
    pub(crate) async fn shutdown(mut self) {
        while let Some(done) = self.loops.join_next().await {
            if let Err(e) = done {
                tracing::error!(error = %e, "a loop's supervisor failed during shutdown");
            }
        }
    }
}

/// Adapts a loop that returns nothing (it ends only when cancelled) to [`Supervisor::spawn`].
pub(crate) async fn no_error(
    run: impl Future<Output = ()>,
) -> Result<(), std::convert::Infallible> {
    run.await;
    Ok(())
}

/// The supervising task of one loop.
async fn supervise<F, Fut, E>(
    name: String,
    health: Arc<dyn LoopHealth>,
    backoff: Backoff,
    cancel: CancellationToken,
    mut start: F,
) where
    F: FnMut(CancellationToken) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Display + Send + 'static,
{
    // Failures in a row: what the back-off grows with.
    let mut failures = 0u32;
    loop {
        // Its own task, so a panic is caught at the join handle; aborted with the supervisor.
        let mut run = AbortOnDropHandle::new(tokio::spawn(start(cancel.child_token())));
        let started = Instant::now();
        let mut well_again = std::pin::pin!(tokio::time::sleep(backoff.healthy_after));
        let mut reported_well = failures == 0;
        let outcome = loop {
            tokio::select! {
                outcome = &mut run => break outcome,
                () = &mut well_again, if !reported_well => {
                    reported_well = true;
                    failures = 0;
                    health.loop_failing(&name, None);
                    tracing::info!(loop_name = %name, "background loop runs well again");
                }
            }
        };
        if cancel.is_cancelled() {
            // Stopping: whatever it ended with, it is not restarted.
            if let Ok(Err(e)) = outcome {
                tracing::warn!(loop_name = %name, error = %e, "background loop failed while stopping");
            }
            return;
        }
        let failure = match outcome {
            Ok(Ok(())) => Failure::Ended,
            Ok(Err(e)) => Failure::Error(e.to_string()),
            Err(e) if e.is_panic() => Failure::Panic(panic_message(e.into_panic())),
            Err(e) => Failure::Error(e.to_string()),
        };
        if started.elapsed() >= backoff.healthy_after {
            failures = 0;
        }
        failures = failures.saturating_add(1);
        let count = failures;
        let wait = backoff.delay(count);
        tracing::error!(loop_name = %name, %failure, failures = count, retry_in = ?wait, "background loop stopped; restarting it");
        health.loop_failing(
            &name,
            Some(format!(
                "{failure}; restarted after {wait:?} ({count} failure(s) in a row)"
            )),
        );
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// The text of a panic's payload (`panic!("…")` gives a `&str` or a `String`).
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(message) => *message,
        Err(payload) => payload
            .downcast_ref::<&str>()
            .map_or_else(|| "(no message)".to_owned(), |s| (*s).to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use std::{
        collections::BTreeMap,
        sync::{
            Mutex,
            atomic::{AtomicU32, Ordering},
        },
    };

    use mesh_domain::sync::MutexExt;

    use super::*;

    /// Records the reasons as the node's health would hold them, and every reason ever set.
    #[derive(Debug, Default)]
    struct Reasons(Mutex<(BTreeMap<String, String>, Vec<String>)>);

    impl LoopHealth for Reasons {
        fn loop_failing(&self, name: &str, reason: Option<String>) {
            let mut reasons = self.0.lock_unpoisoned();
            match reason {
                Some(reason) => {
                    reasons.1.push(reason.clone());
                    reasons.0.insert(name.to_owned(), reason)
                }
                None => reasons.0.remove(name),
            };
        }
    }

    impl Reasons {
        fn get(&self, name: &str) -> Option<String> {
            self.0.lock_unpoisoned().0.get(name).cloned()
        }

        fn history(&self) -> Vec<String> {
            self.0.lock_unpoisoned().1.clone()
        }
    }

    const BACKOFF: Backoff = Backoff {
        first: Duration::from_secs(1),
        max: Duration::from_secs(8),
        healthy_after: Duration::from_secs(100),
    };

    #[test]
    fn the_backoff_doubles_and_is_capped_without_overflow() {
        let delays: Vec<u64> = [1, 2, 3, 4, 5, 6]
            .iter()
            .map(|n| BACKOFF.delay(*n).as_secs())
            .collect();
        assert_eq!(delays, [1, 2, 4, 8, 8, 8]);
        assert_eq!(BACKOFF.delay(u32::MAX), BACKOFF.max);
        assert_eq!(BACKOFF.delay(0), BACKOFF.first);
    }

    /// Lets paused time run until `check` holds (each step advances the clock by 100 ms).
    async fn until(mut check: impl FnMut() -> bool) {
        for _ in 0..10_000 {
            if check() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the condition never held");
    }

    /// One supervised loop under test and what can be seen of it.
    struct Watched {
        supervisor: Supervisor,
        /// Runs started so far.
        runs: Arc<AtomicU32>,
        /// The health reasons reported.
        reasons: Arc<Reasons>,
        /// When each run started.
        starts: Arc<Mutex<Vec<Instant>>>,
        /// Stops the loop.
        cancel: CancellationToken,
    }

    /// Starts `attempt` (given the run number, 1-based) under a supervisor.
    fn start<Fut>(
        attempt: impl Fn(u32, CancellationToken) -> Fut + Send + Sync + 'static,
    ) -> Watched
    where
        Fut: Future<Output = Result<(), String>> + Send + 'static,
    {
        let reasons = Arc::new(Reasons::default());
        let mut supervisor = Supervisor::new(reasons.clone(), BACKOFF);
        let runs = Arc::new(AtomicU32::new(0));
        let starts = Arc::new(Mutex::new(Vec::new()));
        let cancel = CancellationToken::new();
        let (counter, times) = (runs.clone(), starts.clone());
        supervisor.spawn("scheduler", cancel.clone(), move |token| {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            times.lock_unpoisoned().push(Instant::now());
            attempt(n, token)
        });
        Watched {
            supervisor,
            runs,
            reasons,
            starts,
            cancel,
        }
    }

    /// The gaps between consecutive starts, in whole seconds.
    fn gaps(starts: &Mutex<Vec<Instant>>) -> Vec<u64> {
        starts
            .lock_unpoisoned()
            .windows(2)
            .map(|w| (w[1] - w[0]).as_secs())
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_loop_degrades_health_by_name_and_restarts_with_growing_backoff() {
        let Watched {
            supervisor,
            runs,
            reasons,
            starts,
            cancel,
        } = start(|n, token| async move {
            if n <= 4 {
                panic!("tick {n} went wrong");
            }
            token.cancelled().await;
            Ok(())
        });
        until(|| runs.load(Ordering::SeqCst) == 5).await;
        let reason = reasons.get("scheduler").expect("health names the loop");
        assert!(reason.contains("panicked: tick 4 went wrong"), "{reason}");
        assert_eq!(gaps(&starts), [1, 2, 4, 8]);
        // Well again after it ran for `healthy_after`: the reason clears.
        tokio::time::sleep(BACKOFF.healthy_after + Duration::from_secs(1)).await;
        assert_eq!(reasons.get("scheduler"), None);
        cancel.cancel();
        supervisor.shutdown().await;
        assert_eq!(runs.load(Ordering::SeqCst), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_loop_returning_an_error_or_ending_on_its_own_is_restarted() {
        let Watched {
            supervisor,
            runs,
            reasons,
            starts,
            cancel,
        } = start(|n, token| async move {
            match n {
                1 => Err("the store is closed".to_owned()),
                2 => Ok(()),
                _ => {
                    token.cancelled().await;
                    Ok(())
                }
            }
        });
        until(|| runs.load(Ordering::SeqCst) == 3).await;
        let history = reasons.history();
        assert_eq!(history.len(), 2, "{history:?}");
        assert!(
            history[0].contains("failed: the store is closed"),
            "{history:?}"
        );
        assert!(history[1].contains("stopped on its own"), "{history:?}");
        assert!(reasons.get("scheduler").is_some(), "still degraded");
        assert_eq!(gaps(&starts), [1, 2]);
        cancel.cancel();
        supervisor.shutdown().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_loop_ending_because_the_node_stops_is_not_restarted() {
        let Watched {
            supervisor,
            runs,
            reasons,
            cancel,
            ..
        } = start(|_, token| async move {
            token.cancelled().await;
            Err("interrupted".to_owned())
        });
        until(|| runs.load(Ordering::SeqCst) == 1).await;
        cancel.cancel();
        supervisor.shutdown().await;
        tokio::time::sleep(BACKOFF.max * 4).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(reasons.get("scheduler"), None);
    }
}
