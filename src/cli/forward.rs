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
    /// The session, as `--session` rather than first (the older form).
    #[arg(long)]
    pub session: Option<String>,
    /// The local address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub address: IpAddr,
    /// `SESSION [LOCAL:]REMOTE`: the session whose network to reach
    /// (absent: `--session` or EXEC_GATEWAY_SESSION); listen on LOCAL
    /// (absent or 0: a free port) and forward each connection to REMOTE on
    /// the session's loopback. The address listened on is printed on
    /// stdout.
    #[arg(value_names = ["SESSION", "[LOCAL:]REMOTE"], num_args = 1..=2, required = true)]
    pub args: Vec<String>,
}

/// The session and the ports: `SESSION PORTS`, or `PORTS` with the
/// session from `--session` or `env_session` (EXEC_GATEWAY_SESSION).
fn session_and_ports(
    args: &[String],
    flag: Option<&str>,
    env_session: Option<String>,
) -> Result<(String, String), String> {
    match (args, flag) {
        ([_, _], Some(_)) => Err(
            "port-forward: the session named twice (first and with --session)".to_owned(),
        ),
        ([session, ports], None) => Ok((session.clone(), ports.clone())),
        ([ports], Some(session)) => Ok((session.to_owned(), ports.clone())),
        ([ports], None) => env_session.map(|s| (s, ports.clone())).ok_or_else(|| {
            "port-forward: name a session: port-forward SESSION [LOCAL:]REMOTE (or EXEC_GATEWAY_SESSION)"
                .to_owned()
        }),
        _ => Err("port-forward: expected SESSION [LOCAL:]REMOTE".to_owned()),
    }
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
    let (session, ports) = match session_and_ports(
        &args.args,
        args.session.as_deref(),
        env_nonempty("EXEC_GATEWAY_SESSION"),
    ) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    if args.client.grpc {
        return fail("port-forward: over a ws:// or wss:// gateway URL (not --grpc)");
    }
    let (local, remote) = match parse_ports(&ports) {
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
    use super::{parse_ports, session_and_ports};

    #[test]
    fn the_session_comes_first_or_from_the_flag_or_the_environment() {
        let v = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let ok = |s: &str, p: &str| Ok((s.to_owned(), p.to_owned()));
        assert_eq!(
            session_and_ports(&v(&["s", "80"]), None, None),
            ok("s", "80")
        );
        assert_eq!(
            session_and_ports(&v(&["80"]), Some("f"), Some("e".into())),
            ok("f", "80")
        );
        assert_eq!(
            session_and_ports(&v(&["80"]), None, Some("e".into())),
            ok("e", "80")
        );
        assert!(session_and_ports(&v(&["80"]), None, None).is_err());
        assert!(session_and_ports(&v(&["s", "80"]), Some("f"), None).is_err());
    }

    #[test]
    fn ports_are_local_and_remote_or_remote_alone() {
        assert_eq!(parse_ports("8080:80"), Ok((8080, 80)));
        assert_eq!(parse_ports("5432"), Ok((0, 5432)));
        assert!(parse_ports("80:0").is_err());
        assert!(parse_ports("x:80").is_err());
        assert!(parse_ports("70000").is_err());
    }
}
