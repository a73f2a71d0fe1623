//! The metrics endpoint: a small HTTP/1 server (hyper) answering
//! `GET /metrics` (and `HEAD`), one scrape at a time, in the Prometheus
//! text format or OpenMetrics when the scraper asks for it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use super::{Metrics, Snapshot};
use crate::authz::Caller;
use crate::rpc::Api;

/// Connections the metrics server serves at once; more are closed at
/// accept.
const MAX_CONNECTIONS: usize = 32;

/// Longest a client may take to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// What answers scrapes: the families and where their figures come from.
#[derive(Debug)]
struct Exporter {
    metrics: Arc<Metrics>,
    service: Api,
    /// One scrape at a time: each reads the listings once.
    scraping: tokio::sync::Mutex<()>,
}

impl Exporter {
    async fn render(&self, openmetrics: bool) -> Result<String, String> {
        let _one = self.scraping.lock().await;
        let failed = |e: tokio::task::JoinError| format!("scrape task failed: {e}");
        let core = self.service.service().core().clone();
        // The watchpoints' counts before the daemon-wide ones: every
        // watchpoint's hits are then at most `wpd_hits_total`.
        let mut snap = tokio::task::spawn_blocking(move || Snapshot::read_core(&core))
            .await
            .map_err(failed)?;
        snap.stats = self
            .service
            .stats(Caller::privileged())
            .await
            .map_err(|s| s.message().to_string())?;
        let metrics = self.metrics.clone();
        tokio::task::spawn_blocking(move || {
            metrics.fill(&snap);
            metrics.encode(openmetrics)
        })
        .await
        .map_err(failed)
    }

    async fn respond<B>(&self, req: http::Request<B>) -> http::Response<String> {
        let reply = |status: http::StatusCode, text: String| {
            let mut r = http::Response::new(text);
            *r.status_mut() = status;
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            r
        };
        if req.uri().path() != "/metrics" {
            return reply(
                http::StatusCode::NOT_FOUND,
                "wpd serves its metrics at /metrics\n".into(),
            );
        }
        let head = req.method() == http::Method::HEAD;
        if req.method() != http::Method::GET && !head {
            let mut r = reply(
                http::StatusCode::METHOD_NOT_ALLOWED,
                "GET /metrics\n".into(),
            );
            r.headers_mut().insert(
                http::header::ALLOW,
                http::HeaderValue::from_static("GET, HEAD"),
            );
            return r;
        }
        let openmetrics = wants_openmetrics(req.headers());
        match self.render(openmetrics).await {
            Ok(text) => {
                let mut r = http::Response::new(if head { String::new() } else { text });
                r.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static(if openmetrics {
                        OPENMETRICS_CONTENT_TYPE
                    } else {
                        prometheus_client::encoding::prometheus_text::CONTENT_TYPE
                    }),
                );
                r
            }
            Err(e) => reply(http::StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
        }
    }
}

/// The OpenMetrics text format's media type.
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// True when the scraper accepts OpenMetrics (Prometheus asks for it
/// first); everyone else gets the Prometheus text format.
fn wants_openmetrics(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|part| {
            let mut params = part.split(';').map(str::trim);
            params.next() == Some("application/openmetrics-text")
                && !params.any(|p| p.replace(' ', "") == "q=0")
        })
}

/// Binds `addr` and serves `GET /metrics` there until the runtime ends;
/// returns the address bound (`:0` picks a port).
pub async fn listen(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    service: Api,
) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics address {addr}"))?;
    let local = listener.local_addr()?;
    let exporter = Arc::new(Exporter {
        metrics,
        service,
        scraping: tokio::sync::Mutex::new(()),
    });
    tokio::spawn(accept_loop(listener, exporter));
    Ok(local)
}

async fn accept_loop(listener: tokio::net::TcpListener, exporter: Arc<Exporter>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of fds, most likely: let connections close first.
                tracing::warn!("metrics: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let exporter = exporter.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let exporter = exporter.clone();
                async move { Ok::<_, Infallible>(exporter.respond(req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            if let Err(e) = conn.await {
                tracing::debug!("metrics connection: {e}");
            }
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_only_when_asked() {
        let mut h = http::HeaderMap::new();
        assert!(!wants_openmetrics(&h));
        h.insert(
            http::header::ACCEPT,
            http::HeaderValue::from_static(
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                 version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
            ),
        );
        assert!(wants_openmetrics(&h));
        h.insert(
            http::header::ACCEPT,
            http::HeaderValue::from_static("text/plain, application/openmetrics-text; q=0"),
        );
        assert!(!wants_openmetrics(&h));
    }
}
