//! A tenant's own network, proven against a small world the test builds:
//! the gateway runs in a network namespace of its own whose only way out
//! is a veth to an "outside" namespace holding a public server
//! (93.184.215.10), a private one (10.77.0.1), a cloud-metadata address
//! (169.254.169.254) and the DNS resolver the gateway's host uses
//! (10.77.0.53, private: reached only through pasta's DNS mapping). In the
//! gateway's namespace a service listens on its loopback and on its own
//! address. Then, from inside each tenant: what its egress allows is
//! reached and names resolve; the host's loopback services, the gateway's
//! listeners (client, admin), the host's own address, private and
//! metadata addresses and another tenant's listener are not.
//!
//! Needs root, `ip`, `slirp4netns` and `nft`; skipped with the reason otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::fd::AsRawFd as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::{Client, Gateway};
use serde_json::json;

/// The two namespaces, the servers in them and `/etc/netns/<gw>`; all
/// removed on drop.
struct World {
    gw: String,
    net: String,
    servers: Vec<Child>,
}

impl Drop for World {
    fn drop(&mut self) {
        for s in &mut self.servers {
            let _ = s.kill();
            let _ = s.wait();
        }
        for ns in [&self.gw, &self.net] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        let _ = std::fs::remove_dir_all(format!("/etc/netns/{}", self.gw));
    }
}

fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("ip");
    assert!(st.success(), "ip {args:?}");
}

/// Why this host cannot run the test, if it cannot.
fn missing() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root (network namespaces)".to_owned());
    }
    for (tool, package) in [
        ("ip", "iproute2"),
        ("slirp4netns", "slirp4netns"),
        ("nft", "nftables"),
    ] {
        let found = ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
            .iter()
            .any(|d| Path::new(d).join(tool).is_file());
        if !found {
            return Some(format!("`{tool}` not installed (Debian package {package})"));
        }
    }
    None
}

/// TCP servers that answer their own name, and a DNS server answering every
/// A query with 93.184.215.10, in `ns`.
const SERVERS: &str = r#"
import socket, sys, threading
def tcp(addr, port, name):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port)); s.listen(16)
    def loop():
        while True:
            c, _ = s.accept(); c.sendall(name.encode() + b"\n"); c.close()
    threading.Thread(target=loop, daemon=True).start()
def dns(addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((addr, 53))
    while True:
        q, peer = s.recvfrom(512)
        end = q.index(b"\0", 12) + 5
        answer = b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04" + bytes([93, 184, 215, 10])
        s.sendto(q[:2] + b"\x81\x80" + q[4:6] + b"\x00\x01\x00\x00\x00\x00" + q[12:end] + answer, peer)
for spec in sys.argv[1:]:
    addr, port, name = spec.split(":")
    if name == "dns":
        threading.Thread(target=dns, args=(addr,), daemon=True).start()
    else:
        tcp(addr, int(port), name)
print("ready", flush=True)
threading.Event().wait()
"#;

fn serve_in(ns: &str, specs: &[&str]) -> Child {
    use std::io::BufRead as _;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "python3", "-c", SERVERS])
        .args(specs)
        .stdout(Stdio::piped())
        .spawn()
        .expect("servers");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    child
}

fn world() -> World {
    // Tests run in parallel in one process: a world of each its own.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let id = format!(
        "{}{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let w = World {
        gw: format!("egw-gw-{id}"),
        net: format!("egw-net-{id}"),
        servers: Vec::new(),
    };
    let (gw, net) = (w.gw.clone(), w.net.clone());
    let (vg, vn) = (format!("eg{id}"), format!("en{id}"));
    ip(&["netns", "add", &gw]);
    ip(&["netns", "add", &net]);
    ip(&[
        "link", "add", &vg, "netns", &gw, "type", "veth", "peer", "name", &vn, "netns", &net,
    ]);
    for (ns, cmds) in [
        (
            &gw,
            vec![
                vec!["link", "set", "lo", "up"],
                vec!["link", "set", &vg, "up"],
                vec!["addr", "add", "198.51.100.2/24", "dev", &vg],
                vec!["route", "add", "default", "via", "198.51.100.1"],
                // A public address of the host's own, not on the uplink.
                vec!["addr", "add", "93.184.215.77/32", "dev", "lo"],
                // Addresses it owns through a local route (anycast, VIPs).
                vec!["route", "add", "local", "93.184.217.0/24", "dev", "lo"],
            ],
        ),
        (
            &net,
            vec![
                vec!["link", "set", "lo", "up"],
                vec!["link", "set", &vn, "up"],
                vec!["addr", "add", "198.51.100.1/24", "dev", &vn],
                vec!["addr", "add", "93.184.215.10/32", "dev", "lo"],
                vec!["addr", "add", "10.77.0.1/32", "dev", "lo"],
                vec!["addr", "add", "10.77.0.53/32", "dev", "lo"],
                vec!["addr", "add", "169.254.169.254/32", "dev", "lo"],
            ],
        ),
    ] {
        for c in cmds {
            let mut args = vec!["-n", ns.as_str()];
            args.extend(c);
            ip(&args);
        }
    }
    // `ip netns exec` binds this over /etc/resolv.conf for the gateway.
    std::fs::create_dir_all(format!("/etc/netns/{gw}")).unwrap();
    std::fs::write(
        format!("/etc/netns/{gw}/resolv.conf"),
        "nameserver 10.77.0.53\nsearch corp.example\noptions ndots:2\n",
    )
    .unwrap();
    w
}

