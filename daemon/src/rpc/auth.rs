//! Who is calling: the peer's credentials on the Unix socket (read once per
//! connection, `conn`), a bearer token on TCP.
//!
//! Token rules (RFC 6750 §2.1, RFC 7235 §2.1): one `authorization` header,
//! scheme `Bearer` in any case, the token compared in constant time. Tokens
//! are at most [`MAX_TOKEN_LEN`] bytes, which the daemon checks at start-up
//! and `wpctl` before sending (a longer header would hit the HTTP/2 header
//! limit and fail without a word).

use std::sync::Arc;

use tonic::Request;

use crate::authz::Caller;
use crate::error::WpdError;
use crate::rpc::conn::PeerInfo;

/// Longest token accepted (bytes).
pub const MAX_TOKEN_LEN: usize = wpd_proto::MAX_TOKEN_LEN;

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
pub fn caller<T>(cfg: &AuthConfig, req: &Request<T>) -> Result<Caller, WpdError> {
    let peer = req.extensions().get::<PeerInfo>();
    if let Some(why) = peer.and_then(|p| p.unidentified.clone()) {
        return Err(WpdError::Degraded(why));
    }
    if let Some(caller) = peer.and_then(|p| p.caller.clone()) {
        return Ok(caller);
    }
    let values: Vec<&[u8]> = req
        .metadata()
        .get_all("authorization")
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    token_caller(cfg, &values)
}

/// The caller a request's `authorization` header values (`values`) make,
/// on a connection without a caller identity (TCP).
pub fn token_caller(cfg: &AuthConfig, values: &[&[u8]]) -> Result<Caller, WpdError> {
    let Some(token) = cfg.token.as_deref() else {
        return Err(WpdError::Unauthenticated(
            "this transport has no caller identity and no token is configured".into(),
        ));
    };
    let [header] = values else {
        let n = values.len();
        return Err(WpdError::Unauthenticated(if n == 0 {
            "missing `authorization: Bearer <token>` metadata".into()
        } else {
            format!("{n} `authorization` headers: send exactly one")
        }));
    };
    let value = std::str::from_utf8(header)
        .ok()
        .filter(|v| v.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b)))
        .ok_or_else(|| {
            WpdError::Unauthenticated("the `authorization` header is not ASCII".into())
        })?;
    let presented = value
        .split_once(' ')
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim_start_matches(' '))
        .ok_or_else(|| {
            WpdError::Unauthenticated("the `authorization` header must be `Bearer <token>`".into())
        })?;
    if constant_time_eq(presented.as_bytes(), token.as_bytes()) {
        Ok(Caller::privileged())
    } else {
        Err(WpdError::Unauthenticated("invalid token".into()))
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

    fn with_headers(values: &[&str]) -> Request<()> {
        let mut r = Request::new(());
        for v in values {
            r.metadata_mut().append("authorization", v.parse().unwrap());
        }
        r
    }

    fn refused(r: Result<Caller, WpdError>, why: &str) {
        match r {
            Err(WpdError::Unauthenticated(m)) => assert!(m.contains(why), "{m:?} lacks {why:?}"),
            other => panic!("expected Unauthenticated({why:?}), got {other:?}"),
        }
    }

    #[test]
    fn tokens() {
        for ok in [
            "Bearer s3cret",
            "bearer s3cret",
            "BEARER s3cret",
            "Bearer  s3cret",
        ] {
            assert!(
                caller(&cfg(), &with_headers(&[ok])).unwrap().privileged,
                "{ok}"
            );
        }
        refused(
            caller(&cfg(), &with_headers(&["Bearer s3creT"])),
            "invalid token",
        );
        refused(caller(&cfg(), &with_headers(&["s3cret"])), "Bearer <token>");
        refused(
            caller(&cfg(), &with_headers(&["Basic s3cret"])),
            "Bearer <token>",
        );
        refused(caller(&cfg(), &Request::new(())), "missing");
        refused(
            caller(&cfg(), &with_headers(&["Bearer s3cret", "Bearer s3cret"])),
            "2 `authorization` headers",
        );
        refused(
            caller(&AuthConfig::default(), &with_headers(&["Bearer x"])),
            "no token is configured",
        );
    }

    #[test]
    fn constant_time_compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
