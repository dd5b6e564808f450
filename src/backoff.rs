//! The one retry policy of the agent: exponential back-off from `backon` (the crate kube-runtime
//! builds its watcher back-off on, so already in the tree). Every loop that retries takes its
//! numbers from a [`Policy`] here, so they are all configured in this one place:
//!
//! | loop | first | factor | ceiling | tries after the first | jitter |
//! |---|---|---|---|---|---|
//! | Kubernetes watchers, after a stream error (`datastore::kube`, kube-runtime's `ResetTimerBackoff`, reset after 120 s quiet or by an error after a stretch without one as long as the last wait) | 0.8 s | 2 | 30 s | unlimited | yes |
//! | Kubernetes watch requests of one resource within the first wait of the previous one (`datastore::kube::watch_spacing`, afresh after a slower one) | 0.8 s | 2 | 30 s | unlimited | no |
//! | container runtime (CRI) connection (`iface_naming::cri`, reset by a session of 10 s) | 0.2 s | 2 | 30 s | unlimited | no |
//! | bridge resolver, probing an unanswered pod address (`iface_naming::bridge`) | 1 s | 2 | 30 s | unlimited | no |
//! | dataplane apply (`dataplane::driver`, reset by a successful apply) | 50 ms | 2 | 5 s | unlimited | no |
//! | one `iptables-restore` (`dataplane::iptables`, re-reading the table in between) | 20 ms | 2 | – | 5 | no |
//! | one `ipset restore` (`dataplane::ipsets`, re-reading the sets in between) | 10 ms | 4 | – | 3 | no |
//! | destroying a set of ours the kernel still holds a reference to (`dataplane::ipsets`, reset once none waits) | 200 ms | 2 | 30 s | unlimited | no |
//! | removing the startup taint from this node (`datastore::kube::startup_taint`; RBAC not granted yet, a conflicting change, the API server away) | 1 s | 2 | 60 s | unlimited | yes |
//!
//! The short, bounded ones sit inside one apply (a concurrent writer or the xtables lock);
//! the unlimited ones are the loops that wait for something outside to come back.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// How a loop backs off.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Policy {
    pub first: Duration,
    pub factor: f32,
    /// Longest single wait (`None`: no ceiling, for the bounded ones).
    pub ceiling: Option<Duration>,
    /// Waits handed out before the loop gives up (`None`: never gives up).
    pub tries: Option<usize>,
    /// Randomise each wait (up to twice as long), so that many agents restarted together do
    /// not hammer the API server in step.
    pub jitter: bool,
}

impl Policy {
    /// kube-runtime's `watcher::DefaultBackoff` numbers.
    pub const KUBE_WATCH: Policy = Policy {
        first: Duration::from_millis(800),
        factor: 2.0,
        ceiling: Some(Duration::from_secs(30)),
        tries: None,
        jitter: true,
    };
    /// How long the watchers must run without an error before back-off starts again from
    /// `KUBE_WATCH.first` (kube-runtime's `DefaultBackoff`).
    pub const KUBE_WATCH_RESET: Duration = Duration::from_secs(120);
    pub const CRI_CONNECT: Policy = Policy {
        first: Duration::from_millis(200),
        factor: 2.0,
        ceiling: Some(Duration::from_secs(30)),
        tries: None,
        jitter: false,
    };
    pub const BRIDGE_PROBE: Policy = Policy {
        first: Duration::from_secs(1),
        factor: 2.0,
        ceiling: Some(Duration::from_secs(30)),
        tries: None,
        jitter: false,
    };
    pub const APPLY_RETRY: Policy = Policy {
        first: Duration::from_millis(50),
        factor: 2.0,
        ceiling: Some(Duration::from_secs(5)),
        tries: None,
        jitter: false,
    };
    pub const IPTABLES_RESTORE: Policy = Policy {
        first: Duration::from_millis(20),
        factor: 2.0,
        ceiling: None,
        tries: Some(5),
        jitter: false,
    };
    pub const IPSET_RESTORE: Policy = Policy {
        first: Duration::from_millis(10),
        factor: 4.0,
        ceiling: None,
        tries: Some(3),
        jitter: false,
    };

