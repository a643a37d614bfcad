//! Egress by name (docs/isolation.md, "Egress by name"): what a tenant's
//! processes may reach, decided by host names rather than addresses.
//!
//! A tenant with `egress_names` has, in its network namespace, the
//! redirection rules of `isolation::egress` (its TCP connections out to
//! `127.0.0.1:1019`, its DNS queries to `127.0.0.1:53`) and, listening
//! there on sockets of the gateway's own, the two parts of this module:
//!
//! - `dns`: the resolver. Answers only names the policy allows (NXDOMAIN
//!   for the rest, which never leave the gateway), forwarding allowed ones
//!   to slirp4netns's resolver, and records their answers (`resolved`).
//! - `substitute`: secrets for the tenant's processes, put into their
//!   HTTPS requests to bound hosts by intercepting them.
//! - `proxy`: each connection is decided by the name its first bytes carry
//!   (`sniff`: TLS SNI, HTTP `Host`) or, without one, by the allowed name
//!   its address was resolved from; then the gateway connects from its own
//!   marked socket in the namespace (`sockets`) to that name's address and
//!   joins the two.
//!
//! Its seam: `tenant::build` starts a [`TenantEgress`] for a tenant whose
//! settings name hosts (after its namespace is configured); the tenant
//! holds it; reloads and `gateway/egress/set` change its names
//! ([`TenantEgress::set_names`]), which closes the open connections the
//! new list no longer allows.

pub mod api;
pub mod ask;
mod dns;
pub mod http;
mod live;
mod proxy;
mod resolved;
mod sniff;
mod sockets;
mod substitute;

pub use http::HttpEgress;
pub use sockets::Sockets;
pub use substitute::{MAX_INTERCEPTED_NAMES, Substitution};

use std::net::Ipv4Addr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use serde_json::json;

use crate::config::EgressNames;
use crate::isolation::egress::{PROXY_PORT, RESOLVER_PORT};
use crate::metrics::TenantMetrics;

pub use live::Live;
pub use resolved::{MAX_RESOLVED_NAMES, MIN_ATTRIBUTION};
pub use sniff::MAX_SNIFF_BYTES;

/// What a tenant's egress by name shares between its tasks.
#[derive(Debug)]
pub struct Shared {
    tenant: String,
    names: ArcSwap<EgressNames>,
    resolved: resolved::Resolved,
    sockets: Arc<sockets::Sockets>,
    /// The tenant's proxied connections at once (its
    /// `max_egress_connections`).
    slots: Arc<tokio::sync::Semaphore>,
    live: Live,
    metrics: TenantMetrics,
    /// `egress_unlisted = "ask"`: a process started with Codex's
    /// `networkProxy` may have its client asked.
    ask: std::sync::atomic::AtomicBool,
    /// Secrets put into the tenant's processes' requests (`substitute`).
    substitution: Option<Arc<Substitution>>,
}

impl Shared {
    fn names(&self) -> Arc<EgressNames> {
        self.names.load_full()
    }

    /// Count, audit and log one decision.
    fn decide(&self, d: &Decision<'_>) {
        if d.allowed {
            self.metrics.egress_allowed.inc();
        } else {
            self.metrics.egress_denied.inc();
        }
        let event = if d.allowed {
            "egress.allowed"
        } else {
            "egress.denied"
        };
        let mut fields = json!({ "via": d.via.name() });
        if let Some(n) = d.name {
            fields["name"] = crate::audit::clip(n);
        }
        if let Some(a) = d.addr {
            fields["address"] = json!(a.to_string());
        }
        if d.port != 0 {
            fields["port"] = json!(d.port);
        }
        if let Some(r) = &d.rule {
            fields["rule"] = crate::audit::clip(r);
        }
        if let Some(r) = d.reason {
            fields["reason"] = crate::audit::clip(r);
        }
        if let Some((_, process)) = d.process {
            fields["process"] = crate::audit::clip(process);
        }
        let who = crate::audit::Who {
            tenant: Some(&self.tenant),
            session: d.process.map(|(s, _)| s),
            ..Default::default()
        };
        crate::audit::emit(event, &who, fields);
        tracing::debug!(tenant = %self.tenant, event, name = ?d.name, addr = ?d.addr, port = d.port, reason = ?d.reason, "egress decision");
    }
}

/// How a decision's name was had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Dns,
    Tls,
    Http,
    /// The address, resolved from the name earlier.
    Address,
    /// A process's own proxy (Codex's `networkProxy`).
    Proxy,
}

