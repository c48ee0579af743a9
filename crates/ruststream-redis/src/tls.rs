//! TLS: `rediss://` URLs, and a private certificate authority.
//!
//! A `rediss://` URL makes fred connect with rustls (the `ring` provider) and the system's root
//! certificates. A server whose certificate comes from a private CA (a company CA, the test
//! stand's throwaway one) needs that CA instead: [`RedisBroker::tls_ca_file`] reads its PEM file
//! and builds a rustls client configuration trusting only the certificates in it, with the
//! app's process-wide rustls provider if it installed one, else *ring*'s. The file is
//! read when the broker connects, so a missing or malformed file is a startup error that names
//! the file. Client certificates (`--tls-auth-clients yes`) are not supported yet.
//!
//! [`RedisBroker::tls_ca_file`]: crate::RedisBroker::tls_ca_file

use std::path::Path;
use std::sync::Arc;

use fred::types::config::TlsConfig;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use ruststream_core::{ConfigError, Result};

/// A TLS configuration trusting exactly the CA certificates in the PEM file at `path`.
pub(crate) fn with_ca_file(path: &Path) -> Result<TlsConfig> {
    let shown = path.display().to_string();
    let refused = |problem: String| {
        ConfigError::new(
            "tls_ca_file",
            problem,
            "give a file that holds the CA's certificates in PEM (-----BEGIN CERTIFICATE-----)",
        )
        .on(shown.clone())
    };
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect::<std::result::Result<Vec<_>, _>>)
        .map_err(|e| refused(format!("cannot read it: {e}")))?;
    if certs.is_empty() {
        return Err(refused("it holds no PEM certificate".to_owned()).into());
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| refused(format!("it holds a certificate rustls rejects: {e}")))?;
    }
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(ring_provider()));
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| {
            ConfigError::new(
                "tls_ca_file",
                format!("TLS setup failed: {e}"),
                "install a rustls crypto provider that supports TLS 1.2 or 1.3, or none for *ring*'s",
            )
            .on(shown.clone())
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config.into())
}

/// *ring*'s provider, the one fred's TLS links with, for an app that installed no process-wide
/// provider of its own.
#[allow(
    deprecated,
    reason = "rustls 0.23.48 deprecates it for lacking post-quantum key exchange; it stays the provider fred is built with"
)]
fn ring_provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_empty_file_is_a_clear_error() {
        let e = with_ca_file(Path::new("/nonexistent/ca.pem")).unwrap_err();
        let config = e.config_error().expect("a configuration error");
        assert_eq!(config.option, "tls_ca_file");
        assert_eq!(config.subject.as_deref(), Some("/nonexistent/ca.pem"));
        assert!(config.fix.contains("PEM"), "{e}");
        let empty = std::env::temp_dir().join(format!("rs-empty-ca-{}.pem", std::process::id()));
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = with_ca_file(&empty).unwrap_err();
        std::fs::remove_file(&empty).unwrap();
        let config = e.config_error().expect("a configuration error");
        assert_eq!(config.problem, "it holds no PEM certificate", "{e}");
    }
}
