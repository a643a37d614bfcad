//! Secrets for the tenant's own processes (`[tenants.NAME.secrets.VAR]`
//! with `substitute = true`), in the egress world of tests/egress_names.rs:
//! a process sees a placeholder in its environment, and the real value
//! reaches only the host the secret is bound to, put into the request's
//! header by the gateway's egress proxy, which ends the process's TLS with
//! a certificate of the tenant's own CA (trusted through the bundle bound
//! over the system's) and verifies the host's.
//!
//! Needs what tests/egress_names.rs needs; skipped with the reason
//! otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

#[path = "egress_world/world.rs"]
mod world;

use serde_json::json;
use world::*;

const VALUE: &str = "sk-live-7f3e-secret-value";

/// `argv` in the tenant with an environment of the client's that sets
/// neither the secret's variable nor a CA bundle (the gateway's apply).
async fn run_plain(t: &mut Tenant, argv: &[String]) -> Out {
    run_with(t, argv, false).await
}

/// `run_plain`, started with Codex's `networkProxy` when `proxied` (a
/// proxy of its own in `HTTPS_PROXY`).
async fn run_with(t: &mut Tenant, argv: &[String], proxied: bool) -> Out {
    t.n += 1;
    let id = format!("p{}", t.n);
    let mut params = json!({"processId": id, "argv": argv, "cwd": t.root, "tty": false,
                            "env": {"PATH": "/usr/bin:/bin", "HOME": t.root}});
    if proxied {
        params["networkProxy"] =
            json!({"proxy": {"enabled": true}, "policyDecisionTimeoutMs": 5000});
    }
    t.c.call("process/start", params).await;
    t.collect(&id).await
}

/// curl (bounded, verbose on stderr, the status after the body) in the
/// tenant with `Authorization: Bearer $API_KEY` (the placeholder) and
/// `args`.
async fn curl(t: &mut Tenant, args: &str) -> Out {
    let script = format!(
        "curl -sS -v --connect-timeout 5 --max-time 10 -w '\\nstatus=%{{http_code}}\\n' \
         -H \"Authorization: Bearer $API_KEY\" {args}"
    );
    run_plain(t, &sh(&script)).await
}

fn sh(script: &str) -> Vec<String> {
    vec!["sh".to_owned(), "-c".to_owned(), script.to_owned()]
}

fn audit(gw: &common::Gateway) -> String {
    std::fs::read_to_string(gw.dir.path().join("audit.jsonl")).unwrap_or_default()
}

