//! What a matched rule does: filters, weighted backends, timeouts, retries.

use crate::access::AccessCheck;
use crate::filter::Filters;
use crate::forward::Upstream;
use http::StatusCode;
use std::sync::Arc;
use std::time::Duration;

// Applied by the forwarder, carried by the rule.
pub use crate::forward::retry::RetryPolicy;

#[derive(Debug)]
pub struct Rule {
    /// `<ns>/<route>/<rule>`, for logs.
    pub name: Option<Box<str>>,
    pub filters: Filters,
    pub backends: Backends,
    /// Bounds the whole exchange, retries included. `None`: unbounded.
    pub request_timeout: Option<Duration>,
    /// Bounds each try up to the end of its response body, counted from its start (or from
    /// when a streamed request body has been sent). `None`: the proxy's default, which bounds
    /// the response head only.
    pub backend_timeout: Option<Duration>,
    /// A timeout of the rule is `0s`: no default bound on the response head either.
    pub timeouts_off: bool,
    /// Fail closed: answer this status instead of proxying.
    pub unavailable: Option<StatusCode>,
    pub retry: Option<RetryPolicy>,
    /// The Cloudflare Access token every request must carry; `None`: no check.
    pub access: Option<AccessCheck>,
}

#[derive(Debug)]
pub struct Backend {
    /// `None` only when `unavailable` is set (a backend that must not be dialled).
    pub upstream: Option<Arc<Upstream>>,
    pub filters: Filters,
    pub unavailable: Option<StatusCode>,
    pub weight: u32,
}

/// Backends with cumulative weights for O(log n) weighted choice.
#[derive(Debug, Default)]
pub struct Backends {
    list: Box<[Backend]>,
    cumulative: Box<[u64]>,
    total: u64,
}

impl Backends {
    pub fn new(list: Vec<Backend>) -> Self {
        let mut total = 0u64;
        let cumulative = list
            .iter()
            .map(|b| {
                total += u64::from(b.weight);
                total
            })
            .collect();
        Self {
            list: list.into_boxed_slice(),
            cumulative,
            total,
        }
    }

    /// Every backend, in the order the rule lists them.
    pub fn iter(&self) -> impl Iterator<Item = &Backend> {
        self.list.iter()
    }

    /// Picks a backend by weight; weight 0 is never picked. `None` when every weight is 0.
    pub fn pick(&self) -> Option<&Backend> {
        self.pick_with(|total| rand::random_range(0..total))
    }

    /// Another endpoint for a retry of a request first sent to `first`: one picked by weight,
    /// and only when switching changes nothing else about the request (neither has filters of
    /// its own, and the one picked can be dialled).
    pub fn retry_target(&self, first: &Backend) -> Option<&Upstream> {
        if !first.filters.is_empty() {
            return None;
        }
        let next = self.pick()?;
        match (&next.upstream, next.filters.is_empty(), next.unavailable) {
            (Some(up), true, None) => Some(up),
            _ => None,
        }
    }

    /// Picks with a caller-provided draw in `0..total` (deterministic in tests).
    pub fn pick_with(&self, draw: impl FnOnce(u64) -> u64) -> Option<&Backend> {
        if self.total == 0 {
            return None;
        }
        let r = draw(self.total);
        let i = self.cumulative.partition_point(|&c| c <= r);
        self.list.get(i)
    }
}
