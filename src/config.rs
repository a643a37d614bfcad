//! Configuration: raw TOML (`Config`, unknown keys rejected) validated into
//! `Settings` (durations parsed, paths checked). Every field documents its
//! default; the defaults are the embedded configuration.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// A configuration problem: printed as one line, exit code 64.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Raw configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub exec: ExecConfig,
}

/// `[server]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Websocket listener, `ws://IP:PORT`. Default: `ws://127.0.0.1:8765`.
    pub listen: Option<String>,
    /// How long a disconnected session waits for a resume. Default: `10s`.
    pub detach_ttl: Option<String>,
    /// Open connections (websocket + HTTP). Default: 16384.
    pub max_connections: Option<usize>,
    /// Sessions in the registry, attached or detached. Default: 16384.
    pub max_sessions: Option<usize>,
    /// Concurrent requests per connection. Default: 64.
    pub max_in_flight_per_connection: Option<usize>,
    /// Concurrent requests in the gateway before shedding. Default: 4096.
    pub max_in_flight: Option<usize>,
    /// Deadline of one request (a read gets its `waitMs` on top). Default: `60s`.
    pub request_timeout: Option<String>,
    /// Largest inbound message (websocket message or stdio line). Default: 16 MiB.
    pub max_message_bytes: Option<usize>,
    /// A client whose writes stall this long is disconnected. Default: `30s`.
    pub slow_client_timeout: Option<String>,
    /// On SIGTERM, how long running processes may finish before being killed. Default: `5s`.
    pub shutdown_grace: Option<String>,
}

/// `[exec]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecConfig {
    /// Confine fs paths and process cwds under this directory. Default: none
    /// (the whole host, as the reference).
    pub root: Option<PathBuf>,
    /// Running processes in the gateway. Default: 1024.
    pub max_processes: Option<usize>,
    /// Base environment for `envPolicy`. Default: PATH, HOME, LANG, SHELL, TMPDIR.
    pub base_env: Option<HashMap<String, String>>,
    /// How long a closed process stays readable (and its id taken). Default: `30s`.
    pub exited_retention: Option<String>,
}

/// Validated settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: SocketAddr,
    pub detach_ttl: Duration,
    pub max_connections: usize,
    pub max_sessions: usize,
    pub max_in_flight_per_connection: usize,
    pub max_in_flight: usize,
    pub request_timeout: Duration,
    pub max_message_bytes: usize,
    pub slow_client_timeout: Duration,
    pub shutdown_grace: Duration,
    pub root: Option<PathBuf>,
    pub max_processes: usize,
    pub base_env: HashMap<String, String>,
    pub exited_retention: Duration,
}

pub const DEFAULT_LISTEN: &str = "ws://127.0.0.1:8765";

/// Parse `ws://IP:PORT` with the reference's error texts.
pub fn parse_listen(url: &str) -> Result<SocketAddr, ConfigError> {
    let Some(rest) = url.strip_prefix("ws://") else {
        return Err(ConfigError(format!(
            "unsupported --listen URL `{url}`; expected `ws://IP:PORT` or `stdio`"
        )));
    };
    rest.trim_end_matches('/').parse().map_err(|_| {
        ConfigError(format!(
            "invalid websocket --listen URL `{url}`; expected `ws://IP:PORT`"
        ))
    })
}

fn duration(name: &str, value: Option<&str>, default: Duration) -> Result<Duration, ConfigError> {
    match value {
        None => Ok(default),
        Some(v) => humantime::parse_duration(v)
            .map_err(|e| ConfigError(format!("{name}: invalid duration `{v}`: {e}"))),
    }
}

fn positive(name: &str, value: Option<usize>, default: usize) -> Result<usize, ConfigError> {
    match value.unwrap_or(default) {
        0 => Err(ConfigError(format!("{name} must be at least 1"))),
        n => Ok(n),
    }
}

