//! A tenant's own network (docs/isolation.md, "Network"): one network
//! namespace per tenant, shared by all its workers and processes, with its
//! own loopback and a way out that cannot reach the gateway's host.
//!
//! The way out is slirp4netns (Debian's package; rootless Podman's,
//! Docker's and BuildKit's user-mode network): it owns a tap device in
//! the tenant's namespace and turns what the tenant sends into ordinary
//! sockets of the gateway's own namespace, so the host needs no
//! forwarding, NAT rules or addresses per tenant, and the host's resolver
//! is reached through slirp's DNS address. Connections to the host's
//! loopback through its gateway address are refused
//! (`--disable-host-loopback`), nothing is published on the host, and it
//! runs sandboxed (its own mount namespace, capabilities dropped,
//! seccomp) with a descriptor limit, and exits when the gateway does (its
//! exit pipe closes).
//!
//! What the tenant may reach is decided inside its namespace, by an
//! nftables ruleset loaded before slirp4netns starts: the tenant's
//! processes hold no capability there (the namespace belongs to the
//! host's user namespace), so they cannot change it. Every address of the
//! gateway's host is refused first (its listeners answer on them; the set
//! is refreshed when the host's addresses change), then the operator's
//! allowlist is accepted, then (for `internet`) every non-public range is
//! refused and the rest accepted.

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

use super::cgroup::ProcessCgroup;
use super::reaper::Reaper;
use crate::config::Egress;

mod rules;
pub use rules::ruleset;

/// Where a tenant's processes send DNS queries: slirp4netns forwards
/// them (UDP and TCP port 53) to the host's resolver.
pub const DNS_ADDR: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 3);
/// Where, on the namespace's loopback, a tenant with `egress_names` has its
/// connections out redirected: the gateway's egress proxy
/// (the top-level `egress` module). Below 1024, which no tenant process may bind (they
/// hold no capability in the namespace).
pub const PROXY_PORT: u16 = 1019;
/// Where its DNS queries are redirected: the gateway's resolver, which
/// answers only names the tenant may reach.
pub const RESOLVER_PORT: u16 = 53;
/// The mark (`SO_MARK`, which needs `CAP_NET_ADMIN` in the namespace: no
/// tenant process can set it) on the gateway's own sockets in a tenant's
/// namespace: the proxy's connections out and the resolver's queries.
/// They are not redirected, and only they leave by name.
pub const GATEWAY_MARK: u32 = 0x6567_7721;
/// The mark on the gateway's resolver's queries to slirp4netns's DNS
/// address: the only marked traffic that may go there (a connection the
/// proxy makes for a client, however asked, may not).
pub const RESOLVER_MARK: u32 = 0x6567_7722;
/// slirp4netns's gateway address (the host's loopback when not disabled).
const SLIRP_GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);

/// How long slirp4netns may take to set the namespace up.
const SLIRP_READY: Duration = Duration::from_secs(10);
/// Descriptors (sockets) slirp4netns may hold for one tenant: one tenant
/// cannot take the host's ephemeral ports.
pub const EGRESS_MAX_SOCKETS: u64 = 4096;
/// slirp4netns's MTU (its largest: fewer, larger segments).
const SLIRP_MTU: &str = "65520";

/// Destinations outside the public internet, refused under `internet`
/// unless allowlisted: "this network", private, shared (CGNAT), loopback,
/// link-local (cloud metadata at 169.254.169.254), IETF protocol
/// assignments, documentation, benchmarking, multicast and reserved,
/// Azure's host service (168.63.129.16, WireServer);
/// IPv6 unspecified,
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
    "192.0.2.0/24",
    "168.63.129.16/32",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
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
    pub slirp: PathBuf,
    pub nft: PathBuf,
}

impl NetTools {
    /// Find slirp4netns and nft on `PATH` or in the system directories.
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
            slirp: find("slirp4netns", "slirp4netns")?,
            nft: find("nft", "nftables")?,
        })
    }
}

