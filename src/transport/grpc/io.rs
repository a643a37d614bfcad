//! A gRPC connection as tonic serves it: plaintext, or TLS over the same
//! guarded socket (the handshake deadline covers the TLS handshake).

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::transport::limits::{ConnInfo, Guarded};

/// One accepted gRPC connection.
pub enum ServerIo {
    Plain(Guarded<TcpStream>),
    Tls(Box<tokio_rustls::server::TlsStream<Guarded<TcpStream>>>),
}

impl AsyncRead for ServerIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ServerIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ServerIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ServerIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ServerIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ServerIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ServerIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ServerIo::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            ServerIo::Plain(s) => s.is_write_vectored(),
            ServerIo::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ServerIo::Plain(s) => Pin::new(s).poll_flush(cx),
            ServerIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ServerIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ServerIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl tonic::transport::server::Connected for ServerIo {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        match self {
            ServerIo::Plain(s) => s.connect_info(),
            ServerIo::Tls(s) => ConnInfo {
                client_cert: crate::tls::server::client_leaf(s),
                ..s.get_ref().0.connect_info()
            },
        }
    }
}