fn default_base_env(home: &Path) -> HashMap<String, String> {
    [
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        ("LANG", "C.UTF-8"),
        ("SHELL", "/bin/sh"),
        ("TMPDIR", "/tmp"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .chain([("HOME".to_owned(), home.display().to_string())])
    .collect()
}

impl Config {
    /// Read and parse a TOML file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("cannot read config {}: {e}", path.display())))?;
        toml::from_str(&text).map_err(|e| {
            ConfigError(format!(
                "invalid config {}: {}",
                path.display(),
                e.to_string().replace('\n', " ").trim()
            ))
        })
    }

    /// Validate into settings.
    pub fn validate(self) -> Result<Settings, ConfigError> {
        let s = self.server;
        let listen = parse_listen(s.listen.as_deref().unwrap_or(DEFAULT_LISTEN))?;
        let root = match self.exec.root {
            None => None,
            Some(r) => {
                if !r.is_absolute() {
                    return Err(ConfigError(format!(
                        "exec.root must be absolute: {}",
                        r.display()
                    )));
                }
                if !r.is_dir() {
                    return Err(ConfigError(format!(
                        "exec.root is not a directory: {}",
                        r.display()
                    )));
                }
                Some(crate::fs::normalize(&r))
            }
        };
        let home = root.clone().unwrap_or_else(|| PathBuf::from("/tmp"));
        Ok(Settings {
            listen,
            detach_ttl: duration(
                "server.detach_ttl",
                s.detach_ttl.as_deref(),
                Duration::from_secs(10),
            )?,
            max_connections: positive("server.max_connections", s.max_connections, 16384)?,
            max_sessions: positive("server.max_sessions", s.max_sessions, 16384)?,
            max_in_flight_per_connection: positive(
                "server.max_in_flight_per_connection",
                s.max_in_flight_per_connection,
                64,
            )?,
            max_in_flight: positive("server.max_in_flight", s.max_in_flight, 4096)?,
            request_timeout: duration(
                "server.request_timeout",
                s.request_timeout.as_deref(),
                Duration::from_secs(60),
            )?,
            max_message_bytes: positive(
                "server.max_message_bytes",
                s.max_message_bytes,
                16 * 1024 * 1024,
            )?,
            slow_client_timeout: duration(
                "server.slow_client_timeout",
                s.slow_client_timeout.as_deref(),
                Duration::from_secs(30),
            )?,
            shutdown_grace: duration(
                "server.shutdown_grace",
                s.shutdown_grace.as_deref(),
                Duration::from_secs(5),
            )?,
            root,
            max_processes: positive("exec.max_processes", self.exec.max_processes, 1024)?,
            exited_retention: duration(
                "exec.exited_retention",
                self.exec.exited_retention.as_deref(),
                crate::exec::EXITED_PROCESS_RETENTION,
            )?,
            base_env: self
                .exec
                .base_env
                .unwrap_or_else(|| default_base_env(&home)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_urls() {
        assert_eq!(
            parse_listen("ws://127.0.0.1:0").unwrap().to_string(),
            "127.0.0.1:0"
        );
        assert!(parse_listen("ws://[::1]:0").is_ok());
        assert_eq!(
            parse_listen("http://x").unwrap_err().0,
            "unsupported --listen URL `http://x`; expected `ws://IP:PORT` or `stdio`"
        );
        assert_eq!(
            parse_listen("ws://nohost").unwrap_err().0,
            "invalid websocket --listen URL `ws://nohost`; expected `ws://IP:PORT`"
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        assert!(toml::from_str::<Config>("[server]\nlisen = \"x\"").is_err());
        let c: Config = toml::from_str("[server]\ndetach_ttl = \"soon\"").unwrap();
        assert!(c.validate().unwrap_err().0.contains("server.detach_ttl"));
        let c: Config = toml::from_str("[server]\nmax_in_flight = 0").unwrap();
        assert!(c.validate().is_err());
    }

    #[test]
    fn defaults() {
        let s = Config::default().validate().unwrap();
        assert_eq!(s.detach_ttl, Duration::from_secs(10));
        assert_eq!(s.listen.to_string(), "127.0.0.1:8765");
        assert!(s.base_env.contains_key("PATH"));
    }
}