/// A tenant's network namespace and the slirp4netns process that
/// connects it. Dropping it stops slirp4netns; the namespace goes with its
/// last process.
#[derive(Debug)]
pub struct TenantNet {
    nft: PathBuf,
    netns: OwnedFd,
    slirp: parking_lot::Mutex<Option<Child>>,
    /// The write end of slirp4netns's exit pipe: it exits when this closes
    /// (the gateway gone, however).
    exit_pipe: parking_lot::Mutex<Option<OwnedFd>>,
    reaper: Option<Arc<Reaper>>,
    resolv_conf: PathBuf,
    /// The CA bundle bound over the tenant's system bundle when its
    /// egress intercepts (module `egress::substitute`); set before any of
    /// its processes starts.
    ca_bundle: std::sync::OnceLock<PathBuf>,
    /// Its rules' egress (a reload may change it in place).
    egress: parking_lot::Mutex<Egress>,
    /// The tenant's cgroup slirp4netns runs in, once it was moved there.
    cgroup: parking_lot::Mutex<Option<ProcessCgroup>>,
}

impl TenantNet {
    /// Make the namespace, load its ruleset and (when anything may be
    /// reached) start slirp4netns. `dir` holds the tenant's `resolv.conf` (a
    /// directory the tenant cannot see).
    pub fn create(
        tenant: &str,
        egress: &Egress,
        tools: &NetTools,
        dir: &Path,
        reaper: Option<Arc<Reaper>>,
    ) -> io::Result<Arc<TenantNet>> {
        let net = Self::unconfigured(tenant, egress, tools, dir, reaper)?;
        net.configure(tools)?;
        Ok(net)
    }

    /// The namespace alone: no ruleset, no way out yet. Nothing of the
    /// tenant's may run in it before [`TenantNet::configure`] returned
    /// (the gateway's own worker may start in it meanwhile: it sends
    /// nothing until a tenant process exists).
    pub fn unconfigured(
        tenant: &str,
        egress: &Egress,
        tools: &NetTools,
        dir: &Path,
        reaper: Option<Arc<Reaper>>,
    ) -> io::Result<Arc<TenantNet>> {
        let netns = new_netns()?;
        std::fs::create_dir_all(dir)?;
        let resolv_conf = dir.join(format!("{tenant}.resolv.conf"));
        write_resolv_conf(&resolv_conf)?;
        Ok(Arc::new(TenantNet {
            nft: tools.nft.clone(),
            netns,
            slirp: parking_lot::Mutex::new(None),
            exit_pipe: parking_lot::Mutex::new(None),
            reaper,
            resolv_conf,
            ca_bundle: std::sync::OnceLock::new(),
            egress: parking_lot::Mutex::new(egress.clone()),
            cgroup: parking_lot::Mutex::new(None),
        }))
    }

    /// Load the namespace's ruleset and (when anything may be reached)
    /// start slirp4netns.
    pub fn configure(self: &Arc<Self>, tools: &NetTools) -> io::Result<()> {
        let host = host_addresses()?;
        let egress = self.egress.lock().clone();
        load_ruleset(&tools.nft, &self.netns, &ruleset(&egress, &host))?;
        if egress.reaches() {
            self.start_slirp(&tools.slirp)?;
        }
        watch_host_addresses(self, host);
        Ok(())
    }

    pub fn netns(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd as _;
        self.netns.as_fd()
    }

    /// The file bound over the tenant's `/etc/resolv.conf`.
    pub fn resolv_conf(&self) -> &Path {
        &self.resolv_conf
    }

    /// Make the tenant's processes trust `ca_pem` beside the host's public
    /// roots: a bundle of both, written next to its `resolv.conf`, is bound
    /// over [`TENANT_CA_BUNDLE`] in their view. Once, before any process.
    pub fn trust(&self, ca_pem: &str) -> io::Result<()> {
        let host = std::fs::read_to_string(TENANT_CA_BUNDLE).unwrap_or_default();
        let path = self.resolv_conf.with_extension("ca-bundle.pem");
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        std::fs::write(&tmp, format!("{host}\n{ca_pem}"))?;
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
        std::fs::rename(&tmp, &path)?;
        self.ca_bundle
            .set(path)
            .map_err(|_| io::Error::other("the tenant's CA bundle was set already"))
    }

    /// The bundle of [`TenantNet::trust`], if any.
    pub fn ca_bundle(&self) -> Option<&Path> {
        self.ca_bundle.get().map(PathBuf::as_path)
    }

