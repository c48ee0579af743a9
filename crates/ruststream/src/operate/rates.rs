//! Handled and failed messages per second per subscription, read off a running service's
//! Prometheus endpoint (`run --metrics-addr`): `inspect --metrics-url URL` scrapes it twice,
//! [`WINDOW`] apart, and takes the difference of `ruststream_handled_total{subscription,outcome}`.
//! Every instance serves its own endpoint; summing instances is Prometheus's job.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::Uri;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::Rates;
use crate::{Error, ErrorKind, Result};

/// How far apart the two scrapes are.
pub const WINDOW: Duration = Duration::from_secs(1);

/// How long one scrape may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Subscription → rates, from two scrapes of the Prometheus text at `url`.
pub async fn sample(url: &str) -> Result<HashMap<String, Rates>> {
    let before = totals(&scrape(url).await?);
    tokio::time::sleep(WINDOW).await;
    let after = totals(&scrape(url).await?);
    let secs = WINDOW.as_secs_f64();
    Ok(after
        .into_iter()
        .map(|(sub, (ok, failed))| {
            let (ok0, failed0) = before.get(&sub).copied().unwrap_or_default();
            let rates = Rates {
                handled_per_s: (ok - ok0).max(0.0) / secs,
                failed_per_s: (failed - failed0).max(0.0) / secs,
            };
            (sub, rates)
        })
        .collect())
}

async fn scrape(url: &str) -> Result<String> {
    let uri: Uri = url.parse().map_err(|e| {
        crate::ConfigError::new(
            "--metrics-url",
            format!("not a URL ({e})"),
            "give the service's metrics endpoint, e.g. http://127.0.0.1:9000/metrics",
        )
        .on(url)
    })?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let read = async {
        let response = client
            .get(uri)
            .await
            .map_err(|e| format!("cannot reach {url}: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("{url} answered {}", response.status()));
        }
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("cannot read {url}: {e}"))?
            .to_bytes();
        Ok(String::from_utf8_lossy(&body).into_owned())
    };
    match tokio::time::timeout(TIMEOUT, read).await {
        Ok(r) => r.map_err(|e| Error::broker(ErrorKind::Connection, e)),
        Err(_) => Err(Error::broker(
            ErrorKind::Timeout,
            format!("{url} did not answer within {TIMEOUT:?}"),
        )),
    }
}

/// Subscription → (acknowledged, not acknowledged) totals in a Prometheus text exposition.
fn totals(text: &str) -> HashMap<String, (f64, f64)> {
    let mut out: HashMap<String, (f64, f64)> = HashMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("ruststream_handled_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once('}') else {
            continue;
        };
        let (Some(sub), Some(outcome), Ok(n)) = (
            label(labels, "subscription"),
            label(labels, "outcome"),
            value.trim().parse::<f64>(),
        ) else {
            continue;
        };
        let entry = out.entry(sub.to_owned()).or_default();
        if outcome == "ack" {
            entry.0 += n;
        } else {
            entry.1 += n;
        }
    }
    out
}

/// The value of `name="..."` in a label set (our label values hold no quotes).
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
    let len = labels[start..].find('"')?;
    Some(&labels[start..start + len])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_split_acks_from_the_rest() {
        let text = "# TYPE ruststream_handled_total counter\n\
            ruststream_handled_total{subscription=\"{jobs}\",outcome=\"ack\"} 10\n\
            ruststream_handled_total{outcome=\"retry\",subscription=\"{jobs}\"} 3\n\
            ruststream_handled_total{subscription=\"{jobs}\",outcome=\"dead\"} 1\n\
            ruststream_handled_total{subscription=\"other\",outcome=\"ack\"} 2\n\
            ruststream_in_flight{subscription=\"{jobs}\"} 4\n";
        let t = totals(text);
        assert_eq!(t["{jobs}"], (10.0, 4.0));
        assert_eq!(t["other"], (2.0, 0.0));
        assert_eq!(t.len(), 2);
    }
}
