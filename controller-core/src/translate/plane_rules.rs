//! The rules placed on one data plane, in the order they were placed, each once: a route on
//! two Gateways of one tunnel yields its rules twice there, and the plane must not repeat them.

use std::hash::BuildHasher;

use cftunnel_config::Rule;
use hashbrown::HashTable;
use rustc_hash::FxBuildHasher;

use super::rule::Placement;
use super::RouteKey;

/// Each rule with the route it comes from, and its placement when that is a GRPCRoute (see
/// [`super::grpc_route::order`]).
pub(super) type Placed = (Option<Placement>, (Rule, RouteKey));

#[derive(Debug, Default)]
pub(super) struct PlaneRules {
    placed: Vec<Placed>,
    /// Positions in `placed` by the hash of their rule, so a repeated rule is found by
    /// comparing it with the one already placed, with no copy of every rule kept to look it up.
    /// Fx: SipHash's flooding resistance buys nothing for the controller's own output.
    positions: HashTable<usize>,
}

impl PlaneRules {
    /// Places `rule` of `route` unless an equal rule is placed already; the rule placed, if it
    /// is.
    pub(super) fn place(
        &mut self,
        placement: Option<Placement>,
        rule: Rule,
        route: &RouteKey,
    ) -> Option<&Rule> {
        let hash = FxBuildHasher.hash_one(&rule);
        let Self { placed, positions } = self;
        if positions.find(hash, |&i| placed[i].1 .0 == rule).is_some() {
            return None;
        }
        placed.push((placement, (rule, route.clone())));
        positions.insert_unique(hash, placed.len() - 1, |&i| {
            FxBuildHasher.hash_one(&placed[i].1 .0)
        });
        placed.last().map(|(_, (rule, _))| rule)
    }

    /// The rules, in the order they were placed.
    pub(super) fn into_placed(self) -> Vec<Placed> {
        self.placed
    }
}
