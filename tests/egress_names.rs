//! Egress by name (`tenants.NAME.egress_names`), proven against a small
//! world the test builds, as tests/network.rs does: the gateway runs in a
//! network namespace of its own whose only way out is a veth to an
//! "outside" namespace. There, dnsmasq is the resolver the gateway's host
//! uses (10.77.0.53, also on a "public resolver" address, 93.184.215.53),
//! and Python servers (tests/egress_world/servers.py) answer HTTPS, HTTP,
//! a raw banner protocol, TLS, UDP and a git repository at public test
//! addresses, each with a certificate of a test CA (made with openssl at
//! test time) that the tenants trust through a file in their root.
//!
//! From inside each tenant: names it lists resolve and are reached (a
//! wildcard covers subdomains, not the apex; a `:port` only that port);
//! unlisted names never reach the resolver; every bypass (an IP literal, a
//! mismatched SNI or Host, a CNAME into an unlisted name, a shared address,
//! DNS over TLS, HTTPS or UDP straight to a resolver, IPv6, QUIC) fails,
//! while the same attempt from the gateway's host succeeds (so the failure
//! is the gateway's doing); a change at run time applies to new connections
//! and closes open ones; decisions are audited.
//!
//! Needs root, `ip`, `slirp4netns`, `nft`, `dnsmasq`, `openssl`, `git` and
//! `curl`; skipped with the reason otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

#[path = "egress_world/world.rs"]
mod world;

use common::Client;
use serde_json::{Value, json};
use world::*;

/// `egress = "internet"` beside `egress_names` would narrow nothing: the
/// gateway refuses to start, naming `egress_names`.
#[test]
fn internet_beside_names_is_refused() {
    let dir = common::scratch();
    let root = dir.path().join("r");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(dir.path().join("k"), "0123456789abcdef0123456789abcdef").unwrap();
    let config = common::write_file(
        dir.path(),
        "c.toml",
        &format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/k\"\n\
             [tenants.a]\nroot = \"{}\"\negress = \"internet\"\negress_names = [\"allowed.test\"]\n",
            dir.path().display(),
            root.display()
        ),
    );
    let out = common::serve_expecting_refusal(&config);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("egress_names"), "{err}");
}

