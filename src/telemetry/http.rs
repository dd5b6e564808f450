//! The small HTTP servers: Prometheus metrics on `/metrics`, liveness and readiness on
//! `/liveness` and `/readiness`; each binds its own address and port, as felix's do.
//!
//! Built on `tiny_http`, a synchronous server: the agent is threads and channels with no
//! async runtime, and these endpoints answer a scrape or a kubelet probe every few seconds,
//! so one thread per server that answers requests in turn is all that is needed. hyper would
//! bring a tokio runtime and more code for no gain here; a hand-written HTTP parser would be
//! code of our own to get right. Only GET and HEAD are served.
//!
//! Streams (the flow-log stream): a route may answer with a [`Stream`] instead, which gets a
//! thread of its own and the connection's raw writer, so it never holds up the server's other
//! requests. Its body is delimited by the connection's end (`Connection: close`), which keeps
//! each line on the wire as soon as it is written (a chunked body would be buffered); the
//! route bounds how many are open.

use std::io::Write;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use anyhow::{anyhow, Context};
use tiny_http::{Header, Method, Response, Server};

use crate::telemetry::health::{Health, Probe};

/// What a route answers.
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Reply {
    pub fn text(status: u16, body: impl Into<String>) -> Reply {
        let mut body = body.into();
        body.push('\n');
        Reply {
            status,
            content_type: "text/plain; charset=utf-8",
            body,
        }
    }
}

/// Writes a stream's body until done or the client went away (an error then).
pub type StreamBody = Box<dyn FnOnce(&mut dyn Write) -> std::io::Result<()> + Send>;

/// A streamed answer: written on a thread of its own until its body returns.
pub struct Stream {
    pub content_type: &'static str,
    pub write: StreamBody,
}

/// Routes that may stream: `None` not theirs, `Some(Err(reply))` answered at once.
pub type StreamRoute = dyn Fn(&str, &str) -> Option<Result<Stream, Reply>> + Send;

/// Binds `host:port` and answers requests from a background thread with `route(path, query)`
/// (`None`: 404). Returns the bound address (port 0 picks a free one).
pub fn serve<F>(name: &str, host: &str, port: u16, route: F) -> anyhow::Result<SocketAddr>
where
    F: Fn(&str, &str) -> Option<Reply> + Send + 'static,
{
    serve_streams(name, host, port, route, Box::new(|_, _| None))
}

/// [`serve`], and `streams` asked first for each GET.
pub fn serve_streams<F>(
    name: &str,
    host: &str,
    port: u16,
    route: F,
    streams: Box<StreamRoute>,
) -> anyhow::Result<SocketAddr>
where
    F: Fn(&str, &str) -> Option<Reply> + Send + 'static,
{
    let addr = (host, port)
        .to_socket_addrs()
        .with_context(|| format!("{name} server: cannot resolve {host}:{port}"))?
        .next()
        .ok_or_else(|| anyhow!("{name} server: {host}:{port} resolves to no address"))?;
    let server =
        Server::http(addr).map_err(|e| anyhow!("{name} server: cannot listen on {addr}: {e}"))?;
    let bound = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| anyhow!("{name} server: not an IP listener"))?;
    std::thread::Builder::new()
        .name(format!("http-{name}"))
        .spawn(move || {
            for request in server.incoming_requests() {
                let reply = match request.method() {
                    Method::Get | Method::Head => {
                        let url = request.url().to_string();
                        let (path, query) = url.split_once('?').unwrap_or((&url, ""));
                        match streams(path, query) {
                            Some(Ok(stream)) => {
                                start_stream(request, stream);
                                continue;
                            }
                            Some(Err(reply)) => reply,
                            None => {
                                route(path, query).unwrap_or_else(|| Reply::text(404, "not found"))
                            }
                        }
                    }
                    _ => Reply::text(405, "only GET and HEAD"),
                };
                let mut response = Response::from_string(reply.body).with_status_code(reply.status);
                if let Ok(h) = Header::from_bytes("Content-Type", reply.content_type) {
                    response.add_header(h);
                }
                if let Err(e) = request.respond(response) {
                    tracing::debug!("http: cannot answer: {e}");
                }
            }
        })
        .context("cannot start the http thread")?;
    tracing::info!(%bound, "{name} server listening");
    Ok(bound)
}

/// Answers `request` with `stream` on a thread of its own.
fn start_stream(request: tiny_http::Request, stream: Stream) {
    let head = *request.method() == Method::Head;
    let spawned = std::thread::Builder::new()
        .name("http-stream".into())
        .spawn(move || {
            let mut out = request.into_writer();
            let header = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {}\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n",
                stream.content_type
            );
            if out.write_all(header.as_bytes()).and_then(|()| out.flush()).is_err() || head {
                return;
            }
            if let Err(e) = (stream.write)(&mut out) {
                tracing::debug!("http: stream ended: {e}");
            }
        });
    if let Err(e) = spawned {
        // The request went with the closure: the client sees the connection close.
        tracing::warn!("http: cannot start a stream thread: {e}");
    }
}

/// `/metrics` in Prometheus' text format.
pub fn serve_metrics(host: &str, port: u16) -> anyhow::Result<SocketAddr> {
    serve("metrics", host, port, |path, _| {
        (path == "/metrics").then(|| Reply {
            status: 200,
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            body: crate::telemetry::metrics::global().encode(),
        })
    })
}

/// `/liveness` and `/readiness`: 200 or 503 with a line saying why.
pub fn serve_health(host: &str, port: u16, health: Arc<Health>) -> anyhow::Result<SocketAddr> {
    serve_health_with(host, port, health, |_, _| None)
}

/// [`serve_health_with`] plus the streams `streams` answers (`GET /flows/stream`).
pub fn serve_health_streaming(
    host: &str,
    port: u16,
    health: Arc<Health>,
    extra: impl Fn(&str, &str) -> Option<Reply> + Send + 'static,
    streams: Box<StreamRoute>,
) -> anyhow::Result<SocketAddr> {
    serve_streams(
        "health",
        host,
        port,
        move |path, query| {
            let (ok, why) = match path {
                "/liveness" => health.answer(Probe::Liveness),
                "/readiness" => health.answer(Probe::Readiness),
                _ => return extra(path, query),
            };
            Some(Reply::text(if ok { 200 } else { 503 }, why))
        },
        streams,
    )
}

/// [`serve_health`] plus the paths `extra` answers (the flows API, `traffic::flow_log`).
pub fn serve_health_with(
    host: &str,
    port: u16,
    health: Arc<Health>,
    extra: impl Fn(&str, &str) -> Option<Reply> + Send + 'static,
) -> anyhow::Result<SocketAddr> {
    serve_health_streaming(host, port, health, extra, Box::new(|_, _| None))
}
