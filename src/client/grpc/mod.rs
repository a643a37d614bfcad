//! The gRPC backend (`proto/exec_gateway/v1`). A gRPC session is made
//! with `CreateSession`; it lives while used. Calls carry the token as
//! metadata; the channel reconnects on its own, and an `Attach` stream
//! that breaks is opened again after the last seq it delivered.

mod attach;
mod files;
mod snapshots;

pub(super) use self::attach::GrpcAttachment;
use super::common::{Backoff, Ids, error_chain, redact_url};
use super::error::{
    ClientError, Result, auth_as_connect, is_overloaded, retry_after, status_error,
};
use super::types::{
    ConnectOptions, MAX_MESSAGE_BYTES, ProcessInfo, ProcessSpec, Signal, WriteStatus, state_name,
    write_status,
};
use crate::protocol::process::{self as wire, ProcessState, SignalName};
use crate::transport::grpc::pb;
use tonic::codegen::InterceptedService;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::Channel;

type Svc = InterceptedService<Channel, Bearer>;

/// Adds `authorization: Bearer` to every call.
#[derive(Clone)]
pub(super) struct Bearer(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(b) = &self.0 {
            req.metadata_mut().insert("authorization", b.clone());
        }
        Ok(req)
    }
}

/// How long dialling the gateway over TLS may take.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

pub(super) struct GrpcClient {
    opts: ConnectOptions,
    session_id: String,
    root: String,
    channel: Channel,
    bearer: Bearer,
    ids: Ids,
}

impl GrpcClient {
    pub(super) async fn connect(opts: ConnectOptions) -> Result<GrpcClient> {
        let target = redact_url(&opts.url);
        let connect_err = |detail: String| ClientError::Connect {
            url: target.clone(),
            detail,
        };
        // `grpcs://` and `https://` dial over TLS (a connector of our own:
        // rustls with ring, the CA bundle and client certificate given).
        let (url, tls) = if let Some(rest) = opts.url.strip_prefix("grpc://") {
            (format!("http://{rest}"), None)
        } else if let Some(rest) = opts.url.strip_prefix("grpcs://") {
            (format!("https://{rest}"), Some(()))
        } else {
            let tls = opts.url.starts_with("https://").then_some(());
            (opts.url.clone(), tls)
        };
        let tls = match tls {
            Some(()) => Some(
                opts.tls(crate::tls::ALPN_H2)
                    .map_err(|e| connect_err(format!("TLS: {e}")))?,
            ),
            None => None,
        };
        let endpoint = Channel::from_shared(url)
            .map_err(|e| connect_err(e.to_string()))?
            .initial_stream_window_size(crate::transport::grpc::HTTP2_STREAM_WINDOW_BYTES)
            .initial_connection_window_size(crate::transport::grpc::HTTP2_CONNECTION_WINDOW_BYTES)
            .http2_adaptive_window(true)
            .tcp_nodelay(true);
        // A session being resumed outlasts a connection that fails, as a
        // live client's calls do; a new one reports it at once.
        let mut backoff = Backoff::new(opts.resume_within);
        let channel = loop {
            let connected = match &tls {
                None => endpoint.connect().await,
                Some(tls) => {
                    endpoint
                        .connect_with_connector(crate::tls::Connector {
                            tls: tls.clone(),
                            timeout: CONNECT_TIMEOUT,
                        })
                        .await
                }
            };
            match connected {
                Ok(c) => break c,
                Err(_) if opts.resume_session.is_some() && backoff.wait().await => {}
                Err(e) => return Err(connect_err(error_chain(&e))),
            }
        };
        let bearer = Bearer(
            opts.bearer()
                .map(|b| b.parse())
                .transpose()
                .map_err(|_| connect_err("the token is not a valid header value".to_owned()))?,
        );
        let mut client = GrpcClient {
            opts,
            session_id: String::new(),
            root: String::new(),
            channel,
            bearer,
            ids: Ids::new(),
        };
        let auth_err = |e: ClientError| auth_as_connect(e, &target);
        // A dropped connection, or a replica that is over its limits or
        // draining (the balancer sends the next call elsewhere), is asked
        // again within `resume_within`.
        client.session_id = match client.opts.resume_session.clone() {
            Some(s) => {
                client
                    .retrying(|| {
                        let mut c = client.sessions();
                        let req = pb::ResumeSessionRequest {
                            session_id: s.clone(),
                        };
                        async move { c.resume_session(req).await }
                    })
                    .await
                    .map_err(auth_err)?
                    .session_id
            }
            None => {
                client
                    .retrying(|| {
                        let mut c = client.sessions();
                        let req = pb::CreateSessionRequest {
                            image: client.opts.image.clone().unwrap_or_default(),
                            client_name: client.opts.client_name.clone(),
                            snapshot: String::new(),
                        };
                        async move { c.create_session(req).await }
                    })
                    .await
                    .map_err(auth_err)?
                    .session_id
            }
        };
        client.root = pb::environment_service_client::EnvironmentServiceClient::with_interceptor(
            client.channel.clone(),
            client.bearer.clone(),
        )
        .get_info(pb::GetInfoRequest {
            session_id: client.session_id.clone(),
        })
        .await
        .map_err(status_error)?
        .into_inner()
        .cwd;
        Ok(client)
    }

