//! A process's events over gRPC: an `Attach` (or `Exec`) stream, opened
//! again after the last seq it delivered when it breaks.

use std::time::Duration;

use futures_util::StreamExt as _;

use super::super::common::Backoff;
use super::super::error::{ClientError, Result, status_error};
use super::super::types::{self, Event};
use super::Svc;
use crate::protocol::process::StreamName;
use crate::transport::grpc::pb;

/// The events of an `Attach` or `Exec` stream.
pub(super) type EventStream = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = Result<Option<pb::ProcessEvent>, tonic::Status>> + Send>,
>;

/// A process's events over an `Attach` stream, opened again after the
/// last seq when it breaks.
pub(in super::super) struct GrpcAttachment {
    client: pb::process_service_client::ProcessServiceClient<Svc>,
    session_id: String,
    process_id: String,
    resume_within: Duration,
    pub(super) stream: Option<EventStream>,
    /// The last output seq yielded.
    cursor: u64,
    /// The last seq of any event seen.
    last_seq: u64,
    exited: bool,
    closed: bool,
    resyncs: u64,
}

impl GrpcAttachment {
    pub(super) fn new(
        client: pb::process_service_client::ProcessServiceClient<Svc>,
        session_id: &str,
        process_id: &str,
        resume_within: Duration,
        after_seq: u64,
    ) -> GrpcAttachment {
        GrpcAttachment {
            client,
            session_id: session_id.to_owned(),
            process_id: process_id.to_owned(),
            resume_within,
            stream: None,
            cursor: after_seq,
            last_seq: after_seq,
            exited: false,
            closed: false,
            resyncs: 0,
        }
    }

    pub(in super::super) fn cursor(&self) -> u64 {
        self.cursor
    }

    pub(in super::super) fn resyncs(&self) -> u64 {
        self.resyncs
    }

    pub(super) async fn open(&mut self) -> Result<()> {
        let mut backoff = Backoff::new(self.resume_within);
        loop {
            let req = pb::AttachRequest {
                session_id: self.session_id.clone(),
                process_id: self.process_id.clone(),
                after_seq: self.last_seq,
            };
            match self.client.attach(req).await.map_err(status_error) {
                Ok(s) => {
                    self.stream = Some(Box::pin(s.into_inner().map(|r| r.map(|m| m.event))));
                    return Ok(());
                }
                Err(e @ ClientError::Disconnected(_)) => {
                    if !backoff.wait().await {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    pub(in super::super) async fn next(&mut self) -> Result<Option<Event>> {
        loop {
            if self.closed {
                return Ok(None);
            }
            let Some(stream) = self.stream.as_mut() else {
                self.resyncs += 1;
                self.open().await?;
                continue;
            };
            let msg = match stream.next().await {
                Some(Ok(m)) => m,
                None => {
                    // Ended before `closed`: attach again.
                    self.stream = None;
                    continue;
                }
                Some(Err(s)) => {
                    let e = status_error(s);
                    // A reader the live feed dropped, or a broken connection:
                    // attach again after the last seq.
                    if matches!(e, ClientError::Disconnected(_))
                        || e.to_string().contains("attach again")
                    {
                        self.stream = None;
                        continue;
                    }
                    return Err(e);
                }
            };
            let Some(ev) = msg else { continue };
            if ev.seq <= self.last_seq {
                continue;
            }
            self.last_seq = ev.seq;
            match ev.event {
                Some(pb::process_event::Event::Output(o)) => {
                    self.cursor = ev.seq;
                    return Ok(Some(Event::Output {
                        seq: ev.seq,
                        stream: types::stream(wire_stream(o.stream)),
                        data: o.data,
                    }));
                }
                Some(pb::process_event::Event::Exited(x)) if !self.exited => {
                    self.exited = true;
                    return Ok(Some(Event::Exited {
                        code: x.exit_code,
                        signal: x.signal,
                    }));
                }
                Some(pb::process_event::Event::Closed(_)) => self.closed = true,
                Some(pb::process_event::Event::Exited(_)) | None => {}
            }
        }
    }
}

/// A chunk's stream; one this client does not know is stdout.
fn wire_stream(kind: i32) -> StreamName {
    match pb::OutputStream::try_from(kind) {
        Ok(pb::OutputStream::Stderr) => StreamName::Stderr,
        Ok(pb::OutputStream::Pty) => StreamName::Pty,
        _ => StreamName::Stdout,
    }
}
