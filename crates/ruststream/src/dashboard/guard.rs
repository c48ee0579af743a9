//! Who may use the dashboard and how a change must arrive: the token login (a session cookie,
//! `HttpOnly; SameSite=Strict`), the loopback host check of a dashboard without a token, the
//! same-origin check of every POST and the per-process CSRF token its form must carry.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

use super::Shared;

/// The session cookie's name.
const COOKIE: &str = "ruststream_dashboard";

/// The dashboard's secrets, made once per process.
pub(super) struct Guard {
    /// The operator's token; `None` on a loopback address without one.
    token: Option<String>,
    /// The value of the session cookie a successful login sets.
    session: String,
    /// The token every form carries and every POST is checked against.
    pub(super) csrf: String,
}

impl Guard {
    /// Checks the address against the token rule and makes the secrets.
    pub(super) fn new(addr: SocketAddr, token: Option<String>) -> crate::Result<Self> {
        let token = token.filter(|t| !t.is_empty());
        if token.is_none() && !addr.ip().is_loopback() {
            return Err(crate::ConfigError::new(
                "--token",
                "the dashboard would be reachable from other machines without a token",
                "give it one (--token TOKEN, or RUSTSTREAM_DASHBOARD_TOKEN=TOKEN), or bind it to \
                 a loopback address such as 127.0.0.1:8080",
            )
            .on(addr.to_string())
            .into());
        }
        Ok(Self {
            token,
            session: random_hex()?,
            csrf: random_hex()?,
        })
    }

    /// Whether a token protects the dashboard.
    pub(super) fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// Whether `given` is the operator's token.
    pub(super) fn token_matches(&self, given: &str) -> bool {
        self.token
            .as_deref()
            .is_some_and(|t| same(t.as_bytes(), given.as_bytes()))
    }

    /// Whether `given` is this process's CSRF token.
    pub(super) fn csrf_matches(&self, given: &str) -> bool {
        same(self.csrf.as_bytes(), given.as_bytes())
    }

    /// The `Set-Cookie` value of a successful login.
    pub(super) fn session_cookie(&self) -> String {
        format!(
            "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/",
            self.session
        )
    }

    /// Whether the request carries the session cookie or `Authorization: Bearer <token>`.
    fn authenticated(&self, headers: &HeaderMap) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if bearer.is_some_and(|b| same(b.as_bytes(), token.as_bytes())) {
            return true;
        }
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| c.trim().split_once('='))
            .any(|(k, v)| k == COOKIE && same(v.as_bytes(), self.session.as_bytes()))
    }
}

/// Every request passes here first: the host check (no token), the login (a token), the
/// same-origin check (POST); every response gets headers that keep it out of frames and caches.
pub(super) async fn check(State(shared): State<Shared>, req: Request, next: Next) -> Response {
    let guard = &shared.guard;
    let headers = req.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !guard.has_token() && !is_loopback_host(host) {
        return refuse(
            StatusCode::FORBIDDEN,
            "this dashboard has no token, so it answers loopback host names only (localhost, 127.0.0.1, [::1])",
        );
    }
    if req.method() == Method::POST && !same_origin(headers, host) {
        return refuse(
            StatusCode::FORBIDDEN,
            "cross-origin request refused: changes are accepted from the dashboard's own pages only",
        );
    }
    let login = req.uri().path() == "/login";
    if !login && !guard.authenticated(headers) {
        return if req.method() == Method::GET {
            Redirect::to("/login").into_response()
        } else {
            refuse(StatusCode::UNAUTHORIZED, "log in first: /login")
        };
    }
    let mut response = next.run(req).await;
    let h = response.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; frame-ancestors 'none'",
        ),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    response
}

/// A plain-text refusal.
pub(super) fn refuse(status: StatusCode, why: &str) -> Response {
    let mut r = Response::new(Body::from(format!("{why}\n")));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// A POST is same-origin when its `Origin` (or, lacking one, its `Referer`) names the host it
/// was sent to; a request with neither (not a browser's) passes on to the CSRF token check.
fn same_origin(headers: &HeaderMap, host: &str) -> bool {
    let source = headers
        .get(header::ORIGIN)
        .or_else(|| headers.get(header::REFERER))
        .map(|v| v.to_str().unwrap_or("null"));
    let Some(source) = source else {
        return true;
    };
    let authority = source
        .split_once("://")
        .map(|(_, rest)| rest.split('/').next().unwrap_or(""));
    authority.is_some_and(|a| !a.is_empty() && a.eq_ignore_ascii_case(host))
}

/// `localhost`, `127.x.y.z` or `[::1]`, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.split(':').next().unwrap_or(""),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Compares secrets in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// 32 bytes from the OS's random source, as hex.
fn random_hex() -> crate::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| {
        crate::Error::broker(
            crate::ErrorKind::Other,
            format!("cannot read the OS's random source for the dashboard's secrets: {e}"),
        )
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_non_loopback_address_needs_a_token() {
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let err = Guard::new(any, None).err().unwrap();
        let config = err.config_error().expect("a configuration error");
        assert_eq!(config.option, "--token");
        assert_eq!(config.subject.as_deref(), Some("0.0.0.0:8080"));
        assert!(Guard::new(any, Some(String::new())).is_err());
        assert!(Guard::new(any, Some("t".into())).is_ok());
        assert!(Guard::new("127.0.0.1:8080".parse().unwrap(), None).is_ok());
        assert!(Guard::new("[::1]:8080".parse().unwrap(), None).is_ok());
    }

    #[test]
    fn hosts_and_origins() {
        assert!(is_loopback_host("localhost:8080"));
        assert!(is_loopback_host("127.0.0.1:1"));
        assert!(is_loopback_host("[::1]:8080"));
        assert!(!is_loopback_host("evil.example:8080"));
        let mut h = HeaderMap::new();
        assert!(same_origin(&h, "127.0.0.1:8080"));
        h.insert(
            header::REFERER,
            HeaderValue::from_static("http://127.0.0.1:8080/x"),
        );
        assert!(same_origin(&h, "127.0.0.1:8080"));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(!same_origin(&h, "127.0.0.1:8080"));
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(!same_origin(&h, "127.0.0.1:8080"));
    }
}
