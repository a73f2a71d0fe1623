//! The tower layers of the connection: [`ActiveLayer`] marks a connection
//! busy while a request or a stream is in flight; [`AuthLayer`] admits a
//! TCP connection into its caller's budget at its first request bearing
//! the token (see the module's docs).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::{ActiveGuard, ConnLimits, PeerInfo};

/// Marks every request in flight on its connection (so that a connection
/// with a request or an event stream open is never idle): a tower layer
/// around every service, whose guard lives as long as the response body.
#[derive(Debug, Clone, Copy, Default)]
pub struct ActiveLayer;

impl<S> tower::Layer<S> for ActiveLayer {
    type Service = Active<S>;

    fn layer(&self, inner: S) -> Active<S> {
        Active(inner)
    }
}

/// The service of [`ActiveLayer`].
#[derive(Debug, Clone)]
pub struct Active<S>(S);

impl<S, B, RB> tower::Service<http::Request<B>> for Active<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    RB: http_body::Body + Send + 'static,
{
    type Response = http::Response<ActiveBody<RB>>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let guard = req.extensions().get::<PeerInfo>().map(|p| p.conn.busy());
        let fut = self.0.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            Ok(resp.map(|body| ActiveBody {
                body: Box::pin(body),
                _guard: guard,
            }))
        })
    }
}

/// A response body that keeps its connection marked busy until it ends.
#[derive(Debug)]
pub struct ActiveBody<B> {
    body: Pin<Box<B>>,
    _guard: Option<ActiveGuard>,
}

impl<B: http_body::Body> http_body::Body for ActiveBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        self.body.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The one request a connection without a caller identity may send without
/// the token: the unary health check.
const UNAUTHENTICATED_OK: &str = "/grpc.health.v1.Health/Check";

/// Authenticates TCP connections at their first request (see the module's
/// docs): a request on a connection without a caller identity must bear
/// the token, whatever the service (health watch and reflection included;
/// the unary health check excepted); without it the answer is
/// `UNAUTHENTICATED` and nothing runs. Its first request with the token
/// moves the connection out of the pending budget.
#[derive(Debug, Clone)]
pub struct AuthLayer {
    cfg: Arc<crate::rpc::auth::AuthConfig>,
    per_caller: usize,
}

impl AuthLayer {
    /// The layer for the daemon's token and TCP connection limit.
    pub fn new(cfg: crate::rpc::auth::AuthConfig, limits: &ConnLimits) -> Self {
        AuthLayer {
            cfg: Arc::new(cfg),
            per_caller: limits.per_caller,
        }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Auth<S> {
        Auth {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`AuthLayer`].
#[derive(Debug, Clone)]
pub struct Auth<S> {
    inner: S,
    layer: AuthLayer,
}

impl<S, B, RB> tower::Service<http::Request<B>> for Auth<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    RB: Default + Send + 'static,
{
    type Response = http::Response<RB>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if let Some(peer) = req.extensions().get::<PeerInfo>()
            && peer.caller.is_none()
            && req.uri().path() != UNAUTHENTICATED_OK
        {
            let values: Vec<&[u8]> = req
                .headers()
                .get_all(http::header::AUTHORIZATION)
                .iter()
                .map(|v| v.as_bytes())
                .collect();
            let refused = match crate::rpc::auth::token_caller(&self.layer.cfg, &values) {
                Ok(_) => peer
                    .conn
                    .authenticate(self.layer.per_caller)
                    .err()
                    .map(|what| crate::error::WpdError::LimitReached {
                        what,
                        limit: self.layer.per_caller,
                        hint: "TCP connections with the token are all taken; close one \
                               (--max-connections-per-caller raises the limit)",
                    }),
                Err(e) => Some(e),
            };
            if let Some(e) = refused {
                let status: tonic::Status = e.into();
                return Box::pin(async move { Ok(status.into_http()) });
            }
        }
        Box::pin(self.inner.call(req))
    }
}
