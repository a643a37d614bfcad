//! Connection limits, the same for both doors: a connection is
//! *unauthenticated* from accept until its first authenticated request (a
//! websocket upgrade, a gRPC call), and only then takes one of the
//! authenticated slots (gateway-wide per door, and its tenant's).
//!
//! Unauthenticated connections are cheap and bounded: a total cap, a cap
//! per source address, and a deadline ([`Guarded`]) after which a
//! connection that has not authenticated is closed, whatever it is doing
//! (an HTTP head trickled byte by byte, an HTTP/2 preface never sent,
//! health checks on a kept-alive connection). Idle sockets of clients that
//! never authenticate therefore cannot take the slots of those that do.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::GatewayError;
use crate::metrics::Metrics;
use crate::tenant::Tenant;

/// Which door a connection came in by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    Websocket,
    Grpc,
    /// The fleet's peer listener (its own [`ConnectionLimits`]).
    Peer,
}

impl Door {
    pub fn name(self) -> &'static str {
        match self {
            Door::Websocket => "websocket",
            Door::Grpc => "grpc",
            Door::Peer => "fleet",
        }
    }
}

/// The caps, shared by both doors.
pub struct ConnectionLimits {
    unauthenticated: Arc<Semaphore>,
    /// Unauthenticated connections, oldest first (some may have moved on:
    /// skipped when met). When the total cap is full the oldest is closed
    /// to make room: a flood of idle sockets must then outpace real
    /// handshakes, which take milliseconds, to keep anyone out.
    pending: Mutex<std::collections::VecDeque<std::sync::Weak<Conn>>>,
    unauthenticated_cap: usize,
    per_source: Mutex<HashMap<IpAddr, usize>>,
    per_source_max: usize,
    websocket: Arc<Semaphore>,
    grpc: Arc<Semaphore>,
    pub handshake_timeout: Duration,
    metrics: Arc<Metrics>,
}

/// The caps' sizes.
#[derive(Debug, Clone, Copy)]
pub struct LimitSettings {
    pub max_unauthenticated: usize,
    pub max_unauthenticated_per_source: usize,
    pub websocket: usize,
    pub grpc: usize,
    pub handshake_timeout: Duration,
}

impl ConnectionLimits {
    pub fn new(limits: LimitSettings, metrics: Arc<Metrics>) -> Arc<ConnectionLimits> {
        Arc::new(ConnectionLimits {
            unauthenticated: Arc::new(Semaphore::new(limits.max_unauthenticated)),
            pending: Mutex::new(std::collections::VecDeque::new()),
            unauthenticated_cap: limits.max_unauthenticated,
            per_source: Mutex::new(HashMap::new()),
            per_source_max: limits.max_unauthenticated_per_source,
            websocket: Arc::new(Semaphore::new(limits.websocket)),
            grpc: Arc::new(Semaphore::new(limits.grpc)),
            handshake_timeout: limits.handshake_timeout,
            metrics,
        })
    }

    /// Guard a just-accepted connection as unauthenticated, or refuse it
    /// (the caller drops the socket: refusing costs no more than that).
    pub fn accept(self: &Arc<Self>, door: Door, source: IpAddr) -> Option<Arc<Conn>> {
        let refuse = |reason: &str| {
            self.metrics.connection_refused(door.name(), reason);
            tracing::debug!(%source, door = door.name(), reason, "connection refused");
            None
        };
        // The per-source cap first: a source at its cap evicts no one.
        if self
            .per_source
            .lock()
            .get(&source)
            .is_some_and(|n| *n >= self.per_source_max)
        {
            return refuse("unauthenticated_per_source");
        }
        let total = match self.unauthenticated.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                if !self.evict_oldest(door) {
                    return refuse("unauthenticated_total");
                }
                match self.unauthenticated.clone().try_acquire_owned() {
                    Ok(p) => p,
                    Err(_) => return refuse("unauthenticated_total"),
                }
            }
        };
        {
            let mut per = self.per_source.lock();
            let n = per.entry(source).or_insert(0);
            if *n >= self.per_source_max {
                drop(per);
                return refuse("unauthenticated_per_source");
            }
            *n += 1;
        }
        let gauge = self
            .metrics
            .connection_gauge(door.name(), "unauthenticated");
        gauge.inc();
        let conn = Arc::new(Conn {
            door,
            limits: self.clone(),
            state: Mutex::new(State::Pending(Pending {
                source,
                _total: total,
                gauge,
            })),
            authenticated: AtomicBool::new(false),
            waker: futures_util::task::AtomicWaker::new(),
            accepted: tokio::time::Instant::now(),
        });
        let mut pending = self.pending.lock();
        // Bounded: drop what has moved on once it outnumbers the cap.
        if pending.len() >= 2 * self.unauthenticated_cap + 64 {
            pending.retain(|w| w.upgrade().is_some_and(|c| c.is_pending()));
        }
        pending.push_back(Arc::downgrade(&conn));
        Some(conn)
    }

    /// Close the oldest connection still unauthenticated; false if none.
    fn evict_oldest(&self, door: Door) -> bool {
        loop {
            let Some(weak) = self.pending.lock().pop_front() else {
                return false;
            };
            if let Some(conn) = weak.upgrade()
                && conn.close_unauthenticated()
            {
                self.metrics
                    .connection_refused(door.name(), "evicted_oldest");
                return true;
            }
        }
    }

    fn release_source(&self, source: IpAddr) {
        let mut per = self.per_source.lock();
        if let Some(n) = per.get_mut(&source) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                per.remove(&source);
            }
        }
    }
}