/// Enter `ns` on this thread (the test's runtime is single-threaded, so
/// every socket the test opens is made here).
fn enter(ns: &str) {
    let f = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
    // SAFETY: setns on this thread with a descriptor we hold.
    #[allow(unsafe_code)]
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
}

/// A shell script that runs the gateway binary in `ns` (with its
/// `/etc/netns` resolver).
fn wrapper(dir: &Path, ns: &str) -> PathBuf {
    let path = dir.join("gateway-in-netns");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nexec ip netns exec {ns} {} \"$@\"\n",
            env!("CARGO_BIN_EXE_exec-gateway")
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// What a tenant's process reaches: `name=ok:<answer>` or `name=<error>`.
const PROBE: &str = r#"
import socket, sys
for spec in sys.argv[1:]:
    name, addr, port = spec.split(",")
    try:
        s = socket.create_connection((addr, int(port)), timeout=3)
        print(f"{name}=ok:{s.recv(64).decode().strip()}")
    except OSError as e:
        print(f"{name}={e.__class__.__name__}:{e.errno}")
try:
    print("dns=" + socket.gethostbyname("pkg.corp.example"))
except OSError as e:
    print(f"dns={e}")
print("resolv=" + open("/etc/resolv.conf").read().replace("\n", "|"))
"#;

async fn probe(c: &mut Client, id: &str, root: &Path, targets: &[String]) -> String {
    let mut argv = vec!["python3".to_owned(), "-c".to_owned(), PROBE.to_owned()];
    argv.extend(targets.iter().cloned());
    c.call(
        "process/start",
        json!({"processId": id, "argv": argv, "cwd": root, "tty": false,
               "env": {"PATH": "/usr/bin:/bin"}}),
    )
    .await;
    let out = c.collect(id).await;
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

fn field<'a>(out: &'a str, name: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {out}"))
}

#[tokio::test]
async fn each_tenant_reaches_only_what_its_egress_allows() {
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let mut w = world();
    w.servers.push(serve_in(
        &w.net,
        &[
            "93.184.215.10:8080:public",
            "10.77.0.1:8080:private",
            "169.254.169.254:80:metadata",
            "10.77.0.53:53:dns",
        ],
    ));
    w.servers.push(serve_in(
        &w.gw,
        &[
            "127.0.0.1:8099:host-loopback",
            "198.51.100.2:8098:host-uplink",
            "93.184.215.77:8098:host-address",
            "93.184.217.5:8096:host-local-route",
        ],
    ));
    enter(&w.gw);
    let scratch = common::scratch();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (ra, rb) = (scratch.path().join("a"), scratch.path().join("b"));
    std::fs::create_dir_all(&ra).unwrap();
    std::fs::create_dir_all(&rb).unwrap();
    let bin = wrapper(scratch.path(), &w.gw);
    let gw = Gateway::launch(&bin, None, &[], |dir| {
        format!(
            "[isolation]\nnetwork = \"required\"\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
             [tenants.a]\nroot = \"{}\"\n\
             [tenants.b]\nroot = \"{}\"\negress = [\"10.77.0.1/32\"]\n",
            dir.display(),
            ra.display(),
            rb.display()
        )
    });
    let (_, ready) = gw.admin_get("/readyz").await;
    assert!(
        ready.contains("network: active") && ready.contains("1 isolated, egress internet"),
        "{ready}"
    );
    let port = |a: &str| a.rsplit(':').next().unwrap().to_owned();
    let (client, admin) = (port(&gw.addr), port(&gw.admin));
    let targets = |extra: &[(&str, &str, &str)]| -> Vec<String> {
        [
            ("public", "93.184.215.10", "8080"),
            ("private", "10.77.0.1", "8080"),
            ("metadata", "169.254.169.254", "80"),
            ("host-loopback", "127.0.0.1", "8099"),
            ("host-address", "93.184.215.77", "8098"),
            ("host-local-route", "93.184.217.5", "8096"),
            ("host-uplink", "198.51.100.2", "8098"),
            ("client-port", "127.0.0.1", client.as_str()),
            ("client-port-by-address", "93.184.215.77", client.as_str()),
            ("admin-port", "127.0.0.1", admin.as_str()),
        ]
        .iter()
        .chain(extra)
        .map(|(n, a, p)| format!("{n},{a},{p}"))
        .collect()
    };

    // a: the internet, nothing else.
    let (mut a, _) = gw.session_of("a").await;
    // A listener of a's own, on its loopback, for b to try.
    a.call(
        "process/start",
        json!({"processId": "srv", "argv": ["python3", "-c",
            "import socket;s=socket.socket();s.bind(('127.0.0.1',9000));s.listen();print('up',flush=True)\nwhile True:\n c,_=s.accept();c.sendall(b'tenant-a\\n');c.close()"],
            "cwd": ra, "tty": false, "env": {"PATH": "/usr/bin:/bin"}}),
    )
    .await;
    assert_eq!(a.first_line("srv").await, "up");
    let out = probe(
        &mut a,
        "pa",
        &ra,
        &targets(&[("own-listener", "127.0.0.1", "9000")]),
    )
    .await;
    assert_eq!(field(&out, "public"), "ok:public", "{out}");
    assert_eq!(field(&out, "own-listener"), "ok:tenant-a", "{out}");
    assert_eq!(field(&out, "dns"), "93.184.215.10", "{out}");
    assert!(
        field(&out, "resolv").contains("nameserver 10.0.2.3|search corp.example|options ndots:2"),
        "{out}"
    );
    // Refused by the namespace's ruleset, at once: EHOSTUNREACH.
    for name in [
        "private",
        "metadata",
        "host-address",
        "host-local-route",
        "host-uplink",
        "client-port-by-address",
    ] {
        assert_eq!(field(&out, name), "OSError:113", "{name}: {out}");
    }
    // The tenant's loopback is its own: nothing of the host's listens
    // there.
    for name in ["host-loopback", "client-port", "admin-port"] {
        assert_eq!(
            field(&out, name),
            "ConnectionRefusedError:111",
            "{name}: {out}"
        );
    }
    // The host's sockets are not in its /proc/net/tcp either.
    let hex = format!(":{:04X}", client.parse::<u16>().unwrap());
    let (_, tcp) = {
        a.call(
            "process/start",
            json!({"processId": "tcp", "argv": ["cat", "/proc/net/tcp"], "cwd": ra,
                   "tty": false, "env": {}}),
        )
        .await;
        let o = a.collect("tcp").await;
        ((), String::from_utf8_lossy(&o.stdout).into_owned())
    };
    assert!(
        !tcp.contains(&hex),
        "the gateway's port shows in a's /proc/net/tcp: {tcp}"
    );

    // An address the host gets later (DHCP, a VIP) is refused too, once the
    // rules are reloaded (HOST_ADDRESS_POLL, 1 s).
    ip(&["-n", &w.gw, "addr", "add", "93.184.215.78/32", "dev", "lo"]);
    w.servers
        .push(serve_in(&w.gw, &["93.184.215.78:8097:host-later"]));
    let later = vec!["later,93.184.215.78,8097".to_owned()];
    let deadline = tokio::time::Instant::now() + common::EVENT_TIMEOUT;
    for i in 0.. {
        let out = probe(&mut a, &format!("later{i}"), &ra, &later).await;
        if field(&out, "later") == "OSError:113" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a host address added later stays reachable: {out}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }

    // b: only its allowlisted private address; a's listener is out of reach.
    let (mut b, _) = gw.session_of("b").await;
    let out = probe(
        &mut b,
        "pb",
        &rb,
        &targets(&[("tenant-a", "127.0.0.1", "9000")]),
    )
    .await;
    assert_eq!(field(&out, "private"), "ok:private", "{out}");
    for name in ["public", "metadata", "host-address"] {
        assert_eq!(field(&out, name), "OSError:113", "{name}: {out}");
    }
    assert_eq!(
        field(&out, "tenant-a"),
        "ConnectionRefusedError:111",
        "{out}"
    );
    drop(gw);
    drop(w);
}

/// `network = "host"` is refused unless the network layer is turned off,
/// and an egress entry that is not a CIDR is refused.
#[test]
fn unsafe_network_settings_are_refused() {
    let dir = common::scratch();
    let root = dir.path().join("r");
    std::fs::create_dir_all(&root).unwrap();
    let cases = [
        (
            "[tenants.a]\nroot = \"/tmp\"\nnetwork = \"host\"\n",
            "allowed only with [isolation] network = \"off\"",
        ),
        (
            "[tenants.a]\nroot = \"/tmp\"\negress = [\"0.0.0.0/0\"]\n",
            "wider than a /8",
        ),
        (
            "[tenants.a]\nroot = \"/tmp\"\negress = [\"0.0.0.0/1\", \"128.0.0.0/1\"]\n",
            "wider than a /8",
        ),
        (
            "[tenants.a]\nroot = \"/tmp\"\negress = [\"169.254.169.254\"]\n",
            "overlaps 169.254.0.0/16",
        ),
        (
            "[tenants.a]\nroot = \"/tmp\"\negress = [\"127.0.0.1/32\"]\n",
            "overlaps 127.0.0.0/8",
        ),
        (
            "[tenants.a]\nroot = \"/tmp\"\negress = [\"168.63.0.0/16\"]\n",
            "overlaps 168.63.129.16/32",
        ),
        (
            "[tenants.a]\nroot = \"/tmp\"\negress = \"everywhere\"\n",
            "neither \"internet\"",
        ),
        (
            "[tenants.a]\nroot = \"/tmp\"\nnetwork = \"none\"\negress = \"internet\"\n",
            "applies to network = \"isolated\" only",
        ),
    ];
    for (i, (tenants, want)) in cases.iter().enumerate() {
        let tenants = tenants.replace("/tmp", &root.display().to_string());
        let config = common::write_file(
            dir.path(),
            &format!("c{i}.toml"),
            &format!(
                "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/k\"\n{tenants}",
                dir.path().display()
            ),
        );
        std::fs::write(dir.path().join("k"), "0123456789abcdef0123456789abcdef").unwrap();
        let out = common::serve_expecting_refusal(&config);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "case {i}: {err}");
    }
}

