//! The web dashboard (`ruststream::dashboard`) on the standalone server and the cluster, driven
//! by a real headless Chromium through chromedriver (Debian's `chromium` and `chromium-driver`,
//! which scripts/test installs): a poisoned message dead-letters, the operator sees it on the
//! dashboard, fixes the handler and requeues it, and the handler gets it with attempt 1; another is
//! purged; the
//! pause and resume buttons set and clear the pause key; a delayed entry is promoted (and
//! handled) and another cancelled. A plain HTTP client checks the guards:
//! a POST without the CSRF token or from another origin is refused, a foreign `Host` is refused,
//! a token protects the pages, and a non-loopback address without a token does not start.
//!
//! `RUSTSTREAM_DASHBOARD_SCREENSHOT=docs/dashboard.png` saves the browser's view of the
//! subscription page (the standalone run) there.

use crate::harness;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use harness::{Env, WAIT, bounded, on, wait_until};
use ruststream::IntoHandlerResult;
use ruststream::dashboard::Dashboard;
use ruststream::prelude::*;

on!([standalone, cluster] multi_thread: the_operator_requeues_a_fixed_dead_letter_in_chromium);
on!([standalone, cluster] multi_thread: changes_need_the_csrf_token_and_the_same_origin);

/// How long Chromium may take to start, or a page to show, on a loaded 2-core machine.
pub(crate) const BROWSER_WAIT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Order {
    pub(crate) poison: bool,
}

outgoing!(Order);

/// Drops poisoned orders (they dead-letter) while `broken`, after failing the first `declines`
/// deliveries with an error (HTML in it) and a retry 10 ms later; records what it handles.
#[derive(Clone, Default)]
pub(crate) struct Orders {
    pub(crate) broken: Arc<AtomicBool>,
    pub(crate) declines: Arc<AtomicU32>,
    pub(crate) handled: Arc<Mutex<Vec<(Order, u32)>>>,
}

impl Handle<Order> for Orders {
    async fn handle(
        &self,
        order: &Order,
        _outs: &(),
        ctx: &mut Context<'_>,
    ) -> Result<(), HandlerOutcome> {
        if order.poison && self.broken.load(Ordering::SeqCst) {
            let declined = self
                .declines
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            if declined.is_err() {
                return Err(HandlerOutcome::drop());
            }
            // An error as a `#[subscriber]` function returns it: its text is the retry's reason.
            let failed: Result<(), String> =
                Err(format!("<i>card</i> declined on attempt {}", ctx.attempt()));
            return failed
                .into_handler_result()
                .map_err(|_| HandlerOutcome::retry_after(Duration::from_millis(10)));
        }
        self.handled
            .lock()
            .expect("lock")
            .push((order.clone(), ctx.attempt()));
        Ok(())
    }
}

/// The app on `{orders}` (reliable) with its dashboard beside it on a free loopback port.
async fn start_with_dashboard(
    env: &Env,
    orders: &Orders,
    token: Option<&str>,
) -> (ruststream::RunningApp, SocketAddr) {
    let handler = orders.clone();
    let app = env.app(move |b| {
        b.include(subscriber(RedisList::new("{orders}").reliable(), handler).build());
    });
    serve_beside(env, app, token).await
}

/// Starts `app` with its dashboard beside it on a free loopback port.
pub(crate) async fn serve_beside(
    env: &Env,
    app: RustStream,
    token: Option<&str>,
) -> (ruststream::RunningApp, SocketAddr) {
    let loopback = "127.0.0.1:0".parse().expect("an address");
    let dashboard = Dashboard::bind(&app, loopback, token.map(str::to_owned))
        .await
        .expect("the dashboard binds");
    let addr = dashboard.local_addr().expect("its address");
    let running = env.start(app).await;
    dashboard.spawn_beside(&running);
    (running, addr)
}

