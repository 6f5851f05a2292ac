//! The rules placed on one data plane, in the order they were placed, each once: a route on
//! two Gateways of one tunnel yields its rules twice there, and the plane must not repeat them.

use std::hash::BuildHasher;

use cftunnel_config::Rule;
use hashbrown::HashTable;
use rustc_hash::FxBuildHasher;

use super::grpc_route;
use super::rule::Placement;
use super::shadow::{FirstClaims, Shadowed};
use super::RouteKey;

#[derive(Debug, Default)]
pub(super) struct PlaneRules {
    /// The rules, in the order they were placed: the list the plane's document takes. The
    /// shadowing claims refer to them by position ([`super::shadow`]).
    rules: Vec<Rule>,
    /// The route each rule comes from.
    routes: Vec<RouteKey>,
    /// The placement of each GRPCRoute rule, with its position in `rules`: only those move
    /// when the document is ordered ([`grpc_route::order`]).
    grpc: Vec<(Placement, usize)>,
    /// Positions in `rules` with the hash of their rule, so a repeated rule is found by
    /// comparing it with the one already placed, with no copy of every rule kept to look it
    /// up, and the table grows without hashing every rule again.
    /// Fx: SipHash's flooding resistance buys nothing for the controller's own output.
    positions: HashTable<(u64, usize)>,
    /// Which route placed each match on each host first.
    claims: FirstClaims,
    /// The hash of each match of the rule being placed: hashed once, for both the rule's
    /// hash and its claims. Kept between placements for its room.
    match_hashes: Vec<u64>,
}

impl PlaneRules {
    /// Room for `rules` rules, and their hashes and claims: the tables grew from empty
    /// every round, rehashing every entry at each doubling.
    pub(super) fn with_capacity(rules: usize) -> Self {
        Self {
            rules: Vec::with_capacity(rules),
            routes: Vec::with_capacity(rules),
            positions: HashTable::with_capacity(rules),
            claims: FirstClaims::with_capacity(rules),
            ..Self::default()
        }
    }

    /// Places `rule` of `route` unless an equal rule is placed already, noting in `shadowed`
    /// each of its matches another route placed on one of its hosts first.
    pub(super) fn place(
        &mut self,
        placement: Option<Placement>,
        rule: Box<Rule>,
        route: &RouteKey,
        shadowed: &mut Shadowed,
    ) {
        let Self {
            rules,
            routes,
            grpc,
            positions,
            claims,
            match_hashes,
        } = self;
        match_hashes.clear();
        match_hashes.extend(rule.matches.iter().map(|m| FxBuildHasher.hash_one(m)));
        // Of where the rule applies, not of all of it: equal rules still hash equal, and a
        // rule's backends, hashed every placement, rarely tell two rules apart that its name,
        // hosts and matches do not. Its matches by their hashes, each hashed once.
        let hash = FxBuildHasher.hash_one((&rule.name, &rule.hostnames, &*match_hashes));
        if positions
            .find(hash, |&(h, i)| h == hash && rules[i] == *rule)
            .is_some()
        {
            return;
        }
        let at = rules.len();
        rules.push(*rule);
        routes.push(route.clone());
        if let Some(placement) = placement {
            grpc.push((placement, at));
        }
        positions.insert_unique(hash, (hash, at), |&(h, _)| h);
        claims.place(rules, routes, at, match_hashes, shadowed);
    }

    /// The rules in the order of the document ([`grpc_route::order`]), each with the route it
    /// comes from.
    pub(super) fn into_ordered(self) -> (Vec<Rule>, Vec<RouteKey>) {
        let Self {
            mut rules,
            mut routes,
            grpc,
            ..
        } = self;
        grpc_route::order(grpc, |a, b| {
            rules.swap(a, b);
            routes.swap(a, b);
        });
        (rules, routes)
    }
}
