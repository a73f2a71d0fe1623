//! Who is calling: SO_PEERCRED on the Unix socket, a bearer token on TCP.

use std::sync::Arc;

use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Status};

use crate::authz::Caller;

/// Authentication settings.
#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    /// Token TCP callers must present as `authorization: Bearer <token>`.
    /// TCP is refused at start-up without one.
    pub token: Option<Arc<str>>,
}

/// Compares in time that depends only on the lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The caller of `req`.
pub fn caller<T>(cfg: &AuthConfig, req: &Request<T>) -> Result<Caller, Status> {
    if let Some(info) = req.extensions().get::<UdsConnectInfo>() {
        let cred = info
            .peer_cred
            .ok_or_else(|| Status::unauthenticated("no peer credentials on the Unix socket"))?;
        return Ok(Caller::from_peer(cred.uid(), cred.gid(), cred.pid()));
    }
    let Some(token) = cfg.token.as_deref() else {
        return Err(Status::unauthenticated(
            "this transport has no caller identity and no token is configured",
        ));
    };
    let presented = req
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| {
            Status::unauthenticated("missing `authorization: Bearer <token>` metadata")
        })?;
    if constant_time_eq(presented.as_bytes(), token.as_bytes()) {
        Ok(Caller::privileged())
    } else {
        Err(Status::unauthenticated("invalid token"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> AuthConfig {
        AuthConfig {
            token: Some("s3cret".into()),
        }
    }

    fn with_header(v: &str) -> Request<()> {
        let mut r = Request::new(());
        r.metadata_mut().insert("authorization", v.parse().unwrap());
        r
    }

    #[test]
    fn tokens() {
        assert!(
            caller(&cfg(), &with_header("Bearer s3cret"))
                .unwrap()
                .privileged
        );
        assert_eq!(
            caller(&cfg(), &with_header("Bearer s3creT"))
                .unwrap_err()
                .code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            caller(&cfg(), &with_header("s3cret")).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            caller(&cfg(), &Request::new(())).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            caller(&AuthConfig::default(), &with_header("Bearer x"))
                .unwrap_err()
                .code(),
            tonic::Code::Unauthenticated
        );
    }

    #[test]
    fn constant_time_compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
