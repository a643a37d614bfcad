//! Port forwarding's tests (tests/forward.rs, tests/forward_grpc.rs): a
//! gateway whose tenants have network namespaces of their own.

use super::Gateway;

/// Tenants `a` and `b`, each with a network namespace of its own (the
/// default, `isolated`); none where this cannot run here (the reason
/// printed).
pub fn gateway() -> Option<Gateway> {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: forwarding needs network namespaces (root)");
        return None;
    }
    for (tool, package) in [("slirp4netns", "slirp4netns"), ("nft", "nftables")] {
        if !["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
            .iter()
            .any(|d| std::path::Path::new(d).join(tool).is_file())
        {
            eprintln!("skipped: `{tool}` is not installed (Debian package {package})");
            return None;
        }
    }
    Some(Gateway::start_with(|d| {
        for t in ["a", "b"] {
            std::fs::create_dir_all(d.join(t)).unwrap();
        }
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{d}/hs256.key\"\n\
             [tenants.a]\nroot = \"{d}/a\"\nmax_streams = 2\n\
             [tenants.b]\nroot = \"{d}/b\"\n",
            d = d.display(),
        )
    }))
}