    /// Start slirp4netns on the namespace. What it prints is dropped: a
    /// tenant's packets can make libslirp warn, and neither a file (no
    /// bound) nor a pipe (SIGPIPE once unread, a stall once full) may take
    /// that.
    fn start_slirp(&self, slirp: &Path) -> io::Result<()> {
        let (ready_r, ready_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let (exit_r, exit_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let fds = [
            self.netns.as_raw_fd(),
            ready_w.as_raw_fd(),
            exit_r.as_raw_fd(),
        ];
        let mut cmd = Command::new(slirp);
        cmd.args([
            "--configure",
            "--mtu",
            SLIRP_MTU,
            "--disable-host-loopback",
            "--enable-sandbox",
            "--enable-seccomp",
            "--ready-fd=4",
            "--exit-fd=5",
            "--netns-type=path",
            "/proc/self/fd/3",
            "tap0",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Its own group, registered with the reaper too.
        .process_group(0);
        // SAFETY: descriptor juggling, setrlimit, unshare and mount between
        // fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                // A mount namespace whose every mount is private: its
                // sandbox makes only `/` private before it lazily unmounts
                // the old root, and that unmount propagated through the
                // host's shared mounts (`ip netns add` makes /run/netns
                // one), taking the host's named network namespaces with it.
                if libc::unshare(libc::CLONE_NEWNS) < 0
                    || libc::mount(
                        std::ptr::null(),
                        c"/".as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ) < 0
                {
                    return Err(io::Error::last_os_error());
                }
                // Out of the way first, then to 3, 4, 5 (dup2 clears
                // close-on-exec on the copies).
                let mut high = [0; 3];
                for (h, fd) in high.iter_mut().zip(fds) {
                    *h = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 100);
                    if *h < 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                for (target, h) in (3..).zip(high) {
                    if libc::dup2(h, target) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                // Lowered, never raised: the gateway holds no
                // CAP_SYS_RESOURCE, and a hard limit below the cap stays.
                let mut lim = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) < 0 {
                    return Err(io::Error::last_os_error());
                }
                let cap = EGRESS_MAX_SOCKETS.min(lim.rlim_max);
                let lim = libc::rlimit {
                    rlim_cur: cap,
                    rlim_max: cap,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn()?;
        drop(ready_w);
        drop(exit_r);
        if let Some(r) = &self.reaper {
            r.register(child.id() as i32);
        }
        // Ready when it writes to the ready pipe; an EOF without it means
        // it exited.
        let mut ready = std::fs::File::from(ready_r);
        let started = Instant::now();
        let mut byte = [0u8; 1];
        let outcome = loop {
            use std::os::fd::AsFd as _;
            let mut pfd = [nix::poll::PollFd::new(
                ready.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            let left = SLIRP_READY.saturating_sub(started.elapsed());
            let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
            match nix::poll::poll(&mut pfd, ms) {
                Ok(0) => {
                    break Err(io::Error::other(
                        "slirp4netns did not finish setting up in 10 s",
                    ));
                }
                Ok(_) => match io::Read::read(&mut ready, &mut byte) {
                    Ok(1) => break Ok(()),
                    _ => break Err(io::Error::other("slirp4netns exited while setting up")),
                },
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => break Err(io::Error::from(e)),
            }
        };
        if let Err(e) = outcome {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::other(format!(
                "{e} (run `{} --configure --netns-type=path /run/netns/NAME tap0` by hand to see why)",
                slirp.display()
            )));
        }
        *self.slirp.lock() = Some(child);
        *self.exit_pipe.lock() = Some(exit_w);
        Ok(())
    }

    /// Move slirp4netns into `cg`, one of the tenant's own cgroups: its
    /// memory (and the buffers of the sockets it opens from then on: on
    /// v2 always, on v1 under the tenant's `memory.kmem.tcp` limit), CPU
    /// and pid are the tenant's, not the gateway's. Nothing to move where
    /// it does not run (`egress = "none"`).
    pub fn charge_to(&self, cg: ProcessCgroup) -> io::Result<()> {
        let Some(pid) = self.slirp.lock().as_ref().map(Child::id) else {
            return Ok(());
        };
        for procs in cg.procs_paths() {
            std::fs::write(&procs, pid.to_string()).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("moving slirp4netns into {}: {e}", procs.display()),
                )
            })?;
        }
        *self.cgroup.lock() = Some(cg);
        Ok(())
    }

    /// Load the ruleset again with the host's current addresses.
    fn refresh(&self, host: &[IpNet]) -> io::Result<()> {
        let egress = self.egress.lock();
        load_ruleset(&self.nft, &self.netns, &ruleset(&egress, host))
    }

    /// Take `egress` in place (a reload): the namespace's ruleset is
    /// replaced at once (`nft -f` is atomic), so the tenant's live
    /// processes meet it with their next packet, established connections
    /// included. Returns `false`, changing nothing, where it would need a
    /// way out this namespace was made without (slirp4netns starts with
    /// the namespace or not at all): then a new activation takes it.
    pub fn set_egress(&self, egress: &Egress) -> io::Result<bool> {
        let reaches = egress.reaches();
        if reaches && self.slirp.lock().is_none() {
            return Ok(false);
        }
        let host = host_addresses()?;
        let mut now = self.egress.lock();
        load_ruleset(&self.nft, &self.netns, &ruleset(egress, &host))?;
        *now = egress.clone();
        Ok(true)
    }
}

impl Drop for TenantNet {
    fn drop(&mut self) {
        *self.exit_pipe.get_mut() = None;
        if let Some(mut child) = self.slirp.get_mut().take() {
            let _ = child.kill();
            let _ = child.wait();
            if let Some(r) = &self.reaper {
                r.unregister(child.id() as i32);
            }
        }
        // Emptied (and pooled) once slirp4netns is gone.
        drop(self.cgroup.get_mut().take());
        let _ = std::fs::remove_file(&self.resolv_conf);
        if let Some(b) = self.ca_bundle.get() {
            let _ = std::fs::remove_file(b);
        }
    }
}

/// Where Debian, Ubuntu, Alpine and the images built on them keep the
/// system's CA bundle (what OpenSSL, curl, git and Python's `ssl` read):
/// a tenant that intercepts has its own bundle bound there.
pub const TENANT_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// How often the host's addresses are read again: an address added to
/// the host (DHCP, a secondary IP, a VIP) is refused to tenants within
/// this.
pub const HOST_ADDRESS_POLL: Duration = Duration::from_secs(1);

/// The live tenant networks, and the host addresses their rulesets hold.
struct Watched {
    nets: Vec<std::sync::Weak<TenantNet>>,
    host: Vec<IpNet>,
}

static WATCHED: parking_lot::Mutex<Option<Watched>> = parking_lot::Mutex::new(None);

/// Keep `net`'s ruleset in step with the host's addresses: one thread for
/// every tenant network, started with the first.
fn watch_host_addresses(net: &Arc<TenantNet>, host: Vec<IpNet>) {
    let mut w = WATCHED.lock();
    match w.as_mut() {
        Some(w) => {
            w.nets.retain(|n| n.strong_count() > 0);
            w.nets.push(Arc::downgrade(net));
        }
        None => {
            *w = Some(Watched {
                nets: vec![Arc::downgrade(net)],
                host,
            });
            let spawned = std::thread::Builder::new()
                .name("egress-watch".to_owned())
                .spawn(|| {
                    loop {
                        std::thread::sleep(HOST_ADDRESS_POLL);
                        refresh_all();
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot watch the host's addresses; tenants' rulesets keep those of their start");
            }
        }
    }
}

/// Reload every live tenant's ruleset if the host's addresses changed.
fn refresh_all() {
    let Ok(now) = host_addresses() else { return };
    let nets: Vec<Arc<TenantNet>> = {
        let mut w = WATCHED.lock();
        let Some(w) = w.as_mut() else { return };
        w.nets.retain(|n| n.strong_count() > 0);
        if w.host == now {
            return;
        }
        w.host = now.clone();
        w.nets.iter().filter_map(std::sync::Weak::upgrade).collect()
    };
    tracing::info!(addresses = ?now, tenants = nets.len(), "the host's addresses changed; reloading the tenants' egress rules");
    for n in nets {
        if let Err(e) = n.refresh(&now) {
            tracing::error!(error = %e, "a tenant's egress rules could not be reloaded");
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
            bound_socket_buffers()?;
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

/// The largest send and receive buffer a TCP socket in a tenant's
/// namespace grows to on its own (`net.ipv4.tcp_wmem`/`tcp_rmem`, per
/// namespace; the host's default is 4 MiB and 6 MiB). Its peer is
/// slirp4netns on the tap device, a hop away, so this costs the tenant's
/// throughput nothing, and one connection whose peer never reads holds
/// at most this (or twice the host's `net.core.wmem_max`, what
/// `SO_SNDBUF` may ask) in its send queue.
pub const EGRESS_SOCKET_BUFFER_BYTES: u32 = 256 << 10;

/// Bound the socket buffers of the namespace this thread is in.
fn bound_socket_buffers() -> io::Result<()> {
    for (file, initial) in [("tcp_wmem", 16 << 10), ("tcp_rmem", 128 << 10)] {
        std::fs::write(
            format!("/proc/sys/net/ipv4/{file}"),
            format!("4096 {initial} {EGRESS_SOCKET_BUFFER_BYTES}"),
        )
        .map_err(|e| io::Error::new(e.kind(), format!("net.ipv4.{file}: {e}")))?;
    }
    Ok(())
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
fn host_addresses() -> io::Result<Vec<IpNet>> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(io::Error::from)?;
    let mut out: Vec<IpNet> = addrs
        .filter_map(|a| a.address)
        .filter_map(|s| {
            s.as_sockaddr_in()
                .map(|v4| IpAddr::V4(v4.ip()))
                .or_else(|| s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
        })
        .map(IpNet::from)
        .collect();
    // Addresses the host owns through local routes (`ip route add local
    // ...`: anycast, VIPs), not on any interface.
    out.extend(local_routes(
        &std::fs::read_to_string("/proc/net/fib_trie").unwrap_or_default(),
    ));
    Ok(IpNet::aggregate(&out))
}

/// The IPv4 prefixes `/proc/net/fib_trie` marks `LOCAL` (an address line
/// `|-- A.B.C.D`, then `/N host LOCAL` lines for it).
fn local_routes(trie: &str) -> Vec<IpNet> {
    let mut out = Vec::new();
    let mut last: Option<Ipv4Addr> = None;
    for line in trie.lines().map(str::trim_start) {
        if let Some(a) = line.strip_prefix("|-- ") {
            last = a.trim().parse().ok();
            continue;
        }
        let (Some(addr), Some(rest)) = (last, line.strip_prefix('/')) else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let len = parts.next().and_then(|n| n.parse::<u8>().ok());
        if let (Some(len), Some("LOCAL")) = (len, parts.nth(1))
            && let Ok(net) = ipnet::Ipv4Net::new(addr, len)
        {
            out.push(IpNet::V4(net.trunc()));
        }
    }
    out
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
    let mut out = format!(
        "# exec-gateway: the host's resolver, through slirp4netns\nnameserver {DNS_ADDR}\n"
    );
    for line in host.lines() {
        let l = line.trim_start();
        if l.starts_with("search ") || l.starts_with("domain ") || l.starts_with("options ") {
            out.push_str(l);
            out.push('\n');
        }
    }
    // Unchanged: left as it is (another gateway sharing the state
    // directory may have bound it already).
    if std::fs::read_to_string(path).is_ok_and(|old| old == out) {
        return Ok(());
    }
    // A name of this process's own, then an atomic rename.
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
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
        ..Egress::default()
    };
    TenantNet::create("probe", &egress, &tools, dir, None)
        .map_err(|e| format!("a tenant network could not be set up: {e}"))?;
    Ok(tools)
}

/// slirp4netns needs `/dev/net/tun`; a container runtime allows the device but
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
    fn local_routes_are_read_from_the_fib_trie() {
        let trie = "Local:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 93.184.217.0\n        /24 host LOCAL\n     \
                    |-- 127.255.255.255\n           /32 link BROADCAST\n     |-- 10.0.0.5\n        /32 host LOCAL\n";
        let got: Vec<String> = local_routes(trie).iter().map(ToString::to_string).collect();
        assert_eq!(got, ["93.184.217.0/24", "10.0.0.5/32"]);
    }
}
