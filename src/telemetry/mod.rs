//! What the agent tells the outside world about itself: Prometheus metrics (one process-wide
//! registry), liveness and readiness, and the small HTTP servers that serve both.

pub mod health;
pub mod http;
pub mod metrics;
pub mod metrics_tls;
pub mod process;