async fn the_operator_requeues_a_fixed_dead_letter_in_chromium(env: &Env) {
    let Some(driver) = Chromedriver::start() else {
        return;
    };
    let orders = Orders::default();
    orders.broken.store(true, Ordering::SeqCst);
    let (running, addr) = start_with_dashboard(env, &orders, None).await;
    let publisher = env.broker().publisher();
    publisher
        .message(&Order { poison: true })
        .to("{orders}")
        .id("poisoned-order")
        .publish()
        .await
        .expect("publish");
    publisher
        .message(&Order { poison: false })
        .to("{orders}")
        .id("later-order")
        .delay(Duration::from_secs(3600))
        .publish()
        .await
        .expect("publish a delayed order");
    wait_until("the poisoned order is dead-lettered", WAIT, async || {
        env.llen("{orders}.dead").await == 1
    })
    .await;

    let browser = driver.browser().await;
    goto(&browser, &format!("http://{addr}/")).await;
    browser
        .find(Locator::LinkText("{orders}"))
        .await
        .expect("the overview lists {orders}")
        .click()
        .await
        .expect("click");
    let row = r#"#dead tr[data-id="poisoned-order"]"#;
    let text = text_of(&browser, row).await;
    assert!(text.contains(r#""poison": true"#), "{text}");
    assert!(text.contains("dropped"), "{text}");
    if let Ok(path) = std::env::var("RUSTSTREAM_DASHBOARD_SCREENSHOT")
        && !env.is_cluster()
    {
        let png = browser.screenshot().await.expect("a screenshot");
        std::fs::write(&path, png).expect("write the screenshot");
    }

    orders.broken.store(false, Ordering::SeqCst);
    click(
        &browser,
        r#"form[data-op="requeue"][data-id="poisoned-order"] button"#,
    )
    .await;
    wait_for_done(&browser, "requeued 1").await;
    wait_until("the handler gets the requeued order", WAIT, async || {
        orders
            .handled
            .lock()
            .expect("lock")
            .contains(&(Order { poison: true }, 1))
    })
    .await;
    assert_eq!(env.llen("{orders}.dead").await, 0);

    // Another poisoned order, purged from the page: it is gone, not handled.
    orders.broken.store(true, Ordering::SeqCst);
    publisher
        .message(&Order { poison: true })
        .to("{orders}")
        .id("purged-order")
        .publish()
        .await
        .expect("publish");
    wait_until(
        "the second poisoned order is dead-lettered",
        WAIT,
        async || env.llen("{orders}.dead").await == 1,
    )
    .await;
    browser.refresh().await.expect("reload the page");
    click(
        &browser,
        r#"form[data-op="purge"][data-id="purged-order"] button"#,
    )
    .await;
    wait_for_done(&browser, "purged 1").await;
    assert_eq!(env.llen("{orders}.dead").await, 0);
    orders.broken.store(false, Ordering::SeqCst);

    click(&browser, r#"form[data-op="pause"] button"#).await;
    wait_for_done(&browser, "paused").await;
    assert!(env.exists("{orders}.paused").await, "the pause key is set");
    click(&browser, r#"form[data-op="resume"] button"#).await;
    wait_for_done(&browser, "resumed").await;
    assert!(
        !env.exists("{orders}.paused").await,
        "the pause key is gone"
    );

    // The delayed entries: promote one (it is handled now), cancel another (it is gone).
    click(
        &browser,
        r#"form[data-op="promote"][data-id="later-order"] button"#,
    )
    .await;
    wait_for_done(&browser, "promoted 1").await;
    wait_until("the handler gets the promoted order", WAIT, async || {
        orders
            .handled
            .lock()
            .expect("lock")
            .contains(&(Order { poison: false }, 1))
    })
    .await;
    delay_an_order(&publisher, "cancelled-order").await;
    browser.refresh().await.expect("reload the page");
    click(
        &browser,
        r#"form[data-op="cancel"][data-id="cancelled-order"] button"#,
    )
    .await;
    wait_for_done(&browser, "cancelled 1").await;
    assert_eq!(env.zcard("{orders}.delayed").await, 0);
    assert_eq!(env.hlen("{orders}.delayed.payloads").await, 0);

    // Cancel one message by id (`cancel SUB --id ID`): a delayed one is removed.
    delay_an_order(&publisher, "by-id-order").await;
    browser.refresh().await.expect("reload the page");
    element(&browser, r#"#cancel-message input[name="id"]"#)
        .await
        .send_keys("by-id-order")
        .await
        .expect("type the id");
    click(&browser, "#cancel-message button").await;
    wait_for_done(&browser, "cancel `by-id-order`: removed").await;
    assert_eq!(env.zcard("{orders}.delayed").await, 0, "removed");

    let _ = browser.close().await;
    env.stop(running).await;
}

async fn changes_need_the_csrf_token_and_the_same_origin(env: &Env) {
    let any = "0.0.0.0:0".parse().expect("an address");
    let err = Dashboard::bind(&env.app(|_| {}), any, None)
        .await
        .expect_err("no token on a non-loopback address");
    let config = harness::config_error(&err);
    assert_eq!(config.option, "--token", "{err}");
    assert_eq!(config.subject.as_deref(), Some("0.0.0.0:0"), "{err}");

    let orders = Orders::default();
    let (running, addr) = start_with_dashboard(env, &orders, None).await;
    let host = addr.to_string();
    let page = http(addr, "GET", "/", &[], "").await;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    let csrf = page
        .split(r#"name="csrf" value=""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a CSRF token in the page")
        .to_owned();
    let pause = |csrf: &str| format!("csrf={csrf}&b=0&name=%7Borders%7D&op=pause");

    let refused = http(
        addr,
        "POST",
        "/action",
        &[],
        "b=0&name=%7Borders%7D&op=pause",
    )
    .await;
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    let refused = http(addr, "POST", "/action", &[], &pause("0123")).await;
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    let cross = [("Origin", "http://evil.example")];
    let refused = http(addr, "POST", "/action", &cross, &pause(&csrf)).await;
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    let rebound = [("Host", "evil.example")];
    let refused = http(addr, "GET", "/", &rebound, "").await;
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    assert!(!env.exists("{orders}.paused").await, "nothing was paused");

    let origin = format!("http://{host}");
    let same = [("Origin", origin.as_str())];
    let done = http(addr, "POST", "/action", &same, &pause(&csrf)).await;
    assert!(done.starts_with("HTTP/1.1 303"), "{done}");
    assert!(env.exists("{orders}.paused").await, "the pause key is set");
    env.stop(running).await;

    let (running, addr) = start_with_dashboard(env, &orders, Some("s3cret")).await;
    let to_login = http(addr, "GET", "/", &[], "").await;
    assert!(to_login.starts_with("HTTP/1.1 303"), "{to_login}");
    assert!(to_login.contains("location: /login"), "{to_login}");
    let wrong = http(addr, "POST", "/login", &[], "token=guess").await;
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
    let bearer = [("Authorization", "Bearer s3cret")];
    assert!(
        http(addr, "GET", "/", &bearer, "")
            .await
            .starts_with("HTTP/1.1 200")
    );
    let login = http(addr, "POST", "/login", &[], "token=s3cret").await;
    let cookie = login
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .expect("a session cookie")
        .to_owned();
    assert!(
        login.contains("SameSite=Strict") && login.contains("HttpOnly"),
        "{login}"
    );
    let with_cookie = [("Cookie", cookie.as_str())];
    assert!(
        http(addr, "GET", "/", &with_cookie, "")
            .await
            .starts_with("HTTP/1.1 200")
    );
    env.stop(running).await;
}

/// One HTTP/1.1 request on its own connection (`Host` is the address unless given); the whole
/// response, header names in lower case as hyper sends them.
pub(crate) async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> String {
    let mut request = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| *k == "Host") {
        request.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str(&format!(
        "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    let exchange = tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(addr).expect("connect to the dashboard");
        stream.set_read_timeout(Some(WAIT)).expect("a read timeout");
        stream.write_all(request.as_bytes()).expect("send");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("read");
        response
    });
    bounded("an HTTP exchange", WAIT, exchange)
        .await
        .expect("the request task")
}

/// Navigates and waits for the page.
/// Publishes an order `id` due in an hour.
async fn delay_an_order(publisher: &Publisher, id: &str) {
    publisher
        .message(&Order { poison: false })
        .to("{orders}")
        .id(id)
        .delay(Duration::from_secs(3600))
        .publish()
        .await
        .expect("publish a delayed order");
}

pub(crate) async fn goto(browser: &Client, url: &str) {
    bounded("a page load", BROWSER_WAIT, browser.goto(url))
        .await
        .expect("the page loads");
}

/// The element `css`, once it shows.
pub(crate) async fn element(browser: &Client, css: &str) -> fantoccini::elements::Element {
    bounded(
        css,
        BROWSER_WAIT,
        browser.wait().for_element(Locator::Css(css)),
    )
    .await
    .unwrap_or_else(|e| panic!("the element {css} shows: {e:?}"))
}

/// Clicks the element `css` (waiting for it to show).
pub(crate) async fn click(browser: &Client, css: &str) {
    element(browser, css).await.click().await.expect("click");
}

/// The text of the element `css` (waiting for it to show).
pub(crate) async fn text_of(browser: &Client, css: &str) -> String {
    element(browser, css).await.text().await.expect("its text")
}

/// Waits until the page says the last change did `what`.
pub(crate) async fn wait_for_done(browser: &Client, what: &str) {
    wait_until(
        &format!("the page says `{what}`"),
        BROWSER_WAIT,
        async || match browser.find(Locator::Css("#done")).await {
            Ok(e) => e.text().await.is_ok_and(|t| t.contains(what)),
            Err(_) => false,
        },
    )
    .await;
}

/// A chromedriver on a free loopback port, killed on drop.
pub(crate) struct Chromedriver {
    child: Child,
    port: u16,
}

impl Chromedriver {
    /// Starts chromedriver; `None`, loudly, when Chromium is not installed (under `CI`, where
    /// scripts/test installs it, a missing Chromium fails the test instead).
    pub(crate) fn start() -> Option<Self> {
        let chromium = std::path::Path::new("/usr/bin/chromium");
        let driver = std::path::Path::new("/usr/bin/chromedriver");
        if !chromium.exists() || !driver.exists() {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI: /usr/bin/chromium and /usr/bin/chromedriver are missing; scripts/test installs them"
            );
            eprintln!(
                "\n!!!!!!!!!!\nSKIPPED: the dashboard's browser test needs /usr/bin/chromium and \
                 /usr/bin/chromedriver (Debian: apt-get install chromium chromium-driver; \
                 scripts/test installs them)\n!!!!!!!!!!\n"
            );
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        Some(Self { child, port })
    }

    /// A headless Chromium session, once chromedriver answers.
    pub(crate) async fn browser(&self) -> Client {
        let url = format!("http://127.0.0.1:{}", self.port);
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                         "--disable-gpu", "--window-size=1280,900"],
            }),
        );
        // The console's messages, for `console_errors` (a CSP refusal is logged there).
        caps.insert(
            "goog:loggingPrefs".into(),
            serde_json::json!({ "browser": "ALL" }),
        );
        let mut session = None;
        wait_until(
            "chromedriver opens a Chromium session",
            BROWSER_WAIT,
            async || {
                let connector = hyper_util::client::legacy::connect::HttpConnector::new();
                match ClientBuilder::new(connector)
                    .capabilities(caps.clone())
                    .connect(&url)
                    .await
                {
                    Ok(client) => {
                        session = Some(client);
                        true
                    }
                    Err(_) => false,
                }
            },
        )
        .await;
        session.expect("a session")
    }
}

impl Chromedriver {
    /// The console's errors since the last call (chromedriver's browser log, `SEVERE` entries:
    /// a CSP refusal, a failed load, a script error), read and emptied.
    pub(crate) async fn console_errors(&self, browser: &Client) -> Vec<String> {
        let session = browser
            .session_id()
            .await
            .expect("the session's id")
            .expect("a session");
        let port = self.port;
        let request = format!(
            "POST /session/{session}/se/log HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
             Content-Type: application/json\r\nContent-Length: 18\r\n\r\n{{\"type\":\"browser\"}}"
        );
        // chromedriver keeps the connection open: the body is read to its Content-Length.
        let exchange = tokio::task::spawn_blocking(move || {
            let mut stream =
                std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to chromedriver");
            stream.set_read_timeout(Some(WAIT)).expect("a read timeout");
            stream.write_all(request.as_bytes()).expect("send");
            let mut got = Vec::new();
            let mut chunk = [0u8; 8192];
            loop {
                let n = stream.read(&mut chunk).expect("read");
                got.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&got).into_owned();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let length = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>())
                        })
                        .and_then(Result::ok);
                    if n == 0 || length.is_some_and(|len| body.len() >= len) {
                        return text;
                    }
                } else if n == 0 {
                    return text;
                }
            }
        });
        let response = bounded("chromedriver's log", WAIT, exchange)
            .await
            .expect("the log's task");
        let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
        let log: serde_json::Value = serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("chromedriver's log is JSON ({e}): {response}"));
        log["value"]
            .as_array()
            .unwrap_or_else(|| panic!("chromedriver's log: {log}"))
            .iter()
            .filter(|e| e["level"] == "SEVERE")
            .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

impl Drop for Chromedriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