/// The whole story, in one world (its setup is the slow part): the
/// placeholder in the environment, the value at the bound host only (not
/// at another allowed host, not through a `Host` naming another site on
/// the same address), a client that does not trust the tenant's CA (as a
/// pinning one) failing, the file unreadable and the value read anew per
/// connection, the trail naming the secret and never its value.
#[tokio::test]
async fn a_placeholder_becomes_the_value_only_at_its_host() {
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let w = world();
    let s = scratch();
    let file = secret_file(s.path(), "api_key", VALUE);
    let big = secret_file(s.path(), "big_key", &"b".repeat(8 << 10));
    let tenant = format!(
        "egress_names = [\"allowed.test\", \"a.cdn.test\", \"shared.test\"]\n\
         http_ca_file = \"{}\"\n\
         [tenants.t.secrets.API_KEY]\nfile = \"{}\"\nhosts = [\"allowed.test\"]\nsubstitute = true\n\
         [tenants.t.secrets.BIG_KEY]\nfile = \"{}\"\nhosts = [\"allowed.test\"]\nsubstitute = true\n",
        w.ca().display(),
        file.display(),
        big.display()
    );
    let gw = launch(&w, s.path(), &[("t", tenant.as_str())]);
    let mut t = Tenant::of(&gw, s.path(), "t").await;

    // The environment holds a placeholder; the value is nowhere the tenant
    // can read: not its environment, not the file.
    let o = run_plain(&mut t, &sh("echo \"$API_KEY\"; echo \"$SSL_CERT_FILE\"")).await;
    let mut lines = o.out.lines();
    let placeholder = lines.next().unwrap().to_owned();
    assert!(
        placeholder.starts_with("exg-placeholder-API_KEY-") && !placeholder.contains(VALUE),
        "{o:?}"
    );
    assert_eq!(
        lines.next(),
        Some("/etc/ssl/certs/ca-certificates.crt"),
        "{o:?}"
    );
    let o = run_plain(&mut t, &sh(&format!("cat {} 2>&1; echo", file.display()))).await;
    assert!(!o.out.contains(VALUE), "{o:?}");
    // The bundle holds certificates only: the CA's key is not in it.
    let o = run_plain(
        &mut t,
        &sh("grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt; grep -c PRIVATE /etc/ssl/certs/ca-certificates.crt"),
    )
    .await;
    let counts: Vec<&str> = o.out.lines().collect();
    assert!(counts.len() == 2 && counts[0] != "0", "{o:?}");
    assert_eq!(counts[1], "0", "{o:?}");

    // curl, trusting the system bundle (no --cacert): the bound host gets
    // the value, and the certificate curl met is the tenant CA's.
    let o = curl(&mut t, "https://allowed.test/").await;
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.out.starts_with("server-10 "), "{o:?}");
    assert!(
        o.out.contains(&format!("authorization=Bearer {VALUE}")),
        "{o:?}"
    );
    assert!(
        o.err.contains("exec-gateway egress CA for tenant t"),
        "{o:?}"
    );

    // Python's urllib (the default SSL context reads SSL_CERT_FILE), with
    // the placeholder in another header: substituted there too.
    let py = "import os, urllib.request as u\n\
              r = u.Request('https://allowed.test/', headers={'X-Api-Key': 'k=' + os.environ['API_KEY']})\n\
              print(u.urlopen(r, timeout=10).read().decode())";
    let o = run_plain(
        &mut t,
        &["python3".to_owned(), "-c".to_owned(), py.to_owned()],
    )
    .await;
    assert!(o.out.contains(&format!("x-api-key=k={VALUE}")), "{o:?}");

    // Another allowed host is not intercepted: it gets the placeholder,
    // over its own certificate (the world CA's, as the tenant's file).
    let o = curl(&mut t, "--cacert ca.pem https://a.cdn.test/").await;
    assert!(o.out.starts_with("server-12 "), "{o:?}");
    assert!(
        o.out
            .contains(&format!("authorization=Bearer {placeholder}")),
        "{o:?}"
    );
    assert!(!o.out.contains(VALUE), "{o:?}");

    // A Host naming another site on the bound host's address (domain
    // fronting): 421, the value sent nowhere.
    let o = curl(&mut t, "-H 'Host: shared.test' https://allowed.test/").await;
    assert_eq!(o.status(), "421", "{o:?}");
    assert!(!o.out.contains(VALUE), "{o:?}");

    // A client that trusts only the host's real CA (as one pinning the
    // host's certificate would) refuses the interception: the price of
    // substitution, which is why it is per secret.
    let o = curl(&mut t, "--cacert ca.pem https://allowed.test/").await;
    assert_eq!(o.code, 60, "{o:?}");

    // A header of placeholders that the values would make into hundreds
    // of KiB: refused (431) before anything is built.
    let many = "-H \"X-Many: $(for i in $(seq 40); do printf %s \"$BIG_KEY\"; done)\"";
    let o = curl(&mut t, &format!("{many} https://allowed.test/")).await;
    assert_eq!(o.status(), "431", "{o:?}");

    // A process started with Codex's `networkProxy` reaches the host
    // through its own proxy (CONNECT): intercepted there too.
    let argv =
        sh("curl -sS --max-time 10 -H \"Authorization: Bearer $API_KEY\" https://allowed.test/");
    let o = run_with(&mut t, &argv, true).await;
    assert!(
        o.out.contains(&format!("authorization=Bearer {VALUE}")),
        "{o:?}"
    );

    // A tunnel to a bound host that is not TLS (a server that speaks
    // first, as SSH) is joined as it is, not intercepted.
    let py = "import base64, os, socket, urllib.parse as p\n\
              u = p.urlsplit(os.environ['HTTPS_PROXY'])\n\
              a = base64.b64encode(f'{u.username}:{u.password}'.encode()).decode()\n\
              s = socket.create_connection((u.hostname, u.port), timeout=10)\n\
              s.sendall(f'CONNECT allowed.test:2222 HTTP/1.1\\r\\nHost: allowed.test:2222\\r\\nProxy-Authorization: Basic {a}\\r\\n\\r\\n'.encode())\n\
              got = b''\n\
              while b'ssh-like' not in got:\n\
              \x20   c = s.recv(4096)\n\
              \x20   if not c: break\n\
              \x20   got += c\n\
              print(got.decode(errors='replace'))";
    let argv = ["python3".to_owned(), "-c".to_owned(), py.to_owned()];
    let o = run_with(&mut t, &argv, true).await;
    assert!(
        o.out.contains(" 200 ") && o.out.contains("ssh-like"),
        "{o:?}"
    );

    // An upgraded connection (a WebSocket's handshake, substituted) goes
    // on as a byte stream, and a policy change that drops the host closes
    // it like any other.
    let trigger = t.root.join("trigger").display().to_string();
    let py = format!(
        "import os, socket, ssl, time\n\
         s = ssl.create_default_context().wrap_socket(socket.create_connection(('allowed.test', 8443), timeout=10), server_hostname='allowed.test')\n\
         s.sendall(('GET / HTTP/1.1\\r\\nHost: allowed.test:8443\\r\\nConnection: Upgrade\\r\\nUpgrade: echo\\r\\nAuthorization: Bearer ' + os.environ['API_KEY'] + '\\r\\n\\r\\n').encode())\n\
         head = b''\n\
         while b'\\r\\n\\r\\n' not in head: head += s.recv(4096)\n\
         s.sendall(b'ping'); got = s.recv(4096)\n\
         print('head=' + repr(head) + ' echo=' + got.decode(), flush=True)\n\
         while not os.path.exists('{trigger}'): time.sleep(0.05)\n\
         try:\n\
         \x20   s.sendall(b'pong'); got = s.recv(4096)\n\
         \x20   print('after=' + ('closed:eof' if not got else 'ok:' + got.decode()), flush=True)\n\
         except OSError as e:\n\
         \x20   print('after=closed:' + e.__class__.__name__, flush=True)\n"
    );
    t.n += 1;
    let id = format!("u{}", t.n);
    t.c.call(
        "process/start",
        json!({"processId": id, "argv": ["python3", "-c", py], "cwd": t.root, "tty": false,
               "env": {"PATH": "/usr/bin:/bin", "HOME": t.root}}),
    )
    .await;
    let first = t.c.first_line(&id).await;
    assert!(
        first.contains(" 101 ")
            && first
                .to_lowercase()
                .contains(&format!("x-authorization: bearer {VALUE}"))
            && first.ends_with("echo=ping"),
        "{first}"
    );
    let mut admin =
        common::Client::connect(&gw.url, &common::mint(&gw.secret, "t", "exec egress")).await;
    admin.initialize().await;
    let r = admin
        .call(
            "gateway/egress/set",
            json!({"names": ["a.cdn.test", "shared.test"]}),
        )
        .await;
    assert!(r["closed"].as_u64().unwrap_or(0) >= 1, "{r}");
    std::fs::write(&trigger, "").unwrap();
    let o = t.collect(&id).await;
    assert!(o.out.contains("after=closed"), "{o:?}");
    admin
        .call(
            "gateway/egress/set",
            json!({"names": ["allowed.test", "a.cdn.test", "shared.test"]}),
        )
        .await;

    // The gateway's own http/request to the bound host meets the same
    // interception (and trusts the tenant's CA for it).
    let r =
        t.c.call_raw(
            "http/request",
            json!({"method": "GET", "url": "https://allowed.test/", "requestId": "h1"}),
        )
        .await;
    assert_eq!(r["result"]["status"], 200, "{r}");

    // The value is read per connection: a rotated file is used at once.
    std::fs::write(&file, "rotated-value-2\n").unwrap();
    let o = curl(&mut t, "https://allowed.test/").await;
    assert!(
        o.out.contains("authorization=Bearer rotated-value-2"),
        "{o:?}"
    );

    // The trail names the secret, never its value.
    let deadline = tokio::time::Instant::now() + common::event_timeout();
    while !audit(&gw).contains("\"egress.substituted\"") {
        assert!(tokio::time::Instant::now() < deadline, "{}", audit(&gw));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let trail = audit(&gw);
    let event = trail
        .lines()
        .find(|l| l.contains("\"egress.substituted\""))
        .unwrap();
    let event: serde_json::Value = serde_json::from_str(event).unwrap();
    assert_eq!(event["secrets"], json!(["API_KEY"]), "{event}");
    assert!(!trail.contains(VALUE) && !trail.contains("rotated-value-2"));
}

/// `substitute` without `egress_names` is refused at start: without the
/// proxy nothing could put the value in, and the placeholder would leave
/// as it is.
#[test]
fn substitute_needs_egress_names() {
    let dir = common::scratch();
    let root = dir.path().join("r");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(dir.path().join("k"), "0123456789abcdef0123456789abcdef").unwrap();
    std::fs::write(dir.path().join("v"), "x").unwrap();
    let config = common::write_file(
        dir.path(),
        "c.toml",
        &format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{0}/k\"\n\
             [tenants.a]\nroot = \"{1}\"\n\
             [tenants.a.secrets.K]\nfile = \"{0}/v\"\nhosts = [\"api.test\"]\nsubstitute = true\n",
            dir.path().display(),
            root.display()
        ),
    );
    let out = common::serve_expecting_refusal(&config);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains("tenants.a.secrets.K.substitute needs egress_names"),
        "{err}"
    );
}
