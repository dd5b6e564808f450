//! Back-off between the watch requests of one resource, as a layer of the Kubernetes client.
//!
//! kube-runtime's watcher starts a new watch as soon as one ends without an error (a clean
//! end, or a connection cut in the middle of a chunk, which kube-client reads as an end), and
//! says nothing to its caller: the datastore's own back-off ([`super::Retry`]) only sees
//! errors. A watch that the server, or a proxy in front of it, ends at once would be started
//! again thousands of times a second. This layer sees every request, so it spaces the watch
//! requests (`watch=true`, streaming lists included) of each path with the datastore's
//! back-off policy: a watch asked for within the policy's first wait of the previous start
//! waits until the spacing (the first wait, doubling at each such restart up to the ceiling,
//! never jittered) has passed since the previous start; a watch asked for later starts at
//! once and the spacing starts afresh. A retry after an error already waited at least the
//! first wait, so only the restarts the datastore's back-off does not see are spaced. Watches that live for seconds, as real ones do, are never delayed;
//! lists and pages are never delayed.
//!
//! The first spaced watch of a run of quick restarts is logged at warning level, once.
//!
//! The inner service's future is created at `call` and polled only after the wait: the
//! hyper client under kube sends the request when its future is first polled.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tower::{Layer, Service};
use tracing::{debug, warn};

use crate::backoff::Policy;

/// The spacing of one path's watch requests.
#[derive(Clone, Copy, Debug, Default)]
struct Spacing {
    last_start: Option<Instant>,
    spacing: Duration,
}

impl Spacing {
    /// How long a watch request arriving `now` waits; records its start.
    fn delay(&mut self, policy: &Policy, now: Instant) -> Duration {
        // Quick: within the first wait of the last start. A retry after an error never is
        // (it waited at least that long after the failed request), so this spaces only the
        // restarts the datastore's own back-off does not see.
        let quick = |last: Instant| now.saturating_duration_since(last) < policy.first;
        let start = match self.last_start {
            Some(last) if quick(last) => {
                self.spacing = if self.spacing.is_zero() {
                    policy.first
                } else {
                    let next = self.spacing.mul_f32(policy.factor);
                    policy.ceiling.map_or(next, |c| next.min(c))
                };
                now.max(last + self.spacing)
            }
            _ => {
                self.spacing = Duration::ZERO;
                now
            }
        };
        self.last_start = Some(start);
        start - now
    }
}

/// The layer: one per client, shared by its clones.
#[derive(Clone, Debug)]
pub(super) struct WatchSpacing {
    policy: Policy,
    paths: Arc<Mutex<HashMap<String, Spacing>>>,
}

impl WatchSpacing {
    pub(super) fn new(policy: Policy) -> WatchSpacing {
        WatchSpacing {
            policy,
            paths: Arc::default(),
        }
    }

    /// How long a request to `uri` waits.
    fn delay(&self, uri: &http::Uri) -> Duration {
        let watch = uri.query().is_some_and(|q| {
            q.split('&')
                .any(|pair| pair == "watch=true" || pair == "watch=1")
        });
        if !watch {
            return Duration::ZERO;
        }
        let mut paths = self.paths.lock().unwrap_or_else(|e| e.into_inner());
        let spacing = paths.entry(uri.path().to_string()).or_default();
        let was_spacing = !spacing.spacing.is_zero();
        let delay = spacing.delay(&self.policy, Instant::now());
        if !was_spacing && !spacing.spacing.is_zero() {
            // Once per run of quick restarts; the waits after it are at debug level.
            warn!(
                path = uri.path(),
                "watches end soon after they start; the next ones wait {:?}, doubling",
                spacing.spacing
            );
        } else if !delay.is_zero() {
            debug!(path = uri.path(), "watch delayed {delay:?}");
        }
        delay
    }
}

impl<S> Layer<S> for WatchSpacing {
    type Service = Spaced<S>;
    fn layer(&self, inner: S) -> Spaced<S> {
        Spaced {
            inner,
            spacing: self.clone(),
        }
    }
}

/// The service of [`WatchSpacing`].
pub(super) struct Spaced<S> {
    inner: S,
    spacing: WatchSpacing,
}

impl<S, B> Service<http::Request<B>> for Spaced<S>
where
    S: Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let delay = self.spacing.delay(request.uri());
        let response = self.inner.call(request);
        Box::pin(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            response.await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            first: Duration::from_millis(100),
            factor: 2.0,
            ceiling: Some(Duration::from_millis(400)),
            tries: None,
            jitter: true, // ignored here
        }
    }

    #[test]
    fn watches_that_end_at_once_are_spaced_by_the_back_off_and_long_ones_never() {
        let p = policy();
        let ms = |d: Duration| (d.as_micros() + 500) / 1000;
        let mut s = Spacing::default();
        let mut now = Instant::now();
        // Each watch ends as soon as it starts.
        let mut delays = Vec::new();
        for _ in 0..6 {
            let d = s.delay(&p, now);
            delays.push(ms(d));
            now += d;
        }
        assert_eq!(delays, [0, 100, 200, 400, 400, 400]);
        // A watch that lived for twice the spacing: the next one starts at once, afresh.
        now += Duration::from_millis(800);
        assert_eq!(ms(s.delay(&p, now)), 0);
        now += Duration::from_millis(10);
        assert_eq!(ms(s.delay(&p, now)), 90);

        // Watches that live for seconds are never delayed.
        let mut s = Spacing::default();
        for _ in 0..5 {
            now += Duration::from_secs(3);
            assert_eq!(s.delay(&p, now), Duration::ZERO);
        }
    }

    #[test]
    fn only_watch_requests_are_spaced_each_path_on_its_own() {
        let spacing = WatchSpacing::new(Policy {
            first: Duration::from_secs(60),
            ..policy()
        });
        let watch: http::Uri = "http://h/api/v1/pods?watch=true&resourceVersion=5"
            .parse()
            .unwrap();
        let list: http::Uri = "http://h/api/v1/pods?limit=500".parse().unwrap();
        let other: http::Uri = "http://h/api/v1/namespaces?watch=true".parse().unwrap();
        assert_eq!(spacing.delay(&watch), Duration::ZERO);
        assert!(spacing.delay(&watch) > Duration::from_secs(59));
        assert_eq!(spacing.delay(&list), Duration::ZERO);
        assert_eq!(spacing.delay(&list), Duration::ZERO);
        assert_eq!(spacing.delay(&other), Duration::ZERO);
    }
}