    /// A destroy refused because the set is still referenced: nf_tables lets go of its last
    /// reference a moment after the rule goes (the first retry does it), while a foreign rule
    /// may hold the set for good, which must not cost a process and a warning every turn.
    pub const IPSET_DESTROY_RETRY: Policy = Policy {
        first: Duration::from_millis(200),
        factor: 2.0,
        ceiling: Some(Duration::from_secs(30)),
        tries: None,
        jitter: false,
    };

    /// Many nodes of a pool start together: jittered, and slower than the watchers at the
    /// ceiling, since a refusal (403) needs an operator to grant the RBAC.
    pub const STARTUP_TAINT: Policy = Policy {
        first: Duration::from_secs(1),
        factor: 2.0,
        ceiling: Some(Duration::from_secs(60)),
        tries: None,
        jitter: true,
    };

    /// The `backon` builder for this policy (also what kube-runtime's watcher back-off takes).
    pub fn builder(&self) -> ExponentialBuilder {
        let mut b = ExponentialBuilder::new()
            .with_min_delay(self.first)
            .with_factor(self.factor);
        b = match self.ceiling {
            Some(c) => b.with_max_delay(c),
            None => b.without_max_delay(),
        };
        b = match self.tries {
            Some(n) => b.with_max_times(n),
            None => b.without_max_times(),
        };
        if self.jitter {
            b = b.with_jitter();
        }
        b
    }
}

/// A running back-off: the waits of one [`Policy`], from the first again after `reset`.
#[derive(Debug)]
pub struct Backoff {
    policy: Policy,
    waits: <ExponentialBuilder as BackoffBuilder>::Backoff,
}

impl Backoff {
    pub fn new(policy: Policy) -> Backoff {
        Backoff {
            policy,
            waits: policy.builder().build(),
        }
    }

    pub fn apply_retry() -> Backoff {
        Backoff::new(Policy::APPLY_RETRY)
    }

    /// The next wait, or `None` once a bounded policy has handed out all its tries.
    pub fn next_wait(&mut self) -> Option<Duration> {
        self.waits.next()
    }

    /// The next wait of a policy that never gives up (a bounded one keeps its ceiling-less
    /// last wait once exhausted).
    pub fn next_delay(&mut self) -> Duration {
        self.waits.next().unwrap_or(self.policy.first)
    }

    /// Starts again from the first wait.
    pub fn reset(&mut self) {
        self.waits = self.policy.builder().build();
    }

    /// The wait that would come first after a reset.
    pub fn first(&self) -> Duration {
        self.policy.first
    }

    /// Whether the waits reached the policy's ceiling (for loops that log only then).
    pub fn at_ceiling(&self, last: Duration) -> bool {
        self.policy.ceiling.is_some_and(|c| last >= c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlimited_policies_double_to_their_ceiling_and_start_again_after_reset() {
        let mut b = Backoff::apply_retry();
        let waits: Vec<u128> = (0..9).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(waits, [50, 100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(50));
    }

    #[test]
    fn bounded_policies_give_up_after_their_tries() {
        // backon multiplies in f32 seconds: 40 ms may come out a hair short.
        let ms = |d: Duration| (d.as_micros() + 500) / 1000;
        let mut b = Backoff::new(Policy::IPSET_RESTORE);
        let waits: Vec<Option<u128>> = (0..4).map(|_| b.next_wait().map(ms)).collect();
        assert_eq!(waits, [Some(10), Some(40), Some(160), None]);
        let mut b = Backoff::new(Policy::IPTABLES_RESTORE);
        let waits: Vec<u128> = std::iter::from_fn(|| b.next_wait()).map(ms).collect();
        assert_eq!(waits, [20, 40, 80, 160, 320]);
    }

    #[test]
    fn jittered_waits_stay_between_the_wait_and_twice_it() {
        let mut b = Backoff::new(Policy::KUBE_WATCH);
        let mut nominal = Policy::KUBE_WATCH.first;
        for _ in 0..12 {
            let w = b.next_delay();
            assert!(w >= nominal && w <= nominal * 2, "{w:?} for {nominal:?}");
            nominal = (nominal * 2).min(Duration::from_secs(30));
        }
    }
}
