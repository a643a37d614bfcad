//! The nftables ruleset of a tenant's namespace (docs/isolation.md,
//! "Network"): what its processes may reach, and in name mode the
//! redirection of their connections and DNS queries to the gateway's
//! egress proxy and resolver in the namespace (the top-level `egress` module).

use ipnet::IpNet;

use super::{
    DNS_ADDR, GATEWAY_MARK, NON_PUBLIC, PROXY_PORT, RESOLVER_MARK, RESOLVER_PORT, SLIRP_GATEWAY,
};
use crate::config::Egress;

/// What a refused destination gets: an ICMP "administratively
/// prohibited" answered inside the namespace, so `connect` fails at once
/// (EHOSTUNREACH, "No route to host") instead of timing out.
const REFUSE: &str = "reject with icmpx type admin-prohibited";

/// IPv4 items and IPv6 items, apart.
fn by_family(items: impl Iterator<Item = (bool, String)>) -> (Vec<String>, Vec<String>) {
    let (v4, v6): (Vec<_>, Vec<_>) = items.partition(|(v4, _)| *v4);
    (
        v4.into_iter().map(|(_, s)| s).collect(),
        v6.into_iter().map(|(_, s)| s).collect(),
    )
}

/// The tenant namespace's nftables ruleset.
pub fn ruleset(egress: &Egress, host: &[IpNet]) -> String {
    // Sets take no overlapping elements: merged first.
    let (host4, host6) = by_family(
        IpNet::aggregate(&host.to_vec())
            .iter()
            .map(|n| (matches!(n, IpNet::V4(_)), n.to_string())),
    );
    let (allow4, allow6) = by_family(
        IpNet::aggregate(&egress.allow)
            .iter()
            .map(|n| (matches!(n, IpNet::V4(_)), n.to_string())),
    );
    let (np4, np6) = by_family(
        NON_PUBLIC
            .iter()
            .map(|n| (!n.contains(':'), (*n).to_owned())),
    );
    let by_name = egress.names.is_some();
    let mut rules = vec![
        "flush ruleset".to_owned(),
        "table inet exec_gateway {".to_owned(),
    ];
    if by_name {
        // The tenant's connections out (TCP) and DNS queries go to the
        // gateway's proxy and resolver on the namespace's loopback, but
        // for the gateway's own (marked) sockets, loopback and the
        // addresses `egress` allows.
        rules.push("  chain to_gateway {".to_owned());
        rules.push("    type nat hook output priority -100; policy accept;".to_owned());
        rules.push(format!(
            "    meta mark {{ {GATEWAY_MARK:#x}, {RESOLVER_MARK:#x} }} return"
        ));
        rules.push("    oifname \"lo\" return".to_owned());
        if !allow4.is_empty() {
            rules.push(format!("    ip daddr {{ {} }} return", allow4.join(", ")));
        }
        rules.push(format!(
            "    ip daddr {DNS_ADDR} meta l4proto {{ tcp, udp }} th dport 53 redirect to :{RESOLVER_PORT}"
        ));
        rules.push(format!(
            "    meta nfproto ipv4 meta l4proto tcp redirect to :{PROXY_PORT}"
        ));
        rules.push("  }".to_owned());
    }
    rules.extend([
        "  chain output {".to_owned(),
        "    type filter hook output priority 0; policy drop;".to_owned(),
    ]);
    let dns = format!("ip daddr {DNS_ADDR} meta l4proto {{ tcp, udp }} th dport 53 accept");
    if by_name {
        // The gateway's own sockets never reach the namespace's loopback
        // (a name resolving to 127.0.0.1 reaches nothing).
        rules.push(format!(
            "    meta mark {{ {GATEWAY_MARK:#x}, {RESOLVER_MARK:#x} }} oifname \"lo\" {REFUSE}"
        ));
    }
    rules.push("    oifname \"lo\" accept".to_owned());
    if by_name {
        // Redirected to the proxy or resolver (the hook still names the
        // device the packet was first routed to).
        rules.push("    ct status dnat accept".to_owned());
        // Only the gateway's resolver asks slirp4netns's, and its queries
        // are not the tenant's connections (each UDP query would hold a
        // slot of the cap for conntrack's 30 s).
        rules.push(format!("    meta mark {RESOLVER_MARK:#x} {dns}"));
    }
    // Every flow out of the namespace counts, DNS included: past the
    // cap a new one is refused until one ends.
    rules.push(format!(
        "    ct state new ct count over {} {REFUSE}",
        egress.max_connections
    ));
    if !by_name {
        rules.push(format!("    {dns}"));
    }
    rules.push(format!("    ip daddr {SLIRP_GATEWAY} {REFUSE}"));
    // One rule per family and verdict, over a set (none when it is empty).
    let mut rule = |family: &str, items: Vec<String>, verdict: &str| {
        if !items.is_empty() {
            rules.push(format!(
                "    {family} daddr {{ {} }} {verdict}",
                items.join(", ")
            ));
        }
    };
    rule("ip", host4, REFUSE);
    rule("ip6", host6, REFUSE);
    rule("ip", allow4, "accept");
    rule("ip6", allow6, "accept");
    if egress.internet {
        rule("ip", np4, REFUSE);
        rule("ip6", np6, REFUSE);
        rules.push("    accept".to_owned());
    } else if by_name {
        // The proxy's connections to what a name resolved to: public
        // addresses only (a name resolving to a private one reaches it
        // only if `egress` allows that address, above).
        let mark = format!("meta mark {GATEWAY_MARK:#x}");
        rule("ip", np4, REFUSE);
        rule("ip6", np6, REFUSE);
        rules.push(format!("    {mark} accept"));
        rules.push(format!("    {REFUSE}"));
    } else {
        rules.push(format!("    {REFUSE}"));
    }
    rules.push("  }".to_owned());
    rules.push("}".to_owned());
    rules.join("\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_is_refused_before_the_allowlist_and_the_allowlist_before_private_ranges() {
        let e = Egress {
            internet: true,
            allow: vec!["10.1.2.0/24".parse().unwrap()],
            ..Egress::default()
        };
        let r = ruleset(&e, &["10.1.2.3/32".parse().unwrap()]);
        let host = r
            .find("ip daddr { 10.1.2.3/32 } reject")
            .expect("host rule");
        let allow = r
            .find("ip daddr { 10.1.2.0/24 } accept")
            .expect("allow rule");
        let private = r.find("10.0.0.0/8").expect("private rule");
        assert!(host < allow && allow < private, "{r}");
        assert!(r.contains("policy drop"));
        assert!(r.trim_end().ends_with("accept\n  }\n}"), "{r}");
    }

    #[test]
    fn overlapping_entries_are_merged_before_they_reach_a_set() {
        let e = Egress {
            internet: false,
            allow: vec![
                "10.0.0.0/8".parse().unwrap(),
                "10.1.0.0/16".parse().unwrap(),
            ],
            ..Egress::default()
        };
        let r = ruleset(
            &e,
            &[
                "127.0.0.0/8".parse().unwrap(),
                "127.0.0.1/32".parse().unwrap(),
            ],
        );
        assert!(r.contains("ip daddr { 127.0.0.0/8 } reject"), "{r}");
        assert!(r.contains("ip daddr { 10.0.0.0/8 } accept"), "{r}");
    }

    #[test]
    fn no_egress_accepts_only_loopback_and_dns() {
        let r = ruleset(&Egress::none(), &[]);
        assert!(!r.contains("    accept\n"), "{r}");
        assert!(
            r.contains("    reject with icmpx type admin-prohibited\n  }"),
            "{r}"
        );
        assert!(r.contains("oifname \"lo\" accept"));
    }

    #[test]
    fn by_name_the_tenants_connections_are_redirected_and_only_marked_ones_leave() {
        let e = Egress {
            internet: false,
            allow: vec!["10.1.2.0/24".parse().unwrap()],
            names: Some(crate::config::EgressNames::parse(&["a.test"]).unwrap()),
            ..Egress::default()
        };
        let r = ruleset(&e, &[]);
        let mark = r
            .find("meta mark { 0x65677721, 0x65677722 } return")
            .expect("mark");
        let allow = r.find("ip daddr { 10.1.2.0/24 } return").expect("allow");
        let dns = r.find("th dport 53 redirect to :53").expect("dns");
        let tcp = r.find("meta l4proto tcp redirect to :1019").expect("tcp");
        assert!(mark < allow && allow < dns && dns < tcp, "{r}");
        assert!(r.contains("ct status dnat accept"), "{r}");
        let dns = r
            .find("    meta mark 0x65677722 ip daddr 10.0.2.3")
            .expect("dns");
        let count = r.find("ct count over").expect("count");
        assert!(dns < count, "the resolver's queries are not counted: {r}");
        let lo = r
            .find("meta mark { 0x65677721, 0x65677722 } oifname \"lo\" reject")
            .expect("lo");
        assert!(
            lo < r.find("    oifname \"lo\" accept").expect("lo accept"),
            "{r}"
        );
        let private = r.find("10.0.0.0/8").expect("private");
        let marked = r.find("    meta mark 0x65677721 accept").expect("marked");
        assert!(private < marked, "{r}");
        assert!(!r.contains("0x65677721 ip daddr 10.0.2.3"), "{r}");
        assert!(r.trim_end().ends_with("admin-prohibited\n  }\n}"), "{r}");
    }
}
