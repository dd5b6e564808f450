//! `/metrics` over TLS, with felix's settings: `FELIX_PROMETHEUSMETRICSCERTFILE` and
//! `FELIX_PROMETHEUSMETRICSKEYFILE` (PEM) turn it on, `FELIX_PROMETHEUSMETRICSCAFILE` makes
//! the server require a client certificate signed by one of those CAs (mutual TLS, as felix
//! does with it). The metrics carry pod and policy names, which is why a cluster may want them
//! behind TLS on a host-network port.
//!
//! Guarantees: never plain text when TLS is asked for (a certificate or key that cannot be
//! read stops the start, like a port in use: the agent has touched nothing yet); the files
//! are re-read when they change (cert-manager and kubelet rotate them in place), checked at
//! each new connection by their modification times; a rotation caught half-written (a key
//! that does not match the certificate) keeps the pair in use and says so once.
//!
//! Built on rustls with the ring provider, tokio-rustls and hyper's HTTP/1 server, all
//! already in the agent for the API client: tiny_http, which serves the plain endpoints
//! (telemetry/http.rs), takes no TLS stream of ours. The server gets a thread and a
//! single-threaded runtime of its own, so a slow scraper holds up nothing of the agent.

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

/// A client that connects and says nothing is dropped after this long.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The files of the TLS metrics server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// Client certificates are required and checked against these CAs when set.
    pub ca_file: Option<PathBuf>,
}

impl MetricsTls {
    /// From the three settings as given (empty: unset). `None`: plain HTTP. A key without a
    /// certificate, or a CA file without both, is an error: half a TLS setting must not
    /// serve plain text.
    pub fn from_settings(cert: &str, key: &str, ca: &str) -> anyhow::Result<Option<MetricsTls>> {
        let (cert, key, ca) = (cert.trim(), key.trim(), ca.trim());
        match (cert.is_empty(), key.is_empty()) {
            (true, true) if ca.is_empty() => Ok(None),
            (true, true) => bail!(
                "FELIX_PROMETHEUSMETRICSCAFILE is set without FELIX_PROMETHEUSMETRICSCERTFILE and FELIX_PROMETHEUSMETRICSKEYFILE: client certificates need the metrics server on TLS"
            ),
            (false, false) => Ok(Some(MetricsTls {
                cert_file: cert.into(),
                key_file: key.into(),
                ca_file: (!ca.is_empty()).then(|| ca.into()),
            })),
            (false, true) => {
                bail!("FELIX_PROMETHEUSMETRICSCERTFILE is set without FELIX_PROMETHEUSMETRICSKEYFILE")
            }
            (true, false) => {
                bail!("FELIX_PROMETHEUSMETRICSKEYFILE is set without FELIX_PROMETHEUSMETRICSCERTFILE")
            }
        }
    }

    fn files(&self) -> impl Iterator<Item = &Path> {
        [
            Some(&self.cert_file),
            Some(&self.key_file),
            self.ca_file.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(PathBuf::as_path)
    }

    /// The files' modification times: a change means a rotation to load.
    fn stamp(&self) -> Vec<Option<SystemTime>> {
        self.files()
            .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
            .collect()
    }
}

fn certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("{}", path.display()))?;
    if certs.is_empty() {
        bail!("{}: no PEM certificate in it", path.display());
    }
    Ok(certs)
}

/// The server's rustls configuration from the files as they are now.
fn load(tls: &MetricsTls) -> anyhow::Result<Arc<ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = certificates(&tls.cert_file)?;
    let key = PrivateKeyDer::from_pem_file(&tls.key_file)
        .with_context(|| format!("{}", tls.key_file.display()))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match &tls.ca_file {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(ca)? {
                roots
                    .add(cert)
                    .with_context(|| format!("{}: not a CA certificate", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                .build()
                .with_context(|| format!("{}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .with_context(|| format!("{} and {}", tls.cert_file.display(), tls.key_file.display()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The configuration in use and the file times it was loaded at.
struct Loaded {
    stamp: Vec<Option<SystemTime>>,
    config: Arc<ServerConfig>,
}

impl Loaded {
    /// Loads the files again when they changed since the last look; a failed load keeps the
    /// configuration in use (and is logged once per change).
    fn refresh(&mut self, tls: &MetricsTls) {
        let now = tls.stamp();
        if now == self.stamp {
            return;
        }
        self.stamp = now;
        match load(tls) {
            Ok(config) => {
                tracing::info!("metrics: TLS certificate and key re-read");
                self.config = config;
            }
            Err(e) => tracing::warn!(
                "metrics: the TLS files changed but cannot be used ({e:#}); serving with the ones read before"
            ),
        }
    }
}

/// Binds `host:port` and serves `/metrics` over TLS from a thread of its own. Returns the
/// bound address (port 0 picks a free one). Fails when the address cannot be bound or the
/// files cannot be used.
pub fn serve_metrics_tls(host: &str, port: u16, tls: MetricsTls) -> anyhow::Result<SocketAddr> {
    let config = load(&tls).context("metrics TLS")?;
    let addr = (host, port)
        .to_socket_addrs()
        .with_context(|| format!("metrics: {host}:{port}"))?
        .next()
        .ok_or_else(|| anyhow!("metrics: {host}:{port} resolves to nothing"))?;
    let listener =
        TcpListener::bind(addr).with_context(|| format!("metrics: cannot bind {addr}"))?;
    let bound = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("metrics TLS: runtime")?;
    let clients = match &tls.ca_file {
        Some(ca) => format!("client certificates of {} required", ca.display()),
        None => "no client certificate asked for".to_string(),
    };
    std::thread::Builder::new()
        .name("metrics-tls".into())
        .spawn(move || runtime.block_on(accept(listener, tls, config)))
        .context("metrics TLS: thread")?;
    tracing::info!("metrics on https://{bound}/metrics ({clients})");
    Ok(bound)
}

async fn accept(listener: TcpListener, tls: MetricsTls, config: Arc<ServerConfig>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("metrics TLS: cannot listen: {e}");
            return;
        }
    };
    let mut loaded = Loaded {
        stamp: tls.stamp(),
        config,
    };
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                // Out of descriptors and the like: pause instead of spinning.
                tracing::warn!("metrics TLS: accept: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        loaded.refresh(&tls);
        let acceptor = tokio_rustls::TlsAcceptor::from(loaded.config.clone());
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::debug!("metrics TLS: handshake with {peer} refused: {e}");
                    return;
                }
                Err(_) => return,
            };
            let service = hyper::service::service_fn(answer);
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!("metrics TLS: connection with {peer}: {e}");
            }
        });
    }
}

async fn answer(
    request: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, content_type, body) = match (request.method(), request.uri().path()) {
        (&Method::GET | &Method::HEAD, "/metrics") => (
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            crate::telemetry::metrics::global().encode(),
        ),
        (&Method::GET | &Method::HEAD, _) => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found\n".to_string(),
        ),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "only GET and HEAD\n".to_string(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    Ok(response)
}
