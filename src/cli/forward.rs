//! `exec-gateway port-forward`: a local port whose connections each become
//! a forward to a port on a session's loopback (docs/forward.md).

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;

use super::remote::{ClientArgs, env_nonempty, fail, options};
use crate::client::forward::Forward;

#[derive(Debug, clap::Args)]
pub struct PortForwardArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// The session whose network to reach. Default: EXEC_GATEWAY_SESSION.
    #[arg(long)]
    pub session: Option<String>,
    /// The local address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub address: IpAddr,
    /// `[LOCAL:]REMOTE`: listen on LOCAL (absent or 0: a free port) and
    /// forward each connection to REMOTE on the session's loopback. The
    /// address listened on is printed on stdout.
    pub ports: String,
}

/// `LOCAL:REMOTE` or `REMOTE`.
fn parse_ports(s: &str) -> Result<(u16, u16), String> {
    let port = |p: &str| {
        p.parse::<u16>()
            .map_err(|_| format!("port-forward: `{p}` is not a port"))
    };
    let (local, remote) = match s.split_once(':') {
        Some((l, r)) => (port(l)?, port(r)?),
        None => (0, port(s)?),
    };
    if remote == 0 {
        return Err("port-forward: the remote port must be 1 to 65535".to_owned());
    }
    Ok((local, remote))
}

/// `exec-gateway port-forward`: runs until interrupted.
pub async fn port_forward(args: PortForwardArgs) -> ExitCode {
    let Some(session) = args
        .session
        .clone()
        .or_else(|| env_nonempty("EXEC_GATEWAY_SESSION"))
    else {
        return fail("port-forward: name a session with --session or EXEC_GATEWAY_SESSION");
    };
    if args.client.grpc {
        return fail("port-forward: over a ws:// or wss:// gateway URL (not --grpc)");
    }
    let (local, remote) = match parse_ports(&args.ports) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let opts = match options(&args.client) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    // One forward first: a refusal (unknown session, nothing listening,
    // the scope) is told now rather than at the first connection.
    if let Err(e) = Forward::open(&opts, &session, remote).await {
        return fail(format!("port-forward: {e}"));
    }
    let listener = match tokio::net::TcpListener::bind(SocketAddr::new(args.address, local)).await {
        Ok(l) => l,
        Err(e) => {
            return fail(format!(
                "port-forward: listening on {}:{local}: {e}",
                args.address
            ));
        }
    };
    match listener.local_addr() {
        Ok(a) => println!("{a}"),
        Err(e) => return fail(format!("port-forward: {e}")),
    }
    if !args.address.is_loopback() {
        eprintln!(
            "exec-gateway: port-forward: listening on {}: anyone who reaches it reaches the session's port {remote}, without a credential",
            args.address
        );
    }
    loop {
        let (conn, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("exec-gateway: port-forward: accept: {e}");
                continue;
            }
        };
        let (opts, session) = (opts.clone(), session.clone());
        crate::task::start("port-forward", async move {
            match Forward::open(&opts, &session, remote).await {
                Ok(f) => {
                    let _ = f.splice(conn).await;
                }
                Err(e) => eprintln!("exec-gateway: port-forward: {peer}: {e}"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::parse_ports;

    #[test]
    fn ports_are_local_and_remote_or_remote_alone() {
        assert_eq!(parse_ports("8080:80"), Ok((8080, 80)));
        assert_eq!(parse_ports("5432"), Ok((0, 5432)));
        assert!(parse_ports("80:0").is_err());
        assert!(parse_ports("x:80").is_err());
        assert!(parse_ports("70000").is_err());
    }
}
