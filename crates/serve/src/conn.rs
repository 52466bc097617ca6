//! The HTTP/1.1 listener. It accepts connections up to `--max-connections` (past that a client is
//! answered 503 at once and the connection closed), gives every connection a header read timeout
//! (which also closes idle keep-alive connections), and turns hyper's automatic answers to
//! malformed requests — a bare `400`/`414`/`431` with an empty body — into OpenAI error objects,
//! so every error a client sees is JSON. Request bodies are read under `--body-timeout` by the
//! router's guard (`lib.rs`).

use crate::error::ApiError;
use axum::http::StatusCode;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// Open connections at once.
    pub max_connections: usize,
    /// Time a client has to send a request's head (request line and headers), counted from the
    /// moment the server waits for it; an idle keep-alive connection is closed after it too.
    pub header_timeout: Duration,
}

/// Serve `app` on `listener` until `shutdown` resolves, then let every open connection finish its
/// in-flight requests (graceful) and return.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let max = limits.max_connections.max(1);
    let open = Arc::new(Semaphore::new(max));
    let (close_tx, close_rx) = watch::channel(false);
    let mut shutdown = pin!(shutdown);
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                // Out of file descriptors and the like: wait a little instead of spinning.
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            tokio::spawn(refuse(stream, max));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let mut close = close_rx.clone();
        tokio::spawn(async move {
            let io = TokioIo::new(JsonErrors::new(stream));
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .keep_alive(true);
            let mut conn = pin!(builder.serve_connection(io, service));
            let closing = async {
                let _ = close.wait_for(|c| *c).await;
            };
            let finished = tokio::select! {
                _ = conn.as_mut() => true,
                _ = closing => false,
            };
            if !finished {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
            drop(permit);
        });
    }
    let _ = close_tx.send(true);
    // Every connection holds a permit until it is done.
    let _ = open.acquire_many(max as u32).await;
    Ok(())
}

/// Over the connection limit: one JSON 503 and close.
async fn refuse(mut stream: TcpStream, max: usize) {
    let e = ApiError::unavailable(format!(
        "the server has {max} open connections, its limit (--max-connections); retry shortly"
    ));
    let body = e.body().to_string();
    let reply = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         retry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let _ = stream.write_all(reply.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// A connection that rewrites hyper's body-less automatic error responses as JSON errors.
struct JsonErrors<S> {
    inner: S,
    /// A rewritten response still to be written, and how much of it is out.
    pending: Vec<u8>,
    sent: usize,
}

impl<S> JsonErrors<S> {
    fn new(inner: S) -> Self {
        JsonErrors {
            inner,
            pending: Vec::new(),
            sent: 0,
        }
    }
}

/// hyper answers a request it cannot parse with `HTTP/1.1 400|414|431 …`, `content-length: 0` and
/// no content type, then closes the connection (`proto/h1/role.rs`, `Server::on_error`). The
/// router's own responses always carry a content type, so this shape is hyper's alone.
fn rewrite_automatic(head: &[u8]) -> Option<Vec<u8>> {
    let status = head.strip_prefix(b"HTTP/1.1 ")?.get(..3)?;
    let (code, message) = match status {
        b"400" => (
            StatusCode::BAD_REQUEST,
            "malformed HTTP request: the request line, a header or the body framing (Content-Length, \
             Transfer-Encoding) could not be parsed",
        ),
        b"414" => (StatusCode::URI_TOO_LONG, "the request URI is too long"),
        b"431" => (
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "the request headers are too large",
        ),
        _ => return None,
    };
    let end = head.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let text = std::str::from_utf8(&head[..end]).ok()?.to_ascii_lowercase();
    if !text.contains("\r\ncontent-length: 0\r\n") || text.contains("\r\ncontent-type:") {
        return None;
    }
    let body = ApiError::new(code, "invalid_request_error", message).body().to_string();
    let mut out = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        code.as_u16(),
        code.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out.extend_from_slice(&head[end..]);
    Some(out)
}

impl<S: AsyncWrite + Unpin> JsonErrors<S> {
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.pending.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.pending.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonErrors<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for JsonErrors<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        ready!(self.poll_drain(cx))?;
        if let Some(rewritten) = rewrite_automatic(buf) {
            self.pending = rewritten;
            // The caller's bytes are taken whole; what replaces them goes out now or on the next
            // write, flush or shutdown.
            if let Poll::Ready(Err(e)) = self.poll_drain(cx) {
                return Poll::Ready(Err(e));
            }
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::rewrite_automatic;

    #[test]
    fn hypers_bare_400_becomes_json() {
        let head = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: Tue, 01 Dec 2026 00:00:00 GMT\r\n\r\n";
        let out = String::from_utf8(rewrite_automatic(head).unwrap()).unwrap();
        let (h, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(h.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{h}");
        assert!(h.contains(&format!("content-length: {}", body.len())), "{h}");
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }

    #[test]
    fn the_routers_own_responses_are_left_alone() {
        let json = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n";
        assert!(rewrite_automatic(json).is_none());
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert!(rewrite_automatic(ok).is_none());
        assert!(rewrite_automatic(b"{\"error\":1}").is_none());
        assert!(rewrite_automatic(b"data: HTTP/1.1 400").is_none());
    }
}
