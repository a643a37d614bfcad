//! Codex 0.169.0 as a direct-transport (SigV4) executor: the pool's
//! config, the official binary (fetched by scripts/fetch-codex) started
//! against a gateway, and a wait for the pool to show it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::Gateway;

pub const WAIT: Duration = Duration::from_secs(30);
pub const KEY_ID: &str = "AKIDGATEWAYTEST1";
pub const SECRET: &str = "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY01";
/// A second key of the pool, bound to nothing.
pub const KEY2_ID: &str = "AKIDGATEWAYTEST2";
pub const SECRET2: &str = "second-secret-access-key-for-the-pool-02";

/// Tenant `t1` on pool `p`, whose access key `KEY_ID` (bound to
/// `bound`, if given) is in a file; revocations in `dir/revoked`.
pub fn config(dir: &Path, bound: Option<&str>, extra: &str) -> String {
    std::fs::write(dir.join("ak.secret"), SECRET).unwrap();
    std::fs::write(dir.join("ak2.secret"), SECRET2).unwrap();
    if !dir.join("revoked").exists() {
        std::fs::write(dir.join("revoked"), "# none yet\n").unwrap();
    }
    let bound = bound.map_or(String::new(), |b| format!("executor_id = \"{b}\"\n"));
    format!(
        "[server]\ndetach_ttl = \"2s\"\n\
         [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{d}/hs256.key\"\n\
         [tenants.t1]\nroot = \"/\"\npool = \"p\"\n\
         [executors]\nopen_timeout = \"3s\"\nrevocations_file = \"{d}/revoked\"\n{extra}\n\
         [executors.pools.p]\n\
         [[executors.pools.p.access_keys]]\nid = \"{KEY2_ID}\"\nsecret_file = \"{d}/ak2.secret\"\n\
         [[executors.pools.p.access_keys]]\nid = \"{KEY_ID}\"\nsecret_file = \"{d}/ak.secret\"\n{bound}",
        d = dir.display()
    )
}

/// The official 0.169.0 executor, or `None` (the reason printed).
pub fn codex_169() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/.tools/codex/0.169.0/codex");
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "skipped: official codex 0.169.0 absent at {} (run scripts/fetch-codex)",
            p.display()
        );
        None
    }
}

pub struct Codex {
    pub child: Child,
    pub dir: tempfile::TempDir,
}

impl Codex {
    /// `codex exec-server --remote ... --remote-transport direct` as
    /// environment `id`, in its own working directory.
    pub fn start(binary: &Path, gateway_addr: &str, id: &str) -> Codex {
        let dir = tempfile::Builder::new()
            .prefix("codex-direct-")
            .tempdir_in("/var/tmp")
            .unwrap();
        std::fs::create_dir_all(dir.path().join("work")).unwrap();
        let child = Command::new(binary)
            .args(["exec-server", "--remote", &format!("http://{gateway_addr}")])
            .args(["--remote-transport", "direct", "--environment-id", id])
            .args(["--aws-sigv4", "--aws-region", "us-east-1"])
            .current_dir(dir.path().join("work"))
            .env("CODEX_HOME", dir.path())
            .env("HOME", dir.path())
            .env("AWS_ACCESS_KEY_ID", KEY_ID)
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_PROFILE")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn codex");
        Codex { child, dir }
    }

    pub fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// Its exit, within [`WAIT`], and what it printed.
    pub fn exit(&mut self) -> (std::process::ExitStatus, String) {
        let deadline = std::time::Instant::now() + WAIT;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(std::time::Instant::now() < deadline, "codex kept running");
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            use std::io::Read as _;
            let _ = e.read_to_string(&mut err);
        }
        (status, err)
    }
}

impl Drop for Codex {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub async fn wait_readyz(gw: &Gateway, want: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (_, body) = gw.admin_get("/readyz").await;
        if body.contains(want) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never `{want}`: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