/// One tenant rooted at `root` under `network = "required"` (a layer that
/// cannot start stops the gateway).
fn required_network(dir: &Path, root: &Path) -> String {
    format!(
        "[isolation]\nnetwork = \"required\"\n\
         [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
         [tenants.a]\nroot = \"{}\"\n",
        dir.display(),
        root.display()
    )
}

/// A hard descriptor limit below slirp4netns's cap (4,096) keeps tenant
/// networks: the cap is lowered to fit, never raised (the gateway gives up
/// CAP_SYS_RESOURCE at start, and raising it failed, turning the layer off
/// and leaving tenants on the host's network).
#[tokio::test]
async fn a_low_descriptor_limit_keeps_tenant_networks() {
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("a");
    std::fs::create_dir_all(&root).unwrap();
    let path = dir.path().join("gateway-low-nofile");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nulimit -n 3000 || exit 1\nexec {} \"$@\"\n",
            env!("CARGO_BIN_EXE_exec-gateway")
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let gw = Gateway::launch(&path, None, &[], |d| required_network(d, &root));
    let (_, ready) = gw.admin_get("/readyz").await;
    assert!(ready.contains("network: active"), "{ready}");
    let (mut a, _) = gw.session_of("a").await;
    a.call(
        "process/start",
        json!({"processId": "n", "argv": ["cat", "/proc/net/dev"], "cwd": root,
               "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
    )
    .await;
    let out = String::from_utf8(a.collect("n").await.stdout).unwrap();
    assert!(out.contains("tap0"), "not its own network: {out}");
}

/// Starting tenants' networks leaves the host's named network namespaces
/// alone: slirp4netns's sandbox lazily unmounts its old root, and with
/// only `/` made private that unmount reached the host through the shared
/// `/run/netns` (every `ip netns exec` then failed with EINVAL).
#[tokio::test]
async fn tenant_networks_leave_the_hosts_named_namespaces_mounted() {
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let ns = format!("egw-keep-{}", std::process::id());
    ip(&["netns", "add", &ns]);
    struct Del(String);
    impl Drop for Del {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let _del = Del(ns.clone());
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("a");
    std::fs::create_dir_all(&root).unwrap();
    let gw = Gateway::start_with(|d| required_network(d, &root));
    let (mut a, _) = gw.session_of("a").await;
    a.call(
        "process/start",
        json!({"processId": "t", "argv": ["true"], "cwd": root,
               "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
    )
    .await;
    a.collect("t").await;
    let exec = Command::new("ip")
        .args(["netns", "exec", &ns, "true"])
        .output()
        .unwrap();
    assert!(
        exec.status.success(),
        "{}",
        String::from_utf8_lossy(&exec.stderr)
    );
}

/// A host without slirp4netns or nft refuses a configuration file with
/// tenants, whose tenants would otherwise share the host's network (its
/// loopback, the gateway's listeners, the admin endpoint): the layer is
/// `required` unless the file says otherwise. `network = "off"` written
/// in the file is the operator's choice, and starts.
#[test]
fn a_missing_network_tool_refuses_to_start() {
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let dir = common::scratch();
    let root = dir.path().join("r");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(dir.path().join("k"), "0123456789abcdef0123456789abcdef").unwrap();
    for tool in ["slirp4netns", "nft"] {
        // The gateway in a mount namespace of its own where every copy of
        // `tool` it could find is /dev/null (not a file).
        let wrapper = dir.path().join(format!("without-{tool}"));
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nexec unshare --mount --propagation private sh -c '\
                 for d in /usr/sbin /usr/bin /sbin /bin /usr/local/sbin /usr/local/bin; do \
                 if [ -f \"$d/{tool}\" ]; then mount --bind /dev/null \"$d/{tool}\" || exit 1; fi; done; \
                 exec \"$0\" \"$@\"' {} \"$@\"\n",
                env!("CARGO_BIN_EXE_exec-gateway")
            ),
        )
        .unwrap();
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
        for (isolation, refused) in [("", true), ("[isolation]\nnetwork = \"off\"\n", false)] {
            let config = common::write_file(
                dir.path(),
                &format!("{tool}.toml"),
                &format!(
                    "{isolation}[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/k\"\n\
                     [tenants.a]\nroot = \"{}\"\n",
                    dir.path().display(),
                    root.display()
                ),
            );
            let out = common::serve_expecting_refusal_as(&wrapper, &config);
            let err = String::from_utf8_lossy(&out.stderr);
            if refused {
                assert_eq!(out.status.code(), Some(64), "{tool}: {err}");
                assert!(
                    err.contains(&format!("`{tool}` not found"))
                        && err.contains("isolation layer `network` is required"),
                    "{tool}: {err}"
                );
            } else {
                // Started, then killed.
                assert!(out.status.code().is_none(), "{tool}, network off: {err}");
            }
        }
    }
}

/// A listener that accepts and never reads, in `ns` at `addr:port`.
fn sink_in(ns: &str, addr: &str, port: u16) -> Child {
    use std::io::BufRead as _;
    let script = format!(
        "import socket, threading\n\
         s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)\n\
         s.bind(('{addr}', {port})); s.listen(4096)\n\
         held = []\n\
         def loop():\n\
         \x20   while True: held.append(s.accept()[0])\n\
         threading.Thread(target=loop, daemon=True).start()\n\
         print('ready', flush=True)\n\
         threading.Event().wait()\n"
    );
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "python3", "-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .expect("sink");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    child
}

/// Opens up to argv[1] connections to the sink, each written to until
/// its send queue is full, and prints what it got on one line; then holds
/// them.
const FLOOD: &str = r#"
import socket, sys, threading
socks, err, queued = [], None, 0
for i in range(int(sys.argv[1])):
    try:
        s = socket.create_connection(("93.184.215.10", 9000), timeout=5)
    except OSError as e:
        err = e.errno
        break
    s.setblocking(False)
    try:
        while True:
            queued += s.send(b"x" * 65536)
    except BlockingIOError:
        pass
    socks.append(s)
wmem = open("/proc/sys/net/ipv4/tcp_wmem").read().split()[2]
print(f"opened={len(socks)} err={err} wmem={wmem} queued={queued}", flush=True)
threading.Event().wait()
"#;

/// One tenant's egress is bounded by its own limits: its connections out
/// of its namespace by `max_egress_connections` (the next is refused at
/// once, EHOSTUNREACH), what each may queue by its namespace's
/// `tcp_wmem`; and while it holds every connection it may, to a peer
/// that never reads, another tenant still reaches the same server.
#[tokio::test]
async fn a_tenants_egress_flood_is_refused_past_its_bound_and_another_keeps_working() {
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let mut w = world();
    w.servers.push(serve_in(
        &w.net,
        &["93.184.215.10:8080:public", "10.77.0.53:53:dns"],
    ));
    w.servers.push(sink_in(&w.net, "93.184.215.10", 9000));
    enter(&w.gw);
    let scratch = common::scratch();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (ra, rb) = (scratch.path().join("a"), scratch.path().join("b"));
    std::fs::create_dir_all(&ra).unwrap();
    std::fs::create_dir_all(&rb).unwrap();
    // Entered with nsenter, not `ip netns exec`: that mounts a sysfs of
    // the namespace's own over /sys, and the cgroups with it.
    let bin = scratch.path().join("gateway-nsenter");
    std::fs::write(
        &bin,
        format!(
            "#!/bin/sh\nexec nsenter --net=/run/netns/{} {} \"$@\"\n",
            w.gw,
            env!("CARGO_BIN_EXE_exec-gateway")
        ),
    )
    .unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let gw = Gateway::launch(&bin, None, &[], |dir| {
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
             [tenants.a]\nroot = \"{}\"\nmax_egress_connections = 20\n\
             [tenants.b]\nroot = \"{}\"\n",
            dir.display(),
            ra.display(),
            rb.display()
        )
    });
    let (mut a, _) = gw.session_of("a").await;
    a.call(
        "process/start",
        json!({"processId": "flood", "argv": ["python3", "-c", FLOOD, "60"], "cwd": ra,
               "tty": false, "env": {"PATH": "/usr/bin:/bin"}}),
    )
    .await;
    let line = a.first_line("flood").await;
    eprintln!("tenant a: {line}");
    let got = |k: &str| {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k} in {line}"))
            .to_owned()
    };
    // Its DNS flows count too, but it made none: exactly its bound.
    assert_eq!(got("opened"), "20", "{line}");
    assert_eq!(got("err"), "113", "refused with EHOSTUNREACH: {line}");
    assert_eq!(got("wmem"), (256 << 10).to_string(), "{line}");
    // Tenant b, meanwhile, reaches the same server's other port.
    let (mut b, _) = gw.session_of("b").await;
    let out = probe(&mut b, "p", &rb, &["public,93.184.215.10,8080".to_owned()]).await;
    assert_eq!(field(&out, "public"), "ok:public", "{out}");
    // Each tenant's slirp4netns runs in that tenant's cgroups (v1: its
    // memory cgroup; v2: a cgroup under the tenant's), not the gateway's.
    let instance = format!("gw-{}", gw.child.id());
    let mut charged: Vec<String> = Vec::new();
    for pid in common::host_pids_where(|cmd| {
        cmd.split(|b| *b == 0)
            .next()
            .is_some_and(|a0| a0.ends_with(b"slirp4netns"))
    }) {
        let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        for t in ["a", "b"] {
            let mine = cg.lines().any(|l| {
                l.contains(&format!("/{instance}/{t}/"))
                    || (l.contains(":memory:") && l.ends_with(&format!("/{instance}/{t}")))
            });
            if mine {
                charged.push(t.to_owned());
            }
        }
    }
    charged.sort();
    charged.dedup();
    assert_eq!(
        charged,
        ["a", "b"],
        "slirp4netns outside the tenants' cgroups"
    );
    a.call("process/terminate", json!({"processId": "flood"}))
        .await;
    a.collect("flood").await;
}

/// Egress tightened by a reload reaches the live tenant's running
/// session: its next connection to a now-refused address is refused (the
/// rules of its namespace are replaced), not only a new activation's.
#[tokio::test]
async fn a_reload_that_tightens_egress_reaches_live_sessions() {
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let mut w = world();
    w.servers.push(serve_in(
        &w.net,
        &["93.184.215.10:8080:public", "10.77.0.53:53:dns"],
    ));
    enter(&w.gw);
    let scratch = common::scratch();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let ra = scratch.path().join("a");
    std::fs::create_dir_all(&ra).unwrap();
    let bin = wrapper(scratch.path(), &w.gw);
    let text = |egress: &str, dir: &Path| {
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
             [tenants.a]\nroot = \"{}\"\negress = {egress}\n",
            dir.display(),
            ra.display()
        )
    };
    let gw = Gateway::launch(&bin, None, &[], |dir| text("\"internet\"", dir));
    let (mut a, _) = gw.session_of("a").await;
    let public = ["public,93.184.215.10,8080".to_owned()];
    let out = probe(&mut a, "before", &ra, &public).await;
    assert_eq!(field(&out, "public"), "ok:public", "{out}");
    std::fs::write(
        gw.dir.path().join("gateway.toml"),
        text("[\"10.77.0.1/32\"]", gw.dir.path()),
    )
    .unwrap();
    gw.signal(libc::SIGHUP);
    let deadline = std::time::Instant::now() + common::event_timeout();
    while gw.reloads("ok").await < 1.0 {
        assert!(std::time::Instant::now() < deadline, "no reload applied");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // The same session, the same activation: refused now.
    let out = probe(&mut a, "after", &ra, &public).await;
    assert_eq!(field(&out, "public"), "OSError:113", "{out}");
}

/// Found by the attack on issue 42's fixes: a file whose every tenant said
/// `network = "none"` started without probing the network layer, and a
/// reload that then added a tenant naming no network (or removed a
/// tenant's `none`) was accepted and put that tenant on the host's
/// network (`net:[...]` of the host, the gateway's loopback listeners
/// reachable), though the layer defaults to `required`. Such a reload is
/// refused now: the running configuration stays, and the tenant that said
/// `none` keeps its own loopback.
#[tokio::test]
async fn a_reload_never_puts_a_tenant_on_the_hosts_network_when_the_layer_was_not_probed() {
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let scratch = common::scratch();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (ra, rb) = (scratch.path().join("a"), scratch.path().join("b"));
    std::fs::create_dir_all(&ra).unwrap();
    std::fs::create_dir_all(&rb).unwrap();
    let text = |a_network: &str, b: bool, dir: &Path| {
        let b = if b {
            format!("[tenants.b]\nroot = \"{}\"\n", rb.display())
        } else {
            String::new()
        };
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
             [tenants.a]\nroot = \"{}\"\n{a_network}{b}",
            dir.display(),
            ra.display()
        )
    };
    let gw = Gateway::start_with(|dir| text("network = \"none\"\n", false, dir));
    let host_ns = std::fs::read_link("/proc/self/ns/net").unwrap();
    let reloads = |outcome: &'static str| gw.reloads(outcome);
    for (what, a_network, b) in [
        (
            "a tenant naming no network added",
            "network = \"none\"\n",
            true,
        ),
        ("a tenant's `none` removed", "", false),
    ] {
        let before = reloads("ok").await + reloads("refused").await;
        // Whole or not at all (the config watcher may read it too).
        let tmp = gw.dir.path().join("gateway.toml.new");
        std::fs::write(&tmp, text(a_network, b, gw.dir.path())).unwrap();
        std::fs::rename(&tmp, gw.dir.path().join("gateway.toml")).unwrap();
        gw.signal(libc::SIGHUP);
        let deadline = std::time::Instant::now() + common::event_timeout();
        while reloads("ok").await + reloads("refused").await <= before {
            assert!(std::time::Instant::now() < deadline, "{what}: no reload");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(reloads("ok").await, 0.0, "{what}: the reload was accepted");
        // b is not a tenant; a still runs in a namespace of its own.
        let (status, _) = gw
            .handshake("/", Some(&format!("Bearer {}", gw.token("b"))))
            .await;
        assert_eq!(status, 401, "{what}");
        let (mut a, _) = gw.session_of("a").await;
        a.call(
            "process/start",
            json!({"processId": "ns", "argv": ["readlink", "/proc/self/ns/net"],
                   "cwd": ra, "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
        )
        .await;
        let ns = a.first_line("ns").await;
        assert_ne!(
            ns,
            host_ns.to_string_lossy(),
            "{what}: a is on the host's network"
        );
        assert!(ns.starts_with("net:["), "{ns}");
    }
}
