//! Owns the list of trusted proxies (`SECKILL_GATEWAY_TRUSTED_PROXIES`):
//! IP addresses and CIDR ranges, their parsing, and the membership test
//! the gateway uses before it believes an `X-Forwarded-For` header.

use std::fmt;
use std::net::IpAddr;

/// One address range: `addr/prefix` (a single address is `/32` or `/128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpRange {
    net: IpAddr,
    prefix: u8,
}

impl IpRange {
    /// Whether `ip` lies in this range. An IPv4-mapped IPv6 address
    /// (`::ffff:a.b.c.d`) is compared as the IPv4 address it carries.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, canonical(ip)) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }

    /// Parses `a.b.c.d`, `a.b.c.d/n` (n ≤ 32), an IPv6 address or
    /// `v6/n` (n ≤ 128). `None` for anything else.
    pub fn parse(s: &str) -> Option<IpRange> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let net = canonical(addr.parse::<IpAddr>().ok()?);
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
                p.parse::<u8>().ok().filter(|&n| n <= max)?
            }
            Some(_) => return None,
        };
        Some(IpRange { net, prefix })
    }
}

impl fmt::Display for IpRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it carries; any other
/// address unchanged (a dual-stack listener reports IPv4 peers mapped).
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

/// The proxies whose `X-Forwarded-For` the gateway believes. Empty: no
/// header is ever believed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<IpRange>);

impl TrustedProxies {
    /// The default: this host's loopback addresses (`127.0.0.1`, `::1`),
    /// where the shipped nginx configuration runs the proxy.
    pub fn loopback() -> TrustedProxies {
        TrustedProxies(
            ["127.0.0.1", "::1"]
                .iter()
                .filter_map(|s| IpRange::parse(s))
                .collect(),
        )
    }

    /// Parses a comma-separated list of addresses and CIDR ranges, or
    /// `none` for the empty list.
    ///
    /// Errors: the first entry that is neither (returned as written).
    pub fn parse(s: &str) -> Result<TrustedProxies, String> {
        if s.trim().eq_ignore_ascii_case("none") {
            return Ok(TrustedProxies::default());
        }
        s.split(',')
            .map(str::trim)
            .map(|e| IpRange::parse(e).ok_or_else(|| e.to_string()))
            .collect::<Result<Vec<_>, _>>()
            .map(TrustedProxies)
    }

    /// Whether `ip` is a trusted proxy.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|r| r.contains(ip))
    }

    /// The ranges, in the order given.
    pub fn ranges(&self) -> &[IpRange] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ranges_and_single_addresses() {
        let t = TrustedProxies::parse("10.0.0.0/8, 192.168.1.7,fd00::/8").unwrap();
        assert!(t.contains(ip("10.255.1.2")));
        assert!(!t.contains(ip("11.0.0.1")));
        assert!(t.contains(ip("192.168.1.7")));
        assert!(!t.contains(ip("192.168.1.8")));
        assert!(t.contains(ip("fd12::1")));
        assert!(!t.contains(ip("fe80::1")));
        assert!(t.contains(ip("::ffff:10.1.2.3")), "mapped IPv4");
        let all = TrustedProxies::parse("0.0.0.0/0").unwrap();
        assert!(all.contains(ip("1.2.3.4")) && !all.contains(ip("::2")));
        assert!(TrustedProxies::loopback().contains(ip("127.0.0.1")));
        assert!(!TrustedProxies::loopback().contains(ip("127.0.0.2")));
        assert!(TrustedProxies::parse("none").unwrap().ranges().is_empty());
    }

    #[test]
    fn bad_entries_are_named() {
        for (s, bad) in [
            ("10.0.0.0/33", "10.0.0.0/33"),
            ("1.2.3.4, host", "host"),
            ("1.2.3.4/", "1.2.3.4/"),
            ("::1/+1", "::1/+1"),
            ("1.2.3.4,", ""),
        ] {
            assert_eq!(TrustedProxies::parse(s).unwrap_err(), bad, "{s}");
        }
    }
}
