//! The gRPC latency histogram's tower layer: [`RpcLayer`] times every
//! request on the tonic server from its headers to the end of its response
//! (an event stream's whole life) and records it by service, method and
//! the status its trailers (or headers) name.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use super::Metrics;

/// The canonical name of the status a `grpc-status` header carries.
fn grpc_status(headers: &http::HeaderMap) -> Option<&'static str> {
    headers
        .get("grpc-status")
        .map(|v| wpd_proto::code_name(tonic::Code::from_bytes(v.as_bytes())))
}

/// Tower layer timing every gRPC request into `wpd_rpc_duration_seconds`
/// (a pass-through without metrics).
#[derive(Debug, Clone)]
pub struct RpcLayer(Option<Arc<Metrics>>);

impl RpcLayer {
    /// Records into `metrics`, if any.
    pub fn new(metrics: Option<Arc<Metrics>>) -> Self {
        RpcLayer(metrics)
    }
}

impl<S> tower::Layer<S> for RpcLayer {
    type Service = Rpc<S>;

    fn layer(&self, inner: S) -> Rpc<S> {
        Rpc {
            inner,
            metrics: self.0.clone(),
        }
    }
}

/// The service of [`RpcLayer`].
#[derive(Debug, Clone)]
pub struct Rpc<S> {
    inner: S,
    metrics: Option<Arc<Metrics>>,
}

impl<S, B, RB> tower::Service<http::Request<B>> for Rpc<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    RB: http_body::Body + Send + 'static,
{
    type Response = http::Response<TimedBody<RB>>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let timer = self.metrics.as_ref().map(|m| Timer {
            labels: Some(m.method_labels(req.uri().path())),
            metrics: m.clone(),
            start: Instant::now(),
            code: None,
        });
        let fut = self.inner.call(req);
        Box::pin(async move {
            let mut timer = timer;
            let resp = match fut.await {
                Ok(r) => r,
                Err(e) => {
                    if let Some(t) = &mut timer {
                        t.finish(Some("UNKNOWN"));
                    }
                    return Err(e);
                }
            };
            if let Some(t) = &mut timer {
                // A trailers-only response (most errors) carries its status
                // in the headers.
                t.code = grpc_status(resp.headers());
            }
            Ok(resp.map(|body| TimedBody {
                body: Box::pin(body),
                timer,
            }))
        })
    }
}

/// One request being timed.
#[derive(Debug)]
struct Timer {
    metrics: Arc<Metrics>,
    labels: Option<(String, String)>,
    start: Instant,
    /// The status, once known.
    code: Option<&'static str>,
}

impl Timer {
    /// Records the request once; `code` overrides what the headers said.
    fn finish(&mut self, code: Option<&'static str>) {
        if let Some(labels) = self.labels.take() {
            let code = code.or(self.code).unwrap_or("UNKNOWN");
            self.metrics.observe_rpc(labels, code, self.start.elapsed());
        }
    }
}

impl Drop for Timer {
    /// A response dropped before its end: the client went away.
    fn drop(&mut self) {
        self.finish(Some(self.code.unwrap_or("CANCELLED")));
    }
}

/// A response body that records its request when it ends (its trailers
/// name the status).
#[derive(Debug)]
pub struct TimedBody<B> {
    body: Pin<Box<B>>,
    timer: Option<Timer>,
}

impl<B: http_body::Body> http_body::Body for TimedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let r = self.body.as_mut().poll_frame(cx);
        if let Some(t) = &mut self.timer {
            match &r {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(trailers) = frame.trailers_ref() {
                        t.finish(grpc_status(trailers));
                    }
                }
                Poll::Ready(Some(Err(_))) => t.finish(Some("INTERNAL")),
                Poll::Ready(None) => t.finish(None),
                Poll::Pending => {}
            }
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::grpc_status;

    #[test]
    fn statuses_are_named_as_grpc_spells_them() {
        let mut h = http::HeaderMap::new();
        assert_eq!(grpc_status(&h), None);
        for (v, name) in [
            ("0", "OK"),
            ("5", "NOT_FOUND"),
            ("16", "UNAUTHENTICATED"),
            ("99", "UNKNOWN"),
            ("x", "UNKNOWN"),
        ] {
            h.insert("grpc-status", http::HeaderValue::from_static(v));
            assert_eq!(grpc_status(&h), Some(name), "{v}");
        }
    }
}
