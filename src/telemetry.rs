//! Logging setup: `tracing` to stderr (stdout is the protocol or the bound
//! URL), filtered by `RUST_LOG` with a crate default, text or JSON.

use tracing_subscriber::EnvFilter;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Install the global subscriber (once per process).
/// Logging for the client commands: warnings only, unless `RUST_LOG`
/// says otherwise; stderr is the command's too.
pub fn init_client() {
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    // Their traces print the handshake's headers, the token among them.
    for quiet in [
        "tungstenite=info",
        "tokio_tungstenite=info",
        "h2=info",
        "hyper=info",
    ] {
        if let Ok(d) = quiet.parse() {
            filter = filter.add_directive(d);
        }
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("exec_gateway=info,warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    if let Err(e) = result {
        eprintln!("exec-gateway: logging already initialised: {e}");
    }
}