/// One connection's limits state.
pub struct Conn {
    door: Door,
    limits: Arc<ConnectionLimits>,
    state: Mutex<State>,
    /// Set once promoted: the handshake deadline no longer applies.
    authenticated: AtomicBool,
    /// The socket's task, woken when the connection is closed from outside.
    waker: futures_util::task::AtomicWaker,
    /// When it was accepted: its handshake deadline runs from here.
    accepted: tokio::time::Instant,
}

/// The share of the handshake timeout (in quarters) a handshake may wait
/// for its tenant's image pull before it answers "retry" instead: the last
/// quarter is left to send the answer before the deadline closes the
/// connection.
const PULL_WAIT_QUARTERS: u32 = 3;

enum State {
    Pending(Pending),
    // Holds the slots until the connection ends.
    Admitted(#[allow(dead_code)] Slot),
    /// Promotion failed for want of a slot; the deadline still applies.
    Closed,
}

struct Pending {
    source: IpAddr,
    _total: OwnedSemaphorePermit,
    gauge: Gauge,
}

struct Slot {
    _door: OwnedSemaphorePermit,
    _tenant: Option<OwnedSemaphorePermit>,
    /// A gRPC connection's receive window, held in its tenant's inbound
    /// budget: what the client may have sent that HTTP/2 holds unread.
    _window: Option<(OwnedSemaphorePermit, crate::outbound::Reservation)>,
    gauge: Gauge,
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("door", &self.door)
            .field("authenticated", &self.is_authenticated())
            .finish()
    }
}

impl Conn {
    pub fn is_authenticated(&self) -> bool {
        self.authenticated.load(Ordering::Acquire)
    }

    /// Until when a handshake on this connection may wait for its
    /// tenant's image to be pulled before it answers 503 / UNAVAILABLE
    /// (module `transport::authenticate`); `None` once authenticated (no
    /// deadline applies then).
    pub fn answer_by(&self) -> Option<tokio::time::Instant> {
        if self.is_authenticated() {
            return None;
        }
        Some(self.accepted + self.limits.handshake_timeout / 4 * PULL_WAIT_QUARTERS)
    }

    fn is_pending(&self) -> bool {
        matches!(*self.state.lock(), State::Pending(_))
    }

    /// Close a connection that has not authenticated (its slots are free
    /// at once; its socket fails on the next poll). False if it had
    /// authenticated or was already closed.
    fn close_unauthenticated(&self) -> bool {
        let previous = {
            let mut state = self.state.lock();
            if !matches!(*state, State::Pending(_)) {
                return false;
            }
            std::mem::replace(&mut *state, State::Closed)
        };
        if let State::Pending(p) = previous {
            self.limits.release_source(p.source);
        }
        self.waker.wake();
        true
    }

    /// Move the connection into the authenticated slots (door and
    /// tenant); idempotent. A full cap is -32001 (HTTP 503,
    /// `RESOURCE_EXHAUSTED`) and the connection stays unauthenticated.
    pub fn promote(&self, tenant: &Tenant) -> Result<(), GatewayError> {
        self.promote_inner(Some(tenant))
    }

    /// Move a peer replica's connection or an executor's link into the
    /// authenticated slots (no tenant slot: a peer carries many tenants'
    /// calls, and an executor's links are bounded by its pool).
    pub fn promote_link(&self) -> Result<(), GatewayError> {
        self.promote_inner(None)
    }