    pub(super) fn session_id(&self) -> &str {
        &self.session_id
    }

    pub(super) fn root(&self) -> &str {
        &self.root
    }

    fn sessions(&self) -> pb::session_service_client::SessionServiceClient<Svc> {
        pb::session_service_client::SessionServiceClient::with_interceptor(
            self.channel.clone(),
            self.bearer.clone(),
        )
    }

    fn processes(&self) -> pb::process_service_client::ProcessServiceClient<Svc> {
        pb::process_service_client::ProcessServiceClient::with_interceptor(
            self.channel.clone(),
            self.bearer.clone(),
        )
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    fn files(&self) -> pb::file_service_client::FileServiceClient<Svc> {
        pb::file_service_client::FileServiceClient::with_interceptor(
            self.channel.clone(),
            self.bearer.clone(),
        )
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// Run a unary call, retrying while the connection is down (the
    /// channel reconnects) or the gateway is overloaded.
    async fn retrying<T, F, Fut>(&self, mut call: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut backoff: Option<Backoff> = None;
        loop {
            match call().await.map_err(status_error) {
                Ok(r) => return Ok(r.into_inner()),
                Err(e @ ClientError::Disconnected(_)) => {
                    let b = backoff.get_or_insert_with(|| Backoff::new(self.opts.resume_within));
                    if !b.wait().await {
                        return Err(e);
                    }
                }
                Err(e) if is_overloaded(&e) => {
                    tokio::time::sleep(retry_after(&e)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    pub(super) async fn start(&self, spec: &ProcessSpec) -> Result<()> {
        self.start_from(spec, false).await
    }

    /// [`GrpcClient::start`]; `after_drop`: an earlier call that may have
    /// started it broke, so finding the process there counts as started.
    async fn start_from(&self, spec: &ProcessSpec, after_drop: bool) -> Result<()> {
        let spec = process_spec(spec);
        let mut first = !after_drop;
        let r = self
            .retrying(|| {
                let retried = !first;
                first = false;
                let req = pb::StartRequest {
                    session_id: self.session_id.clone(),
                    spec: Some(spec.clone()),
                };
                let mut c = self.processes();
                async move {
                    match c.start(req).await {
                        // A start retried after a drop may find the first one done.
                        Err(s) if retried && s.code() == tonic::Code::AlreadyExists => {
                            Ok(tonic::Response::new(pb::StartResponse::default()))
                        }
                        r => r,
                    }
                }
            })
            .await;
        r.map(|_| ())
    }

    /// Start a process and stream its events in one call (`Exec`).
    pub(super) async fn exec(&self, spec: &ProcessSpec) -> Result<GrpcAttachment> {
        use futures_util::StreamExt as _;
        let mut a = self.attachment(&spec.process_id, 0);
        let req = pb::ExecRequest {
            session_id: self.session_id.clone(),
            spec: Some(process_spec(spec)),
        };
        // The gateway starts the process before it answers: a refused
        // start is this call's status.
        match self.processes().exec(req).await.map_err(status_error) {
            Ok(stream) => {
                let stream = stream.into_inner();
                a.stream = Some(Box::pin(stream.map(|r| r.map(|m| m.event))));
            }
            // The connection broke before the answer: the process may or
            // may not have started. Start it (finding it there counts) and
            // attach from its first event.
            Err(ClientError::Disconnected(_)) => {
                self.start_from(spec, true).await?;
                a.open().await?;
            }
            Err(e) => return Err(e),
        }
        Ok(a)
    }

    fn attachment(&self, process_id: &str, after_seq: u64) -> GrpcAttachment {
        GrpcAttachment::new(
            self.processes(),
            &self.session_id,
            process_id,
            self.opts.resume_within,
            after_seq,
        )
    }

    pub(super) async fn attach(&self, process_id: &str, after_seq: u64) -> Result<GrpcAttachment> {
        let mut a = self.attachment(process_id, after_seq);
        a.open().await?;
        Ok(a)
    }

    pub(super) async fn close(&self) -> Result<()> {
        self.retrying(|| {
            let req = pb::CloseSessionRequest {
                session_id: self.session_id.clone(),
            };
            let mut c = self.sessions();
            async move { c.close_session(req).await }
        })
        .await
        .map(|_| ())
    }

    pub(super) async fn write(&self, process_id: &str, data: &[u8]) -> Result<WriteStatus> {
        let write_id = self.ids.next("w");
        let r = self
            .retrying(|| {
                let req = pb::WriteRequest {
                    session_id: self.session_id.clone(),
                    process_id: process_id.to_owned(),
                    data: bytes::Bytes::copy_from_slice(data),
                    write_id: Some(write_id.clone()),
                };
                let mut c = self.processes();
                async move { c.write(req).await }
            })
            .await?;
        match wire_write_status(r.status) {
            Some(s) => Ok(write_status(s)),
            None => Err(ClientError::Protocol(format!("write status {}", r.status))),
        }
    }

    pub(super) async fn close_stdin(&self, process_id: &str) -> Result<()> {
        self.retrying(|| {
            let req = pb::CloseStdinRequest {
                session_id: self.session_id.clone(),
                process_id: process_id.to_owned(),
            };
            let mut c = self.processes();
            async move { c.close_stdin(req).await }
        })
        .await
        .map(|_| ())
    }

    pub(super) async fn signal(&self, process_id: &str, signal: Signal) -> Result<()> {
        let kind = signal_kind(signal.wire());
        self.retrying(|| {
            let req = pb::SignalRequest {
                session_id: self.session_id.clone(),
                process_id: process_id.to_owned(),
                signal: kind as i32,
            };
            let mut c = self.processes();
            async move { c.signal(req).await }
        })
        .await
        .map(|_| ())
    }

    pub(super) async fn resize(&self, process_id: &str, rows: u16, cols: u16) -> Result<()> {
        self.retrying(|| {
            let req = pb::ResizeRequest {
                session_id: self.session_id.clone(),
                process_id: process_id.to_owned(),
                rows: u32::from(rows),
                cols: u32::from(cols),
            };
            let mut c = self.processes();
            async move { c.resize(req).await }
        })
        .await
        .map(|_| ())
    }

    pub(super) async fn terminate(&self, process_id: &str) -> Result<bool> {
        self.retrying(|| {
            let req = pb::TerminateRequest {
                session_id: self.session_id.clone(),
                process_id: process_id.to_owned(),
            };
            let mut c = self.processes();
            async move { c.terminate(req).await }
        })
        .await
        .map(|r| r.running)
    }

    pub(super) async fn list(&self) -> Result<Vec<ProcessInfo>> {
        let r = self
            .retrying(|| {
                let req = pb::ListRequest {
                    session_id: self.session_id.clone(),
                };
                let mut c = self.processes();
                async move { c.list(req).await }
            })
            .await?;
        Ok(r.processes
            .into_iter()
            .map(|p| ProcessInfo {
                state: state_name(wire_state(p.state)).to_owned(),
                process_id: p.process_id,
                tty: p.tty,
                exit_code: p.exit_code,
                next_seq: p.next_seq,
            })
            .collect())
    }
}

// The gRPC messages as the protocol's types, which the client's own are
// made from (`types`).

/// `Start`'s spec: the same process `process/start` would start.
fn process_spec(spec: &ProcessSpec) -> pb::ProcessSpec {
    pb::ProcessSpec {
        process_id: spec.process_id.clone(),
        argv: spec.argv.clone(),
        cwd: spec.cwd.clone(),
        env: spec.env.clone().into_iter().collect(),
        tty: spec.tty,
        pipe_stdin: spec.wants_pipe_stdin(),
        arg0: None,
        env_policy: Some(pb::EnvPolicy {
            inherit: pb::EnvInherit::All as i32,
            ..pb::EnvPolicy::default()
        }),
    }
}

fn signal_kind(s: SignalName) -> pb::SignalKind {
    match s {
        SignalName::Interrupt => pb::SignalKind::Interrupt,
        SignalName::Terminate => pb::SignalKind::Terminate,
        SignalName::Kill => pb::SignalKind::Kill,
        SignalName::Hangup => pb::SignalKind::Hangup,
        SignalName::Quit => pb::SignalKind::Quit,
        SignalName::User1 => pb::SignalKind::User1,
        SignalName::User2 => pb::SignalKind::User2,
    }
}

fn wire_write_status(status: i32) -> Option<wire::WriteStatus> {
    Some(match pb::WriteStatus::try_from(status).ok()? {
        pb::WriteStatus::Accepted => wire::WriteStatus::Accepted,
        pb::WriteStatus::UnknownProcess => wire::WriteStatus::UnknownProcess,
        pb::WriteStatus::StdinClosed => wire::WriteStatus::StdinClosed,
        pb::WriteStatus::Starting => wire::WriteStatus::Starting,
        pb::WriteStatus::Unspecified => return None,
    })
}

fn wire_state(state: i32) -> Option<ProcessState> {
    Some(match pb::ProcessState::try_from(state).ok()? {
        pb::ProcessState::Starting => ProcessState::Starting,
        pb::ProcessState::Running => ProcessState::Running,
        pb::ProcessState::Exited => ProcessState::Exited,
        pb::ProcessState::Closed => ProcessState::Closed,
        pb::ProcessState::Unspecified => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pb_enums_map_to_the_protocols() {
        assert_eq!(
            wire_write_status(pb::WriteStatus::Starting as i32),
            Some(wire::WriteStatus::Starting)
        );
        assert_eq!(wire_write_status(pb::WriteStatus::Unspecified as i32), None);
        assert_eq!(wire_write_status(99), None);
        assert_eq!(
            wire_state(pb::ProcessState::Exited as i32),
            Some(ProcessState::Exited)
        );
        assert_eq!(state_name(wire_state(0)), "unknown");
        assert_eq!(signal_kind(Signal::Hangup.wire()), pb::SignalKind::Hangup);
        assert_eq!(signal_kind(Signal::User1.wire()), pb::SignalKind::User1);
    }

    #[test]
    fn a_terminal_spec_asks_for_no_stdin_pipe() {
        let mut spec = ProcessSpec::new("p", ["sh"]);
        spec.pipe_stdin = true;
        assert!(process_spec(&spec).pipe_stdin);
        spec.tty = true;
        let pb = process_spec(&spec);
        assert!(pb.tty && !pb.pipe_stdin);
        assert_eq!(
            pb.env_policy.map(|p| p.inherit),
            Some(pb::EnvInherit::All as i32)
        );
    }
}
