//! Owns which client address a request is charged to: the socket's peer,
//! or, only when the peer is a trusted proxy
//! (`SECKILL_GATEWAY_TRUSTED_PROXIES`), the address its `X-Forwarded-For`
//! names.
//!
//! The rule: read the chain peer ← last `X-Forwarded-For` entry ← ... ←
//! first entry (several headers are one list, in order) from the right,
//! and charge the first address that is not a trusted proxy: the
//! rightmost untrusted hop. Entries to its left were written by the client
//! itself and are never believed, so a client cannot escape its limit by
//! sending a header of its own (nginx with `$proxy_add_x_forwarded_for`
//! appends the real address after it). An entry that is not an IP
//! address (bare, `a.b.c.d:port` or `[v6]:port`) ends the walk: the
//! request is charged to the trusted hop that wrote it, so a misconfigured
//! proxy shows up limited instead of unlimited. When every hop is trusted
//! (the proxy's own requests, a local tool without the header) the request
//! is not address-limited. At most [`MAX_HOPS`] entries are read.

use seckill_common::trusted::{canonical, TrustedProxies};
use std::net::{IpAddr, SocketAddr};

/// Most `X-Forwarded-For` entries read from the right; a longer chain is
/// charged to the hop where reading stopped.
pub const MAX_HOPS: usize = 16;

/// Whom a request is charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// This address.
    Address(IpAddr),
    /// Every hop is a trusted proxy: no address limit.
    TrustedProxy,
}

/// The client of a request from `peer` carrying the `X-Forwarded-For`
/// values `forwarded` (in header order). A request without a peer address
/// (never on TCP) is charged to `0.0.0.0`, all such requests together.
pub fn client<'a>(
    peer: Option<IpAddr>,
    forwarded: impl DoubleEndedIterator<Item = &'a str>,
    trusted: &TrustedProxies,
) -> Client {
    let Some(peer) = peer.map(canonical) else {
        return Client::Address(IpAddr::from([0, 0, 0, 0]));
    };
    if !trusted.contains(peer) {
        return Client::Address(peer);
    }
    let mut hop = peer;
    let entries = forwarded
        .rev()
        .flat_map(|v| v.rsplit(','))
        .map(str::trim)
        .take(MAX_HOPS + 1);
    for (i, entry) in entries.enumerate() {
        if i == MAX_HOPS {
            return Client::Address(hop);
        }
        let Some(ip) = parse_hop(entry) else {
            return Client::Address(hop);
        };
        if !trusted.contains(ip) {
            return Client::Address(ip);
        }
        hop = ip;
    }
    Client::TrustedProxy
}

fn parse_hop(s: &str) -> Option<IpAddr> {
    s.parse::<IpAddr>()
        .or_else(|_| s.parse::<SocketAddr>().map(|a| a.ip()))
        .ok()
        .map(canonical)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn of(peer: &str, headers: &[&str], trusted: &str) -> Client {
        let t = TrustedProxies::parse(trusted).unwrap();
        client(Some(ip(peer)), headers.iter().copied(), &t)
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_sends() {
        assert_eq!(
            of("203.0.113.9", &["198.51.100.1"], "10.0.0.0/8"),
            Client::Address(ip("203.0.113.9"))
        );
        assert_eq!(
            of("203.0.113.9", &[], "none"),
            Client::Address(ip("203.0.113.9"))
        );
    }

    #[test]
    fn a_trusted_peer_names_the_rightmost_untrusted_hop() {
        let t = "10.0.0.0/8";
        assert_eq!(
            of("10.0.0.1", &["198.51.100.1"], t),
            Client::Address(ip("198.51.100.1"))
        );
        // The client wrote the left entries itself.
        assert_eq!(
            of(
                "10.0.0.1",
                &["1.1.1.1, 2.2.2.2", "198.51.100.1, 10.0.0.7"],
                t
            ),
            Client::Address(ip("198.51.100.1"))
        );
        assert_eq!(
            of("10.0.0.1", &["[2001:db8::5]:4711"], t),
            Client::Address(ip("2001:db8::5"))
        );
        assert_eq!(
            of("10.0.0.1", &["198.51.100.1:80"], t),
            Client::Address(ip("198.51.100.1"))
        );
        assert_eq!(of("10.0.0.1", &[], t), Client::TrustedProxy);
        assert_eq!(of("10.0.0.1", &["10.2.3.4"], t), Client::TrustedProxy);
    }

    #[test]
    fn garbage_and_long_chains_are_charged_to_the_proxy() {
        let t = "10.0.0.0/8";
        assert_eq!(
            of("10.0.0.1", &["198.51.100.1, unknown"], t),
            Client::Address(ip("10.0.0.1"))
        );
        assert_eq!(
            of("10.0.0.1", &["1.2.3.4, 10.9.9.9, "], t),
            Client::Address(ip("10.0.0.1")),
            "an empty last entry"
        );
        let long = vec!["10.1.1.1"; MAX_HOPS + 1].join(",");
        assert_eq!(
            of("10.0.0.1", &[long.as_str()], t),
            Client::Address(ip("10.1.1.1"))
        );
        let exact = vec!["10.1.1.1"; MAX_HOPS].join(",");
        assert_eq!(of("10.0.0.1", &[exact.as_str()], t), Client::TrustedProxy);
        assert_eq!(
            client(None, std::iter::empty(), &TrustedProxies::default()),
            Client::Address(ip("0.0.0.0"))
        );
    }
}
