//! A tenant's own network (docs/isolation.md, "Network"): one network
//! namespace per tenant, shared by all its workers and processes, with its
//! own loopback and a way out that cannot reach the gateway's host.
//!
//! The way out is pasta (Debian's `passt` package, Podman's user-mode
//! network): it owns a tap device in the tenant's namespace and turns
//! what the tenant sends into ordinary sockets of the gateway's own
//! namespace, so the host needs no forwarding, NAT rules or addresses per
//! tenant, and the host's resolver (even one on the host's loopback) is
//! reached through one mapped address. Port forwarding is off in both
//! directions (the tenant cannot reach the host's loopback through it, and
//! nothing of the tenant's is published on the host) and the gateway
//! address is not mapped to the host.
//!
//! What the tenant may reach is decided inside its namespace, by an
//! nftables ruleset loaded before pasta starts: the tenant's processes
//! hold no capability there (the namespace belongs to the host's user
//! namespace), so they cannot change it. Every address of the gateway's
//! host is dropped first (its listeners answer on them), then the
//! operator's allowlist is accepted, then (for `internet`) every
//! non-public range is dropped and the rest accepted.

#![allow(unsafe_code)]

use std::io::{self, Write as _};
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::IpNet;

use super::reaper::Reaper;
use crate::config::Egress;

/// Where a tenant's processes send DNS queries: pasta forwards UDP to port
/// 53 of this address to the host's first resolver. Link-local, so no
/// real destination is shadowed.
pub const DNS_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 0, 53);

/// How long pasta may take to set the namespace up.
const PASTA_READY: Duration = Duration::from_secs(10);

/// Destinations outside the public internet, refused under `internet`
/// unless allowlisted: "this network", private, shared (CGNAT), loopback,
/// link-local (cloud metadata at 169.254.169.254), IETF protocol
/// assignments, benchmarking, multicast and reserved; IPv6 unspecified,
/// loopback, IPv4-mapped, discard, unique-local (cloud metadata at
/// fd00:ec2::254), link-local, site-local and multicast.
pub const NON_PUBLIC: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/3",
    "::/127",
    "::ffff:0:0/96",
    "100::/64",
    "fc00::/7",
    "fe80::/10",
    "fec0::/10",
    "ff00::/8",
];

/// The programs the network layer runs.
#[derive(Debug, Clone)]
pub struct NetTools {
    pub pasta: PathBuf,
    pub nft: PathBuf,
}

impl NetTools {
    /// Find pasta and nft on `PATH` or in the system directories.
    pub fn find() -> Result<NetTools, String> {
        let find = |name: &str, package: &str| {
            let path = std::env::var_os("PATH").unwrap_or_default();
            std::env::split_paths(&path)
                .chain(["/usr/sbin", "/usr/bin", "/sbin", "/bin"].map(PathBuf::from))
                .map(|d| d.join(name))
                .find(|p| p.is_file())
                .ok_or_else(|| format!("`{name}` not found (Debian package {package})"))
        };
        Ok(NetTools {
            pasta: find("pasta", "passt")?,
            nft: find("nft", "nftables")?,
        })
    }
}

/// A tenant's network namespace and the pasta process that connects it.
/// Dropping it stops pasta; the namespace goes with its last process.
#[derive(Debug)]
pub struct TenantNet {
    netns: OwnedFd,
    pasta: Option<Child>,
    reaper: Option<Arc<Reaper>>,
    resolv_conf: PathBuf,
    egress: Egress,
}

impl TenantNet {
    /// Make the namespace, load its ruleset and (when anything may be
    /// reached) start pasta. `dir` holds the tenant's `resolv.conf` (a
    /// directory the tenant cannot see).
    pub fn create(
        tenant: &str,
        egress: &Egress,
        tools: &NetTools,
        dir: &Path,
        reaper: Option<Arc<Reaper>>,
    ) -> io::Result<TenantNet> {
        let netns = new_netns()?;
        let host = host_addresses()?;
        load_ruleset(&tools.nft, &netns, &ruleset(egress, &host))?;
        std::fs::create_dir_all(dir)?;
        let resolv_conf = dir.join(format!("{tenant}.resolv.conf"));
        write_resolv_conf(&resolv_conf)?;
        let mut net = TenantNet {
            netns,
            pasta: None,
            reaper,
            resolv_conf,
            egress: egress.clone(),
        };
        if egress.internet || !egress.allow.is_empty() {
            let pid_file = dir.join(format!("{tenant}.pasta.pid"));
            net.start_pasta(&tools.pasta, &pid_file)?;
        }
        Ok(net)
    }

    pub fn netns(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd as _;
        self.netns.as_fd()
    }

    /// The file bound over the tenant's `/etc/resolv.conf`.
    pub fn resolv_conf(&self) -> &Path {
        &self.resolv_conf
    }