    fn promote_inner(&self, tenant: Option<&Tenant>) -> Result<(), GatewayError> {
        if self.is_authenticated() {
            return Ok(());
        }
        let mut state = self.state.lock();
        if !matches!(*state, State::Pending(_)) {
            return match *state {
                State::Admitted(_) => Ok(()),
                _ => Err(GatewayError::Overloaded),
            };
        }
        let adm = &self.limits;
        let door_sem = match self.door {
            Door::Websocket => &adm.websocket,
            Door::Grpc | Door::Peer => &adm.grpc,
        };
        let Ok(door) = door_sem.clone().try_acquire_owned() else {
            adm.metrics
                .connection_refused(self.door.name(), "connections");
            return Err(GatewayError::Overloaded);
        };
        let tenant_slot = match tenant.map(|t| t.connections.clone().try_acquire_owned()) {
            None => None,
            Some(Ok(p)) => Some(p),
            Some(Err(_)) => {
                adm.metrics
                    .connection_refused(self.door.name(), "tenant_connections");
                return Err(GatewayError::Overloaded);
            }
        };
        let window = match (self.door, tenant) {
            (Door::Grpc, Some(t)) => {
                let slot = t.grpc_windows.clone().try_acquire_owned().ok();
                let bytes = slot.as_ref().and_then(|_| {
                    t.inbound
                        .try_reserve(crate::config::GRPC_RECEIVE_WINDOW_BYTES as usize)
                });
                match (slot, bytes) {
                    (Some(slot), Some(bytes)) => Some((slot, bytes)),
                    _ => {
                        adm.metrics
                            .connection_refused(self.door.name(), "inbound_budget");
                        return Err(GatewayError::QuotaExceeded {
                            quota: "inbound_bytes",
                            limit: t.settings.max_inbound_bytes as u64,
                            retry_after_ms: None,
                        });
                    }
                }
            }
            _ => None,
        };
        let gauge = adm
            .metrics
            .connection_gauge(self.door.name(), "authenticated");
        gauge.inc();
        let previous = std::mem::replace(
            &mut *state,
            State::Admitted(Slot {
                _door: door,
                _tenant: tenant_slot,
                _window: window,
                gauge,
            }),
        );
        if let State::Pending(p) = previous {
            adm.release_source(p.source);
        }
        self.authenticated.store(true, Ordering::Release);
        // The handshake's waker is not needed past this point, and it holds
        // the task that served the handshake (its whole cell, ~5 KiB) alive
        // for as long as the connection lasts.
        drop(self.waker.take());
        Ok(())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let state = std::mem::replace(self.state.get_mut(), State::Closed);
        if let State::Pending(p) = state {
            self.limits.release_source(p.source);
        }
    }
}

/// A connection's socket, closed (reads and writes fail) once the
/// handshake timeout passes without the connection authenticating.
pub struct Guarded<T> {
    io: T,
    conn: Arc<Conn>,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    pub remote: Option<std::net::SocketAddr>,
}

impl<T> Guarded<T> {
    pub fn new(io: T, conn: Arc<Conn>, remote: Option<std::net::SocketAddr>) -> Self {
        let deadline = Some(Box::pin(tokio::time::sleep(conn.limits.handshake_timeout)));
        Guarded {
            io,
            conn,
            deadline,
            remote,
        }
    }

    pub fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }

    /// Past the deadline without authenticating: the error to fail with.
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<std::io::Error> {
        let d = self.deadline.as_mut()?;
        if self.conn.is_authenticated() {
            self.deadline = None;
            return None;
        }
        self.conn.waker.register(cx.waker());
        if self.conn.is_authenticated() {
            // Promoted between the check and the registration.
            drop(self.conn.waker.take());
            self.deadline = None;
            return None;
        }
        if d.as_mut().poll(cx).is_ready() {
            self.deadline = None;
            self.conn
                .limits
                .metrics
                .connection_refused(self.conn.door.name(), "handshake_timeout");
            // Its unauthenticated slot is free at once; later polls fail.
            self.conn.close_unauthenticated();
            return Some(timed_out());
        }
        if self.closed() {
            // Evicted to make room for a newer connection.
            self.deadline = None;
            return Some(timed_out());
        }
        None
    }

    fn closed(&self) -> bool {
        !self.conn.is_authenticated() && matches!(*self.conn.state.lock(), State::Closed)
    }
}

fn timed_out() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no authenticated request before the handshake timeout",
    )
}

impl<T: AsyncRead + Unpin> AsyncRead for Guarded<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(e) = self.expired(cx) {
            return Poll::Ready(Err(e));
        }
        if self.closed() {
            return Poll::Ready(Err(timed_out()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Guarded<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if let Some(e) = self.expired(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if let Some(e) = self.expired(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// What a gRPC request knows of its connection (a request extension).
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub remote: Option<std::net::SocketAddr>,
    pub conn: Arc<Conn>,
    /// The client certificate its TLS handshake verified (the leaf).
    pub client_cert: Option<Arc<rustls::pki_types::CertificateDer<'static>>>,
}

impl tonic::transport::server::Connected for Guarded<tokio::net::TcpStream> {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        ConnInfo {
            remote: self.remote,
            conn: self.conn.clone(),
            client_cert: None,
        }
    }
}