/// Listed names resolve and are reached (a wildcard's subdomains, not its
/// apex; `git.test:443` on 443 only); unlisted ones are NXDOMAIN without a
/// query reaching the resolver; a non-TLS, non-HTTP protocol reaches an
/// address only once a listed name resolved to it; the CIDR list keeps
/// working beside names; another tenant has its own names only.
#[tokio::test]
async fn names_decide_what_a_tenant_reaches() {
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let w = world();
    let s = scratch();
    let a_names = "egress_names = [\"allowed.test\", \"*.cdn.test\", \"git.test:443\"]\n\
                   egress = [\"10.77.0.1/32\"]";
    let b_names = "egress_names = [\"other.test\"]";
    let gw = launch(&w, s.path(), &[("a", a_names), ("b", b_names)]);
    let mut a = Tenant::of(&gw, s.path(), "a").await;

    // Before any name resolved to it, the banner port is out of reach.
    let out = a.probe("connect,before,93.184.215.10,2222").await;
    assert!(!out.field("before").starts_with("ok:"), "{out:?}");

    // Unlisted names first, then listed ones (dnsmasq logs in order).
    let out = a
        .probe(
            "resolve,other,other.test resolve,shared,shared.test resolve,doh,doh.test \
             resolve,alias,alias.test resolve,apex,cdn.test resolve,allowed,allowed.test \
             resolve,cdn,a.cdn.test resolve,git,git.test connect,banner,93.184.215.10,2222 \
             connect,banner11,93.184.215.11,2222 connect,private,10.77.0.1,8080",
        )
        .await;
    for name in ["other", "shared", "doh", "alias", "apex"] {
        let nx = out.field(name);
        assert!(nx.starts_with("nx:gaierror"), "{name}: {out:?}");
    }
    assert_eq!(out.field("allowed"), "93.184.215.10", "{out:?}");
    assert_eq!(out.field("cdn"), "93.184.215.12", "{out:?}");
    assert_eq!(out.field("git"), "93.184.215.13", "{out:?}");
    // The address is attributed to the name the tenant resolved.
    assert_eq!(out.field("banner"), "ok:ssh-like", "{out:?}");
    assert!(!out.field("banner11").starts_with("ok:"), "{out:?}");
    // `egress`'s CIDRs, beside the names.
    assert_eq!(out.field("private"), "ok:private", "{out:?}");

    let nx = a.run(&words("getent hosts other.test")).await;
    assert_eq!((nx.code, nx.out.as_str()), (2, ""), "{nx:?}");
    let ok = a.run(&words("getent ahostsv4 allowed.test")).await;
    assert!(ok.code == 0 && ok.out.contains("93.184.215.10"), "{ok:?}");

    // The resolver saw the listed names and none of the others.
    let deadline = std::time::Instant::now() + common::event_timeout();
    while !w.queries().contains("] allowed.test from") {
        assert!(std::time::Instant::now() < deadline, "{}", w.queries());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let log = w.queries();
    for name in split("other.test shared.test doh.test alias.test cdn.test") {
        assert!(!log.contains(&format!("] {name} from")), "{name}: {log}");
    }

    let o = a.curl(&["https://allowed.test/"]).await;
    assert_eq!((o.server(), o.status()), ("server-10", "200"), "{o:?}");
    assert!(o.out.contains("host=allowed.test"), "{o:?}");
    for sub in ["a", "b"] {
        let o = a.curl(&[&format!("https://{sub}.cdn.test/")]).await;
        assert_eq!((o.server(), o.status()), ("server-12", "200"), "{o:?}");
    }
    let o = a.curl(&["https://cdn.test/"]).await;
    assert!(o.code != 0 && o.server().is_empty(), "the apex: {o:?}");
    let o = a.curl(&["http://allowed.test/"]).await;
    assert_eq!((o.server(), o.status()), ("server-10", "200"), "{o:?}");
    // git.test is listed on 443 only.
    let o = a.curl(&["http://git.test/"]).await;
    assert_ne!(o.server(), "server-13", "git.test:80: {o:?}");

    let o = a
        .run(&words("git clone -q https://git.test/repo.git clone"))
        .await;
    assert_eq!(o.code, 0, "git clone: {}", o.err);
    let hello = std::fs::read_to_string(a.root.join("clone/hello.txt")).unwrap();
    assert_eq!(hello, "hello from git.test\n");

    // b: its own name, not a's, and not a's CIDRs.
    let mut b = Tenant::of(&gw, s.path(), "b").await;
    let out = b
        .probe(
            "resolve,allowed,allowed.test resolve,other,other.test \
             connect,private,10.77.0.1,8080",
        )
        .await;
    assert!(out.field("allowed").starts_with("nx:"), "{out:?}");
    assert_eq!(out.field("other"), "93.184.215.11", "{out:?}");
    assert!(!out.field("private").starts_with("ok:"), "{out:?}");
    let o = b.curl(&["https://other.test/"]).await;
    assert_eq!(o.server(), "server-11", "{o:?}");
    let o = b.curl(&["https://allowed.test/"]).await;
    assert!(o.code != 0 && o.server().is_empty(), "{o:?}");
}

/// Every way around the names fails from the tenant, and succeeds from
/// the gateway's host (the world's control); an SNI naming a listed name
/// is connected to where that name resolves, not to the address the
/// process picked.
#[tokio::test]
async fn bypasses_are_refused() {
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let w = world();
    let s = scratch();
    let gw = launch(&w, s.path(), &[("a", "egress_names = [\"allowed.test\"]")]);
    let mut a = Tenant::of(&gw, s.path(), "a").await;
    // Resolved first: its address is the tenant's by that name only.
    let out = a.probe("resolve,allowed,allowed.test").await;
    assert_eq!(out.field("allowed"), "93.184.215.10", "{out:?}");

    // (what, curl's arguments, the server the host reaches)
    let curls = [
        ("an IP literal", "-k https://93.184.215.11/", "server-11"),
        (
            "the listed name's address",
            "-k https://93.184.215.10/",
            "server-10",
        ),
        (
            "an unlisted SNI to the listed name's address",
            "--resolve other.test:443:93.184.215.10 https://other.test/",
            "server-10",
        ),
        (
            "a CNAME into an unlisted name",
            "--resolve alias.test:443:93.184.215.11 https://alias.test/",
            "server-11",
        ),
        (
            "an unlisted name sharing the listed name's address",
            "--resolve shared.test:443:93.184.215.10 https://shared.test/",
            "server-10",
        ),
        (
            "DNS over HTTPS by address",
            "-k https://93.184.215.53/",
            "doh",
        ),
        (
            "DNS over HTTPS by name",
            "--resolve doh.test:443:93.184.215.53 https://doh.test/",
            "doh",
        ),
        ("IPv6", "-g https://[2001:db8::10]/", "server-10"),
    ];
    for (what, args, server) in curls {
        let host = w.host(&curl_argv(&w.ca(), &split(args)));
        assert_eq!(host.server(), server, "control, {what}: {host:?}");
        let o = a.curl(&split(args)).await;
        let refused = o.code != 0 && o.server().is_empty();
        assert!(refused, "{what} was not refused: {o:?}");
    }

    // An SNI of the listed name sent to another address: connected to
    // where allowed.test resolves.
    let args = split("--resolve allowed.test:443:93.184.215.11 https://allowed.test/");
    assert_eq!(w.host(&curl_argv(&w.ca(), &args)).server(), "server-11");
    let o = a.curl(&args).await;
    assert_eq!((o.code, o.server()), (0, "server-10"), "{o:?}");

    // A Host header naming an unlisted name: refused by the gateway.
    let args = ["-H", "Host: other.test", "http://93.184.215.10/"];
    assert_eq!(w.host(&curl_argv(&w.ca(), &args)).server(), "server-10");
    let o = a.curl(&args).await;
    assert_eq!(o.status(), "403", "{o:?}");
    assert!(o.out.contains("egress"), "{o:?}");
    assert_ne!(o.server(), "server-10", "{o:?}");

    // (step, what the host gets, what the tenant must not get). The
    // host's DNS control asks another name than the tenant's.
    let steps = [
        ("connect,raw,93.184.215.11,2222", "ok:ssh-like-11", "ok:"),
        ("tls,dot,93.184.215.53,853,doh.test", "ok:", "ok:"),
        (
            "tls,v6,2001:db8::10,443,allowed.test",
            "ok:server-10",
            "ok:",
        ),
        ("aaaa,aaaa,allowed.test", "usable:", "usable:"),
        ("udp,quic,93.184.215.10,443", "reply:quic:", "reply:"),
        ("dns,dns53,93.184.215.53,direct.test", "answer:", "answer:"),
        ("dns,dns77,10.77.0.53,direct.test", "answer:", "answer:"),
    ];
    let all = steps.map(|(s, ..)| s).join(" ");
    let host = w.host(&probe_argv(
        false,
        &all.replace("direct.test", "control.test"),
    ));
    let tenant = a.probe(&all).await;
    for (step, control, refused) in steps {
        let label = step.split(',').nth(1).unwrap();
        let (h, t) = (host.field(label), tenant.field(label));
        assert!(h.starts_with(control), "control {label}: {host:?}");
        assert!(
            !t.starts_with(refused),
            "{label} was not refused: {tenant:?}"
        );
    }
    // Neither DNS query straight to a resolver arrived.
    let log = w.queries();
    assert!(log.contains("] control.test from"), "{log}");
    assert!(!log.contains("] direct.test from"), "{log}");
}

/// The names of `v` (a `gateway/egress/get` result), sorted.
fn names(v: &Value) -> Vec<&str> {
    let list = v["names"].as_array();
    let mut n: Vec<&str> = list
        .unwrap_or_else(|| panic!("no names in {v}"))
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    n.sort_unstable();
    n
}

/// `gateway/egress/get` and `set` (scope `egress`): a set applies to the
/// tenant's next connections and closes its open ones to names it no
/// longer lists; a token without the scope cannot set; another tenant's
/// names stay.
#[tokio::test]
async fn a_runtime_change_applies_to_new_connections_and_closes_open_ones() {
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let w = world();
    let s = scratch();
    let allowed = "egress_names = [\"allowed.test\"]";
    let gw = launch(&w, s.path(), &[("a", allowed), ("b", allowed)]);
    let mut a = Tenant::of(&gw, s.path(), "a").await;
    // A keep-alive connection to allowed.test, asked again once `trigger`
    // exists.
    let trigger = a.root.join("trigger").display().to_string();
    let mut hold = words("python3 -c");
    hold.extend([HOLD.to_owned(), "allowed.test".to_owned(), trigger.clone()]);
    let held = a.start(&hold).await;
    let first = a.c.first_line(&held).await;
    assert!(first.starts_with("first=server-10"), "{first}");

    let scoped = |t: &str| common::mint(&gw.secret, t, "exec fs:read fs:write egress");
    let mut admin = Client::connect(&gw.url, &scoped("a")).await;
    admin.initialize().await;
    let got = admin.call("gateway/egress/get", json!({})).await;
    assert_eq!(names(&got), ["allowed.test"], "{got}");
    let both = json!({"names": ["allowed.test", "other.test"]});

    // Without the scope: an error, and nothing changes.
    let mut plain = Client::connect(&gw.url, &gw.token("a")).await;
    plain.initialize().await;
    let r = plain.call_raw("gateway/egress/set", both.clone()).await;
    assert!(r.get("error").is_some(), "{r}");
    let got = admin.call("gateway/egress/get", json!({})).await;
    assert_eq!(names(&got), ["allowed.test"], "{got}");
    let o = a.curl(&["https://other.test/"]).await;
    assert!(o.code != 0 && o.server().is_empty(), "{o:?}");

    admin.call("gateway/egress/set", both).await;
    let got = admin.call("gateway/egress/get", json!({})).await;
    assert_eq!(names(&got), ["allowed.test", "other.test"], "{got}");
    let o = a.curl(&["https://other.test/"]).await;
    assert_eq!((o.server(), o.status()), ("server-11", "200"), "{o:?}");

    let only_other = json!({"names": ["other.test"]});
    admin.call("gateway/egress/set", only_other).await;
    let o = a.curl(&["https://allowed.test/"]).await;
    assert!(o.code != 0 && o.server().is_empty(), "{o:?}");
    let o = a.curl(&["https://other.test/"]).await;
    assert_eq!(o.server(), "server-11", "{o:?}");
    // The connection opened before the change was closed by it.
    std::fs::write(&trigger, "").unwrap();
    let o = a.collect(&held).await;
    assert!(o.out.contains("second=closed:"), "{o:?}");

    // b's names are its own.
    let mut b_admin = Client::connect(&gw.url, &scoped("b")).await;
    b_admin.initialize().await;
    let got = b_admin.call("gateway/egress/get", json!({})).await;
    assert_eq!(names(&got), ["allowed.test"], "{got}");
    let mut b = Tenant::of(&gw, s.path(), "b").await;
    let o = b.curl(&["https://allowed.test/"]).await;
    assert_eq!(o.server(), "server-10", "{o:?}");
    let o = b.curl(&["https://other.test/"]).await;
    assert!(o.code != 0 && o.server().is_empty(), "{o:?}");
}

/// Whether `all` holds a `kind` event of `tenant` for `target` (its name,
/// or its address when it has none) and `port`.
fn holds(all: &[Value], (kind, tenant, target, port): (&str, &str, &str, u16)) -> bool {
    all.iter().any(|e| {
        e["event"] == kind
            && e["tenant"] == tenant
            && e["port"] == port
            && (e["name"] == target || e["address"] == target)
    })
}

/// Each decision is an `egress.allowed` or `egress.denied` event naming
/// the tenant, the name (the address when there is none) and the port;
/// no header value or token is in the trail.
#[tokio::test]
async fn decisions_are_audited() {
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let w = world();
    let s = scratch();
    let (a_names, b_names) = (
        "egress_names = [\"allowed.test\"]",
        "egress_names = [\"other.test\"]",
    );
    let gw = launch(&w, s.path(), &[("a", a_names), ("b", b_names)]);
    let mut a = Tenant::of(&gw, s.path(), "a").await;
    let o = a.curl(&["https://allowed.test/"]).await;
    assert_eq!(o.server(), "server-10", "{o:?}");
    let o = a.curl(&["http://allowed.test/"]).await;
    assert_eq!(o.server(), "server-10", "{o:?}");
    let sni = "--resolve other.test:443:93.184.215.10 https://other.test/";
    for args in [sni, "-k https://93.184.215.11/"] {
        let o = a.curl(&split(args)).await;
        assert!(o.code != 0, "{o:?}");
    }
    let mut b = Tenant::of(&gw, s.path(), "b").await;
    let o = b.curl(&["https://other.test/"]).await;
    assert_eq!(o.server(), "server-11", "{o:?}");

    let trail = gw.dir.path().join("audit.jsonl");
    let read = || -> Vec<Value> {
        let text = std::fs::read_to_string(&trail).unwrap_or_default();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let want = [
        ("egress.allowed", "a", "allowed.test", 443),
        ("egress.allowed", "a", "allowed.test", 80),
        ("egress.denied", "a", "other.test", 443),
        ("egress.denied", "a", "93.184.215.11", 443),
        ("egress.allowed", "b", "other.test", 443),
    ];
    let deadline = tokio::time::Instant::now() + common::event_timeout();
    let all = loop {
        let all = read();
        let absent: Vec<_> = want.iter().filter(|w| !holds(&all, **w)).collect();
        if absent.is_empty() {
            break all;
        }
        let late = tokio::time::Instant::now() >= deadline;
        assert!(!late, "missing {absent:?} in {all:#?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    // Nothing allowed that was refused, and no tenant in another's events.
    assert!(
        !holds(&all, ("egress.allowed", "a", "other.test", 443)),
        "{all:#?}"
    );
    assert!(
        !holds(&all, ("egress.allowed", "b", "allowed.test", 443)),
        "{all:#?}"
    );
    let raw = std::fs::read_to_string(&trail).unwrap();
    // (A process's argv is in the trail by design: `process.started`.)
    for secret in [&a.token, &b.token] {
        assert!(!raw.contains(secret), "the trail holds a secret");
    }
}

/// The resolver's queries out leave from ports no tenant process can
/// have: a tenant asking from a fresh port each time never meets one of
/// the gateway's connection-tracking entries (which sent its query out
/// unredirected, to be refused).
#[tokio::test]
async fn the_tenants_dns_never_collides_with_the_resolvers_own() {
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let w = resolved_world();
    let s = scratch();
    let gw = launch(&w, s.path(), &[("t", "egress_names = [\"allowed.test\"]")]);
    let mut t = Tenant::of(&gw, s.path(), "t").await;
    let py = "import socket, struct\n\
              q = struct.pack('>HHHHHH', 7, 0x100, 1, 0, 0, 0) + b'\\x07allowed\\x04test\\x00\\x00\\x01\\x00\\x01'\n\
              ok = bad = 0\n\
              for i in range(600):\n\
              \x20   s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)\n\
              \x20   try:\n\
              \x20       s.sendto(q, ('10.0.2.3', 53)); r = s.recv(512); ok += r[3] & 15 == 0\n\
              \x20   except OSError:\n\
              \x20       bad += 1\n\
              \x20   s.close()\n\
              print(ok, bad)";
    let o = t
        .run(&["python3".to_owned(), "-c".to_owned(), py.to_owned()])
        .await;
    assert_eq!(o.out.trim(), "600 0", "{o:?}");
}