    pub fn egress(&self) -> &Egress {
        &self.egress
    }

    fn start_pasta(&mut self, pasta: &Path, pid_file: &Path) -> io::Result<()> {
        let _ = std::fs::remove_file(pid_file);
        let ns = self.netns.as_raw_fd();
        let mut cmd = Command::new(pasta);
        cmd.args([
            // Stay root (its capabilities are dropped to what it needs,
            // under its own seccomp filter and an empty mount namespace):
            // nobody may not enter a namespace the host's root owns.
            "--runas",
            "0:0",
            "--config-net",
            "--quiet",
            "--foreground",
            "--tcp-ports",
            "none",
            "--udp-ports",
            "none",
            "--tcp-ns",
            "none",
            "--udp-ns",
            "none",
            "--no-map-gw",
            "--ipv4-only",
            "--dns-forward",
            &DNS_ADDR.to_string(),
            "--netns",
            "/proc/self/fd/3",
            "--pid",
        ])
        .arg(pid_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        // Its own group, registered with the reaper: it dies with the
        // gateway however the gateway dies.
        .process_group(0);
        // SAFETY: dup2/fcntl on a descriptor we hold, between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let r = if ns == 3 {
                    libc::fcntl(3, libc::F_SETFD, 0)
                } else {
                    libc::dup2(ns, 3)
                };
                if r < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn()?;
        if let Some(r) = &self.reaper {
            r.register(child.id() as i32);
        }
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = io::Read::read_to_string(&mut e, &mut err);
                }
                return Err(io::Error::other(format!(
                    "pasta exited ({status}) while setting up: {}",
                    err.trim()
                )));
            }
            if pid_file.exists() {
                break;
            }
            if started.elapsed() > PASTA_READY {
                let _ = child.kill();
                let _ = child.wait();
                return Err(io::Error::other("pasta did not finish setting up in 10 s"));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let _ = std::fs::remove_file(pid_file);
        // It prints nothing more under --quiet; stop holding the pipe.
        drop(child.stderr.take());
        self.pasta = Some(child);
        Ok(())
    }
}

impl Drop for TenantNet {
    fn drop(&mut self) {
        if let Some(mut child) = self.pasta.take() {
            let _ = child.kill();
            let _ = child.wait();
            if let Some(r) = &self.reaper {
                r.unregister(child.id() as i32);
            }
        }
    }
}

/// A new network namespace with loopback up, held by a descriptor. Made
/// on a thread of its own (a namespace switch is per thread), which ends
/// once it has the descriptor.
fn new_netns() -> io::Result<OwnedFd> {
    std::thread::spawn(|| {
        // SAFETY: unshare on this thread only; open of a fixed path; the
        // loopback ioctls on a stack `ifreq`.
        unsafe {
            if libc::unshare(libc::CLONE_NEWNET) < 0 {
                return Err(io::Error::last_os_error());
            }
            loopback_up()?;
            let fd = libc::open(
                c"/proc/thread-self/ns/net".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            );
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(OwnedFd::from_raw_fd(fd))
        }
    })
    .join()
    .map_err(|_| io::Error::other("the namespace thread panicked"))?
}

/// Bring `lo` up in a fresh network namespace (it starts down).
pub(super) unsafe fn loopback_up() -> io::Result<()> {
    // SAFETY: a socket and two ioctls on a stack `ifreq`.
    unsafe {
        let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if s < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        let mut r = libc::ioctl(s, libc::SIOCGIFFLAGS, &mut req);
        if r == 0 {
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            r = libc::ioctl(s, libc::SIOCSIFFLAGS, &req);
        }
        let err = io::Error::last_os_error();
        libc::close(s);
        if r < 0 { Err(err) } else { Ok(()) }
    }
}