impl Via {
    fn of(p: sniff::Proto) -> Via {
        match p {
            sniff::Proto::Tls => Via::Tls,
            sniff::Proto::Http => Via::Http,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Via::Dns => "dns",
            Via::Tls => "tls",
            Via::Http => "http",
            Via::Address => "address",
            Via::Proxy => "proxy",
        }
    }
}

/// One decision, for the audit trail and the metrics.
#[derive(Debug)]
struct Decision<'a> {
    allowed: bool,
    name: Option<&'a str>,
    addr: Option<Ipv4Addr>,
    port: u16,
    via: Via,
    rule: Option<String>,
    reason: Option<&'a str>,
    /// For a process's own proxy: its session and process.
    process: Option<(&'a str, &'a str)>,
}

impl<'a> Decision<'a> {
    fn allowed(name: &'a str, addr: Ipv4Addr, port: u16, via: Via, rule: &str) -> Self {
        Decision {
            allowed: true,
            name: Some(name),
            addr: Some(addr),
            port,
            via,
            rule: Some(rule.to_owned()),
            reason: None,
            process: None,
        }
    }

    fn denied(
        name: Option<&'a str>,
        addr: Option<Ipv4Addr>,
        port: u16,
        via: Via,
        reason: &'a str,
    ) -> Self {
        Decision {
            allowed: false,
            name,
            addr,
            port,
            via,
            rule: None,
            reason: Some(reason),
            process: None,
        }
    }

    fn dns_allowed(name: &'a str, names: &EgressNames) -> Self {
        Decision {
            allowed: true,
            name: Some(name),
            addr: None,
            port: 0,
            via: Via::Dns,
            rule: names.rule_for(name, None).map(ToString::to_string),
            reason: None,
            process: None,
        }
    }

    fn dns_denied(name: &'a str, reason: &'a str) -> Self {
        Decision::denied(Some(name), None, 0, Via::Dns, reason)
    }
}

/// One tenant's egress by name: its resolver and proxy, running while
/// this is held (the tenant holds it).
#[derive(Debug)]
pub struct TenantEgress {
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::AbortHandle>,
}

impl TenantEgress {
    /// Listen in `net`'s namespace and serve it. Needs a tokio runtime
    /// (its tasks run on it).
    pub async fn start(
        tenant: &str,
        sockets: Arc<sockets::Sockets>,
        names: EgressNames,
        ask: bool,
        max_connections: u32,
        metrics: TenantMetrics,
        substitution: Option<Arc<Substitution>>,
    ) -> std::io::Result<Arc<TenantEgress>> {
        let proxy = sockets.listener(PROXY_PORT).await?;
        let dns_udp = sockets.udp_bound(RESOLVER_PORT).await?;
        let dns_tcp = sockets.listener(RESOLVER_PORT).await?;
        let shared = Arc::new(Shared {
            tenant: tenant.to_owned(),
            names: ArcSwap::from_pointee(names),
            resolved: resolved::Resolved::default(),
            sockets,
            slots: Arc::new(tokio::sync::Semaphore::new(max_connections as usize)),
            live: Live::default(),
            metrics,
            ask: std::sync::atomic::AtomicBool::new(ask),
            substitution,
        });
        let tasks = vec![
            crate::task::start("egress-proxy", proxy::serve(proxy, shared.clone())).abort_handle(),
            crate::task::start("egress-dns", dns::serve_udp(dns_udp, shared.clone()))
                .abort_handle(),
            crate::task::start("egress-dns-tcp", dns::serve_tcp(dns_tcp, shared.clone()))
                .abort_handle(),
        ];
        Ok(Arc::new(TenantEgress { shared, tasks }))
    }

    /// The names in force.
    pub fn names(&self) -> Arc<EgressNames> {
        self.shared.names()
    }

    /// Whether unlisted names may be asked of clients.
    pub fn set_ask(&self, ask: bool) {
        self.shared
            .ask
            .store(ask, std::sync::atomic::Ordering::Release);
    }

    /// Take `names` for every new connection and query at once; open
    /// connections the new list does not allow are closed. Returns how
    /// many were.
    pub fn set_names(&self, names: EgressNames) -> usize {
        let names = Arc::new(names);
        self.shared.names.store(names.clone());
        self.shared
            .live
            .close_unless(|name, port| names.allows(name, Some(port)))
    }
}

impl Drop for TenantEgress {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        self.shared.live.close_unless(|_, _| false);
    }
}
