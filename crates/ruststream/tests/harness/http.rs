//! A GET over HTTP/1 with hyper-util's client, for the servers a test starts (the metrics
//! server): the status and the body as text, within the harness's bounded wait.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::{WAIT, bounded};

/// GETs `url` (`http://host:port/path`): its status code and body.
pub async fn get(url: &str) -> (u16, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let uri = url.parse().expect("a valid URL");
    bounded(&format!("GET {url}"), WAIT, async {
        let response = client.get(uri).await.expect("the server answers");
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("the whole body")
            .to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    })
    .await
}
