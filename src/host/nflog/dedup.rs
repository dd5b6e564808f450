//! One log line per flow per window: the first packet of a flow is reported, the ones that
//! follow within the window are counted, and the count is handed back when the flow is
//! reported again in a later window or when its window expires. Pure: the caller passes the
//! time in.
//!
//! Memory is bounded by `capacity` flows. Under a flood of distinct flows the kernel's rate
//! limit already bounds what reaches us (rate x window flows per pod and direction); if the
//! table is still full after dropping expired flows, a new flow is reported without being
//! remembered and counted in [`Dedup::untracked`], so a flood can cost extra lines but never
//! unbounded memory or a hidden flow.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// What to do with one observed packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Write a line. `suppressed_before` packets of this flow were suppressed in its previous
    /// window (0 for a new flow), for a line that says so.
    Report { suppressed_before: u64 },
    /// Count it and write nothing.
    Suppress,
}

#[derive(Clone, Copy, Debug)]
struct Window {
    started: Instant,
    suppressed: u64,
}

#[derive(Debug)]
pub struct Dedup<K> {
    window: Duration,
    capacity: usize,
    flows: HashMap<K, Window>,
    suppressed_total: u64,
    untracked: u64,
}

impl<K: Hash + Eq + Clone> Dedup<K> {
    /// `window`: how long one line stands for its flow. `capacity`: the most flows
    /// remembered at once (at least 1).
    pub fn new(window: Duration, capacity: usize) -> Dedup<K> {
        Dedup {
            window,
            capacity: capacity.max(1),
            flows: HashMap::new(),
            suppressed_total: 0,
            untracked: 0,
        }
    }

    /// Records one packet of `key` seen at `now`.
    pub fn observe(&mut self, key: &K, now: Instant) -> Verdict {
        if let Some(w) = self.flows.get_mut(key) {
            if now.saturating_duration_since(w.started) < self.window {
                w.suppressed += 1;
                self.suppressed_total += 1;
                return Verdict::Suppress;
            }
            let suppressed_before = w.suppressed;
            *w = Window {
                started: now,
                suppressed: 0,
            };
            return Verdict::Report { suppressed_before };
        }
        if self.flows.len() >= self.capacity {
            // Expired flows with suppressed packets are dropped here without their count
            // being reported; callers that want those counts call `expire` on a timer.
            let window = self.window;
            self.flows
                .retain(|_, w| now.saturating_duration_since(w.started) < window);
        }
        if self.flows.len() >= self.capacity {
            self.untracked += 1;
        } else {
            self.flows.insert(
                key.clone(),
                Window {
                    started: now,
                    suppressed: 0,
                },
            );
        }
        Verdict::Report {
            suppressed_before: 0,
        }
    }

    /// Forgets flows whose window ended by `now`; returns those that had packets suppressed,
    /// with the count, so a summary line can close them.
    pub fn expire(&mut self, now: Instant) -> Vec<(K, u64)> {
        let window = self.window;
        let mut closed = Vec::new();
        self.flows.retain(|k, w| {
            let live = now.saturating_duration_since(w.started) < window;
            if !live && w.suppressed > 0 {
                closed.push((k.clone(), w.suppressed));
            }
            live
        });
        closed
    }

    /// Packets suppressed since creation (a metric's counter).
    pub fn suppressed_total(&self) -> u64 {
        self.suppressed_total
    }

    /// Flows reported while the table was full, so not deduplicated.
    pub fn untracked(&self) -> u64 {
        self.untracked
    }

    pub fn len(&self) -> usize {
        self.flows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_secs(5);

    #[test]
    fn one_report_per_flow_per_window_and_the_count_comes_back() {
        let t0 = Instant::now();
        let mut d = Dedup::new(W, 100);
        assert_eq!(
            d.observe(&"a", t0),
            Verdict::Report {
                suppressed_before: 0
            }
        );
        for i in 1..=9 {
            assert_eq!(
                d.observe(&"a", t0 + Duration::from_millis(400 * i)),
                Verdict::Suppress
            );
        }
        // Another flow is independent.
        assert_eq!(
            d.observe(&"b", t0 + Duration::from_secs(1)),
            Verdict::Report {
                suppressed_before: 0
            }
        );
        // The window is measured from the reported packet, not the last one.
        assert_eq!(
            d.observe(&"a", t0 + W),
            Verdict::Report {
                suppressed_before: 9
            }
        );
        assert_eq!(
            d.observe(&"a", t0 + W + Duration::from_secs(1)),
            Verdict::Suppress
        );
        assert_eq!(d.suppressed_total(), 10);
    }

    #[test]
    fn expire_closes_flows_with_their_suppressed_counts() {
        let t0 = Instant::now();
        let mut d = Dedup::new(W, 100);
        d.observe(&1, t0);
        d.observe(&1, t0 + Duration::from_secs(1));
        d.observe(&1, t0 + Duration::from_secs(2));
        d.observe(&2, t0 + Duration::from_secs(3));
        assert!(d.expire(t0 + Duration::from_secs(4)).is_empty());
        assert_eq!(d.len(), 2);
        // Flow 1's window has ended; flow 2's has not.
        assert_eq!(d.expire(t0 + W), vec![(1, 2)]);
        assert_eq!(d.len(), 1);
        // Flow 2 ends with nothing suppressed: forgotten without a summary.
        assert!(d.expire(t0 + W + Duration::from_secs(3)).is_empty());
        assert!(d.is_empty());
    }

    #[test]
    fn a_full_table_reports_new_flows_without_remembering_them() {
        let t0 = Instant::now();
        let mut d = Dedup::new(W, 2);
        d.observe(&1, t0);
        d.observe(&2, t0);
        for _ in 0..3 {
            assert_eq!(
                d.observe(&3, t0 + Duration::from_secs(1)),
                Verdict::Report {
                    suppressed_before: 0
                }
            );
        }
        assert_eq!(d.untracked(), 3);
        assert_eq!(d.len(), 2);
        // Once the old flows expire there is room again.
        assert_eq!(
            d.observe(&3, t0 + W),
            Verdict::Report {
                suppressed_before: 0
            }
        );
        assert_eq!(d.observe(&3, t0 + W), Verdict::Suppress);
        assert_eq!(d.len(), 1);
    }

    #[test]
    fn time_going_backwards_does_not_panic_or_report_twice() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let mut d = Dedup::new(W, 10);
        d.observe(&1, t0);
        assert_eq!(
            d.observe(&1, t0 - Duration::from_secs(5)),
            Verdict::Suppress
        );
    }
}
