//! `exec-gateway executor`: this host joins a tenant's pool on a remote
//! gateway, dialling out to its registry.

use std::process::ExitCode;

use super::{
    CommonArgs, Overrides, bind_optional, block_on, raise_nofile_limit, settings, start_reaper,
    usage_error,
};
use crate::config::ConfigError;
use crate::gateway::Gateway;
use crate::server;

#[derive(Debug, clap::Args)]
pub struct ExecutorArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The registry's base URL, e.g. https://gateway.example.com.
    #[arg(long)]
    pub remote: String,
    /// This executor's id in its pool (letters, digits, `_`, `-`).
    #[arg(long)]
    pub executor_id: String,
    /// A name shown by the registry. Default: the executor id.
    #[arg(long)]
    pub name: Option<String>,
    /// A label `KEY=VALUE` (repeatable); tenants may require labels.
    #[arg(long = "label")]
    pub labels: Vec<String>,
    /// Sessions served at once (each a link and a registration).
    #[arg(long, default_value_t = 8)]
    pub slots: usize,
    /// The tenant on this host sessions run as. Default: the only one.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Serve `/metrics` and the detailed `/readyz` on `HOST:PORT`
    /// (default: off).
    #[arg(long)]
    pub admin_listen: Option<String>,
    /// CA bundle (PEM) an `https://` registry's certificate must chain to.
    /// Default: the public web roots.
    #[arg(long)]
    pub ca: Option<std::path::PathBuf>,
}

/// The executor's bearer token, as Codex reads it.
const EXECUTOR_TOKEN_ENV: &str = "CODEX_EXEC_SERVER_REMOTE_BEARER_TOKEN";

pub(super) fn executor(args: &ExecutorArgs) -> ExitCode {
    let token = match std::env::var(EXECUTOR_TOKEN_ENV) {
        Ok(t) if !t.trim().is_empty() => t.trim().to_owned(),
        Ok(_) => {
            return usage_error(&ConfigError(format!(
                "executor registry bearer token environment variable `{EXECUTOR_TOKEN_ENV}` is empty"
            )));
        }
        Err(_) => {
            return usage_error(&ConfigError(format!(
                "executor registry bearer token environment variable `{EXECUTOR_TOKEN_ENV}` is not set"
            )));
        }
    };
    let executor_id = args.executor_id.trim().to_owned();
    if !crate::config::is_executor_id(&executor_id) {
        return usage_error(&ConfigError(format!(
            "--executor-id `{executor_id}`: 1 to {} letters, digits, `_` or `-`",
            crate::config::MAX_EXECUTOR_ID_BYTES
        )));
    }
    let remote = args.remote.trim().trim_end_matches('/').to_owned();
    if !(remote.starts_with("http://") || remote.starts_with("https://"))
        || url::Url::parse(&remote).is_err()
    {
        return usage_error(&ConfigError(format!(
            "--remote `{remote}`: expected an http:// or https:// URL"
        )));
    }
    let mut labels = std::collections::BTreeMap::new();
    for l in &args.labels {
        let Some((k, v)) = l.split_once('=') else {
            return usage_error(&ConfigError(format!("--label `{l}`: expected KEY=VALUE")));
        };
        labels.insert(k.to_owned(), v.to_owned());
    }
    if args.slots == 0 || args.slots > crate::transport::remote::dial::MAX_SLOTS {
        return usage_error(&ConfigError(format!(
            "--slots must be between 1 and {}",
            crate::transport::remote::dial::MAX_SLOTS
        )));
    }
    let settings = match settings(
        &args.common,
        Overrides {
            admin_listen: Some(args.admin_listen.as_deref().unwrap_or("off")),
            ..Overrides::default()
        },
    ) {
        Ok(s) => s,
        Err(e) => return usage_error(&e),
    };
    let tenant = match &args.tenant {
        Some(t) if settings.knows_tenant(t) => t.clone(),
        Some(t) => return usage_error(&ConfigError(format!("--tenant `{t}` is not configured"))),
        None if settings.tenants.len() == 1 => {
            settings.tenants.keys().next().cloned().unwrap_or_default()
        }
        None => {
            return usage_error(&ConfigError(
                "the configuration has several tenants: name one with --tenant".to_owned(),
            ));
        }
    };
    let options = crate::transport::remote::dial::ExecutorOptions {
        remote,
        name: args.name.clone().unwrap_or_else(|| executor_id.clone()),
        executor_id,
        labels,
        slots: args.slots,
        tenant,
        ca: args.ca.clone(),
    };
    let nofile = raise_nofile_limit();
    let mut settings = settings;
    if let Err(e) = settings.fit_fd_limit(nofile) {
        return usage_error(&e);
    }
    block_on(async move {
        let admin_addr = settings.admin_listen;
        let admin_tls = match server::ListenerTls::load(&settings) {
            Ok(t) => t.admin,
            Err(e) => {
                eprintln!("exec-gateway: {e}");
                return ExitCode::FAILURE;
            }
        };
        let gw = match Gateway::new(settings, start_reaper()) {
            Ok(g) => g,
            Err(e) => return usage_error(&e),
        };
        let admin = match bind_optional(admin_addr, "admin").await {
            Ok(l) => l,
            Err(code) => return code,
        };
        let stop = server::shutdown_signal();
        let scheme = if admin_tls.is_some() { "https" } else { "http" };
        if let Some(addr) = admin.as_ref().and_then(|l| l.local_addr().ok()) {
            println!("admin {scheme}://{addr}");
        }
        let admin = admin.map(|l| (l, admin_tls));
        match server::run_executor(gw, options, token, admin, stop).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("exec-gateway: {e}");
                ExitCode::FAILURE
            }
        }
    })
}
