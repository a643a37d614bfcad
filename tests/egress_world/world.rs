//! The world of the egress tests (tests/egress_names.rs,
//! tests/egress_ask.rs, tests/http_request.rs): the gateway in a network
//! namespace of its own, an "outside" one with dnsmasq and the servers of
//! tests/egress_world/servers.py, a test CA, and a tenant's session.

#![allow(dead_code)]

use std::os::fd::AsRawFd as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::common::{self, Client, Gateway};
use serde_json::json;

pub const WORLD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/egress_world");
/// Run in tenants with `python3 -c`, on the host from its path.
pub const PROBE: &str = include_str!("probe.py");
pub const PROBE_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/egress_world/probe.py");
pub const HOLD: &str = include_str!("hold.py");
pub const DNSMASQ: &str = "/usr/sbin/dnsmasq";

/// The namespaces, the servers and dnsmasq in them, `/etc/netns/<gw>`
/// and the world's files (CA, certificates, repository, query log); all
/// removed on drop.
pub struct World {
    pub gw: String,
    pub net: String,
    pub children: Vec<Child>,
    pub dir: tempfile::TempDir,
}

impl Drop for World {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in [&self.gw, &self.net] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        let _ = std::fs::remove_dir_all(format!("/etc/netns/{}", self.gw));
    }
}

impl World {
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("pki/ca.pem")
    }

    /// dnsmasq's query log.
    pub fn queries(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("dns.log")).unwrap_or_default()
    }

    /// `argv` run on the gateway's host (its namespace and resolver), as
    /// root: the control that shows what the tenant is refused exists.
    pub fn host(&self, argv: &[String]) -> Out {
        let o = Command::new("ip")
            .args(["netns", "exec", &self.gw])
            .args(argv)
            .env("SSL_CERT_FILE", self.ca())
            .output()
            .unwrap();
        Out {
            code: o.status.code().map_or(-1, i64::from),
            out: String::from_utf8_lossy(&o.stdout).into_owned(),
            err: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

/// Why this host cannot run the test, if it cannot.
pub fn missing() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root (network namespaces)".to_owned());
    }
    if !Path::new("/proc/sys/net/ipv6").is_dir() {
        return Some("needs IPv6 in the kernel (the IPv6 bypass)".to_owned());
    }
    // The tenants' PATH is /usr/bin:/bin.
    for (tool, package) in [
        ("ip", "iproute2"),
        ("slirp4netns", "slirp4netns"),
        ("nft", "nftables"),
        ("dnsmasq", "dnsmasq-base"),
        ("openssl", "openssl"),
        ("git", "git"),
        ("curl", "curl"),
        ("python3", "python3"),
    ] {
        let found = ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
            .iter()
            .any(|d| Path::new(d).join(tool).is_file());
        if !found || (tool == "dnsmasq" && !Path::new(DNSMASQ).is_file()) {
            return Some(format!("`{tool}` not installed (Debian package {package})"));
        }
    }
    None
}

/// The world's servers (servers.py) in `ns`, once they serve.
pub fn serve_in(ns: &str, args: &[&str]) -> Child {
    use std::io::BufRead as _;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "python3"])
        .args(args)
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

