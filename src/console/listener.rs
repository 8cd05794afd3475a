//! The console's listener: at most [`CONNECTIONS`] connections at once.
//!
//! Any local program can connect to a loopback port without a token. Unbounded, idle or
//! half-sent connections would take the broker's descriptors, which its sessions need; with
//! a bound they can at worst keep the console itself busy, never the broker.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Connections the console serves at once (a page holds two or three).
pub(crate) const CONNECTIONS: usize = 64;

/// A listener that accepts a connection only while fewer than [`CONNECTIONS`] are open.
pub(crate) struct Capped {
    inner: TcpListener,
    slots: Arc<Semaphore>,
}

impl Capped {
    pub(crate) fn new(inner: TcpListener) -> Capped {
        Capped {
            inner,
            slots: Arc::new(Semaphore::new(CONNECTIONS)),
        }
    }
}

/// An accepted connection, holding its slot until it closes.
pub(crate) struct Slot {
    io: TcpStream,
    _slot: OwnedSemaphorePermit,
}

impl axum::serve::Listener for Capped {
    type Io = Slot;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Slot, std::net::SocketAddr) {
        loop {
            // Waiting here leaves further connections in the kernel's backlog.
            let Ok(slot) = Arc::clone(&self.slots).acquire_owned().await else {
                std::future::pending::<()>().await;
                continue;
            };
            match self.inner.accept().await {
                Ok((io, addr)) => return (Slot { io, _slot: slot }, addr),
                Err(e) => {
                    tracing::debug!(error = %e, "console: accept failed");
                    // Out of descriptors, say: give the broker a moment before trying again.
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.inner.local_addr()
    }
}

impl AsyncRead for Slot {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Slot {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