/// Every address configured on the gateway's host (its namespace), so
/// none is reachable through the tenant's way out.
fn host_addresses() -> io::Result<Vec<IpAddr>> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(io::Error::from)?;
    let mut out: Vec<IpAddr> = addrs
        .filter_map(|a| a.address)
        .filter_map(|s| {
            s.as_sockaddr_in()
                .map(|v4| IpAddr::V4(v4.ip()))
                .or_else(|| s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
        })
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

/// What a refused destination gets: an ICMP "administratively
/// prohibited" answered inside the namespace, so `connect` fails at once
/// (EHOSTUNREACH, "No route to host") instead of timing out.
const REFUSE: &str = "reject with icmpx type admin-prohibited";

/// The tenant namespace's nftables ruleset.
pub fn ruleset(egress: &Egress, host: &[IpAddr]) -> String {
    let (host4, host6): (Vec<&IpAddr>, Vec<&IpAddr>) = host.iter().partition(|a| a.is_ipv4());
    let (allow4, allow6): (Vec<_>, Vec<_>) = egress
        .allow
        .iter()
        .map(|n| n.trunc())
        .partition(|n| matches!(n, IpNet::V4(_)));
    let (np4, np6): (Vec<&&str>, Vec<&&str>) = NON_PUBLIC.iter().partition(|n| !n.contains(':'));
    let set = |items: Vec<String>| format!("{{ {} }}", items.join(", "));
    let mut rules = vec![
        "flush ruleset".to_owned(),
        "table inet exec_gateway {".to_owned(),
        "  chain output {".to_owned(),
        "    type filter hook output priority 0; policy drop;".to_owned(),
        "    oifname \"lo\" accept".to_owned(),
        format!("    ip daddr {DNS_ADDR} udp dport 53 accept"),
    ];
    if !host4.is_empty() {
        rules.push(format!(
            "    ip daddr {} {REFUSE}",
            set(host4.iter().map(|a| a.to_string()).collect())
        ));
    }
    if !host6.is_empty() {
        rules.push(format!(
            "    ip6 daddr {} {REFUSE}",
            set(host6.iter().map(|a| a.to_string()).collect())
        ));
    }
    if !allow4.is_empty() {
        rules.push(format!(
            "    ip daddr {} accept",
            set(allow4.iter().map(|a| a.to_string()).collect())
        ));
    }
    if !allow6.is_empty() {
        rules.push(format!(
            "    ip6 daddr {} accept",
            set(allow6.iter().map(|a| a.to_string()).collect())
        ));
    }
    if egress.internet {
        rules.push(format!(
            "    ip daddr {} {REFUSE}",
            set(np4.iter().map(|s| s.to_string()).collect())
        ));
        rules.push(format!(
            "    ip6 daddr {} {REFUSE}",
            set(np6.iter().map(|s| s.to_string()).collect())
        ));
        rules.push("    accept".to_owned());
    } else {
        rules.push(format!("    {REFUSE}"));
    }
    rules.push("  }".to_owned());
    rules.push("}".to_owned());
    rules.join("\n") + "\n"
}

/// Load `rules` into the namespace with `nft -f -`, run inside it.
fn load_ruleset(nft: &Path, netns: &OwnedFd, rules: &str) -> io::Result<()> {
    let ns = netns.as_raw_fd();
    let mut cmd = Command::new(nft);
    cmd.args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: setns on a descriptor we hold, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(ns, libc::CLONE_NEWNET) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(rules.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "nft refused the tenant's ruleset ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The tenant's `resolv.conf`: the mapped resolver, with the host's search
/// domains and options (cluster DNS relies on `ndots` and its search list).
fn write_resolv_conf(path: &Path) -> io::Result<()> {
    let host = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let mut out =
        format!("# exec-gateway: the host's resolver, through pasta\nnameserver {DNS_ADDR}\n");
    for line in host.lines() {
        let l = line.trim_start();
        if l.starts_with("search ") || l.starts_with("domain ") || l.starts_with("options ") {
            out.push_str(l);
            out.push('\n');
        }
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, out)?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp, path)
}

/// The network layer's probe: the tools exist, a namespace can be made
/// and nft can load a ruleset in it.
pub fn probe(dir: &Path) -> Result<NetTools, String> {
    let tools = NetTools::find()?;
    ensure_tun().map_err(|e| format!("/dev/net/tun is missing and cannot be made: {e}"))?;
    let egress = Egress {
        internet: true,
        allow: Vec::new(),
    };
    TenantNet::create("probe", &egress, &tools, dir, None)
        .map_err(|e| format!("a tenant network could not be set up: {e}"))?;
    Ok(tools)
}

/// pasta needs `/dev/net/tun`; a container runtime allows the device but
/// may not create the node (Kubernetes pods): make it.
fn ensure_tun() -> io::Result<()> {
    let tun = Path::new("/dev/net/tun");
    if tun.exists() {
        return Ok(());
    }
    std::fs::create_dir_all("/dev/net")?;
    nix::sys::stat::mknod(
        tun,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(10, 200),
    )
    .map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_is_dropped_before_the_allowlist_and_the_allowlist_before_private_ranges() {
        let e = Egress {
            internet: true,
            allow: vec!["10.1.2.0/24".parse().unwrap()],
        };
        let r = ruleset(&e, &["10.1.2.3".parse().unwrap()]);
        let host = r.find("ip daddr { 10.1.2.3 } reject").expect("host rule");
        let allow = r
            .find("ip daddr { 10.1.2.0/24 } accept")
            .expect("allow rule");
        let private = r.find("10.0.0.0/8").expect("private rule");
        assert!(host < allow && allow < private, "{r}");
        assert!(r.contains("policy drop"));
        assert!(r.trim_end().ends_with("accept\n  }\n}"), "{r}");
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
}