/// A script of tests/egress_world, to its end.
pub fn sh(script: &str, args: &[&str]) {
    let out = Command::new("sh")
        .arg(format!("{WORLD}/{script}"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The world with the egress tests' servers (servers.py, a git repo).
pub fn world() -> World {
    let w = resolved_world();
    let dir = w.dir.path().to_owned();
    let (pki, repo) = (dir.join("pki"), dir.join("repo"));
    std::fs::create_dir_all(&repo).unwrap();
    sh("repo.sh", &[repo.to_str().unwrap()]);
    let servers = format!("{WORLD}/servers.py");
    let argv = [
        servers.as_str(),
        pki.to_str().unwrap(),
        repo.to_str().unwrap(),
    ];
    let mut w = w;
    w.children.push(serve_in(&w.net, &argv));
    w
}

/// The namespaces, the test CA (`dir/pki`) and dnsmasq answering, no
/// servers yet.
pub fn resolved_world() -> World {
    // Tests run in parallel in one process: a world of each its own.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let id = format!(
        "{}{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let mut w = World {
        gw: format!("egn-gw-{id}"),
        net: format!("egn-net-{id}"),
        children: Vec::new(),
        dir: tempfile::tempdir().unwrap(),
    };
    let (vg, vn) = (format!("ng{id}"), format!("nn{id}"));
    sh("netns.sh", &[w.gw.as_str(), w.net.as_str(), &vg, &vn]);
    let dir = w.dir.path().to_owned();
    let pki = dir.join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    sh("pki.sh", &[pki.to_str().unwrap()]);
    let dnsmasq = Command::new("ip")
        .args(["netns", "exec", &w.net, DNSMASQ, "--keep-in-foreground"])
        .arg(format!("--conf-file={WORLD}/dnsmasq.conf"))
        .args(["--user=root", "--listen-address=10.77.0.53,93.184.215.53"])
        .arg(format!("--pid-file={}", dir.join("dnsmasq.pid").display()))
        .arg(format!("--log-facility={}", dir.join("dns.log").display()))
        .arg("--log-queries")
        .stdout(Stdio::null())
        .spawn()
        .expect("dnsmasq");
    w.children.push(dnsmasq);
    let deadline = std::time::Instant::now() + common::event_timeout();
    loop {
        let o = w.host(&probe_argv(false, "dns,d,10.77.0.53,ready.test"));
        if o.out.contains("d=answer:") {
            break;
        }
        let exited = w.children[0].try_wait().unwrap();
        assert!(exited.is_none(), "dnsmasq exited: {}", w.queries());
        assert!(std::time::Instant::now() < deadline, "dnsmasq: {o:?}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    w
}

/// The probe with `steps` (whitespace-separated): its text given to
/// `python3 -c` in a tenant (which cannot read the checkout), its path on
/// the host.
pub fn probe_argv(inline: bool, steps: &str) -> Vec<String> {
    let mut argv = words("python3");
    if inline {
        argv.extend(["-c".to_owned(), PROBE.to_owned()]);
    } else {
        argv.push(PROBE_PATH.to_owned());
    }
    argv.extend(words(steps));
    argv
}

/// curl trusting `ca` only, bounded, with the status after the body.
pub fn curl_argv(ca: &Path, args: &[&str]) -> Vec<String> {
    let mut argv = words("curl -sS --connect-timeout 5 --max-time 10 -w");
    argv.push("\nstatus=%{http_code}\n".to_owned());
    argv.extend(["--cacert".to_owned(), ca.display().to_string()]);
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    argv
}

pub fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

pub fn split(s: &str) -> Vec<&str> {
    s.split_whitespace().collect()
}

/// Enter `ns` on this thread (the test's runtime is single-threaded, so
/// every socket the test opens is made here).
pub fn enter(ns: &str) {
    let f = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
    // SAFETY: setns on this thread with a descriptor we hold.
    #[allow(unsafe_code)]
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
}

/// A gateway in the world's gateway namespace (with its resolver), one
/// isolated tenant per `(name, toml)` rooted at `scratch/name` holding
/// the world's CA as `ca.pem`; audited to `audit.jsonl` in its dir.
pub fn launch(w: &World, scratch: &Path, tenants: &[(&str, &str)]) -> Gateway {
    enter(&w.gw);
    let bin = scratch.join("gateway-in-netns");
    std::fs::write(
        &bin,
        format!(
            "#!/bin/sh\nexec ip netns exec {} {} \"$@\"\n",
            w.gw,
            env!("CARGO_BIN_EXE_exec-gateway")
        ),
    )
    .unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut text = String::new();
    for (name, toml) in tenants {
        let root = scratch.join(name);
        std::fs::create_dir_all(&root).unwrap();
        std::fs::copy(w.ca(), root.join("ca.pem")).unwrap();
        text += &format!("[tenants.{name}]\nroot = \"{}\"\n{toml}\n", root.display());
    }
    Gateway::launch(&bin, None, &[], |dir| {
        format!(
            "[isolation]\nnetwork = \"required\"\n[audit]\nfile = \"{0}/audit.jsonl\"\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{0}/hs256.key\"\n{text}",
            dir.display()
        )
    })
}

/// A scratch directory others may pass (the tenants' roots are in it).
pub fn scratch() -> tempfile::TempDir {
    let s = common::scratch();
    std::fs::set_permissions(s.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    s
}

/// What a process printed and how it ended.
#[derive(Debug)]
pub struct Out {
    pub code: i64,
    pub out: String,
    pub err: String,
}

impl Out {
    /// The first word of the body: which server answered ("server-10").
    pub fn server(&self) -> &str {
        let body = self.out.lines().next().unwrap_or("");
        body.split_whitespace().next().unwrap_or("")
    }

    pub fn status(&self) -> &str {
        self.out
            .lines()
            .find_map(|l| l.strip_prefix("status="))
            .unwrap_or("")
    }

    /// A probe step's result.
    pub fn field(&self, label: &str) -> &str {
        self.out
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{label}=")))
            .unwrap_or_else(|| panic!("no {label} in {self:?}"))
    }
}

/// A session of a tenant, running processes in its root.
pub struct Tenant {
    pub c: Client,
    /// The token its session was opened with.
    pub token: String,
    pub root: PathBuf,
    pub n: u32,
}

impl Tenant {
    pub async fn of(gw: &Gateway, scratch: &Path, name: &str) -> Tenant {
        let token = gw.token(name);
        let mut c = Client::connect(&gw.url, &token).await;
        c.initialize().await;
        Tenant {
            c,
            token,
            root: scratch.join(name),
            n: 0,
        }
    }

    pub fn ca(&self) -> PathBuf {
        self.root.join("ca.pem")
    }

    pub async fn start(&mut self, argv: &[String]) -> String {
        self.n += 1;
        let id = format!("p{}", self.n);
        let (root, ca) = (&self.root, self.ca());
        self.c
            .call(
                "process/start",
                json!({"processId": id, "argv": argv, "cwd": root, "tty": false,
                       "env": {"PATH": "/usr/bin:/bin", "HOME": root, "SSL_CERT_FILE": ca,
                               "GIT_SSL_CAINFO": ca, "GIT_CONFIG_NOSYSTEM": "1"}}),
            )
            .await;
        id
    }

    pub async fn collect(&mut self, id: &str) -> Out {
        let o = self.c.collect(id).await;
        Out {
            code: o.exit_code.unwrap_or(-1),
            out: String::from_utf8_lossy(&o.stdout).into_owned(),
            err: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    pub async fn run(&mut self, argv: &[String]) -> Out {
        let id = self.start(argv).await;
        self.collect(&id).await
    }

    pub async fn curl(&mut self, args: &[&str]) -> Out {
        self.run(&curl_argv(&self.ca(), args)).await
    }

    pub async fn probe(&mut self, steps: &str) -> Out {
        self.run(&probe_argv(true, steps)).await
    }
}

/// A secret's file `scratch/secrets/name` holding `value` and a newline,
/// readable (the gateway hides it from tenants, not the mode).
pub fn secret_file(scratch: &Path, name: &str, value: &str) -> PathBuf {
    let dir = scratch.join("secrets");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, format!("{value}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path
}
