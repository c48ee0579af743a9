//! The dashboard's charts and job pages in a real headless Chromium (the helpers of
//! `dashboard.rs`): a published burst shows on the overview's throughput chart; a dead letter
//! searched by its id opens its job page, with HTML in its payload, header and errors shown as
//! text and its two retries before it died in its history, and is requeued from there; a huge, a non-UTF-8 and an HTML payload render safely on their job
//! pages; a job list pages; an unknown id is a "not found" page; and on every page, nothing is
//! refused by the CSP, logged as an error in the console, or fetched from elsewhere.

use crate::harness;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use fantoccini::{Client, Locator};
use harness::{Env, WAIT, bounded, on, wait_until};
use ruststream::prelude::*;

use fred::prelude::Value;

use super::dashboard::{
    BROWSER_WAIT, Chromedriver, Order, Orders, click, element, goto, http, serve_beside, text_of,
    wait_for_done,
};

on!([standalone, cluster] multi_thread: charts_search_and_the_job_page_in_chromium);

/// The app on `{shop}` (reliable), writing its history every 200 ms, and its dashboard.
async fn start(env: &Env, orders: &Orders) -> (ruststream::RunningApp, SocketAddr) {
    let handler = orders.clone();
    let broker = env.broker_with(|b| b.history_interval(Duration::from_millis(200)));
    let app = RustStream::new(AppInfo::new("shop", "2.3.4"))
        .shutdown_timeout(Duration::from_secs(1))
        .with_broker(broker, move |b| {
            b.include(subscriber(RedisList::new("{shop}").reliable(), handler).build());
        });
    serve_beside(env, app, None).await
}

async fn charts_search_and_the_job_page_in_chromium(env: &Env) {
    let Some(driver) = Chromedriver::start() else {
        return;
    };
    let orders = Orders::default();
    let (running, addr) = start(env, &orders).await;
    let publisher = env.broker().publisher();
    for _ in 0..25 {
        publisher
            .message(&Order { poison: false })
            .to("{shop}")
            .publish()
            .await
            .expect("publish");
    }
    let browser = driver.browser().await;
    goto(&browser, &format!("http://{addr}/")).await;
    let title = browser.title().await.expect("a title");
    assert!(title.contains("shop"), "{title}");
    wait_until("the burst shows on the chart", BROWSER_WAIT, async || {
        let _ = browser.refresh().await;
        let total = element(&browser, "#all-throughput")
            .await
            .attr("data-total")
            .await
            .ok()
            .flatten();
        total.as_deref() == Some("25")
    })
    .await;
    let lines = browser
        .find_all(Locator::Css("#all-throughput polyline"))
        .await
        .expect("the chart's lines");
    assert!(!lines.is_empty(), "the chart draws the burst");
    nothing_refused(&driver, &browser, addr).await;

    // A dead letter with HTML in its payload and a header, found by its id, that failed twice
    // (with HTML in its errors) before it was dropped.
    orders.broken.store(true, Ordering::SeqCst);
    orders.declines.store(2, Ordering::SeqCst);
    publisher
        .message(&Order { poison: true })
        .to("{shop}")
        .id("poisoned-<b>order</b>")
        .header("tenant", "<img src=x onerror=alert(1)>")
        .publish()
        .await
        .expect("publish");
    wait_until("the order is dead-lettered", WAIT, async || {
        env.llen("{shop}.dead").await == 1
    })
    .await;
    element(&browser, "#search input[name=q]")
        .await
        .send_keys("poisoned-<b>order</b>")
        .await
        .expect("type the id");
    click(&browser, "#search button").await;
    let reason = text_of(&browser, "#reason").await;
    assert!(reason.contains("dropped"), "{reason}");
    let history = text_of(&browser, "#history").await;
    let at = |what: &str| {
        history
            .find(what)
            .unwrap_or_else(|| panic!("{what} in {history}"))
    };
    assert!(at("published") < at("<i>card</i> declined on attempt 1"));
    assert!(at("declined on attempt 1") < at("declined on attempt 2"));
    assert!(at("declined on attempt 2") < at("dropped"));
    assert!(history.contains("not a UUIDv7"), "{history}");
    let italics = browser
        .find_all(Locator::Css("#history i"))
        .await
        .expect("a query");
    assert!(
        italics.is_empty(),
        "the errors' HTML is text, not an element"
    );
    let headers = text_of(&browser, "#headers").await;
    assert!(
        headers.contains("tenant=<img src=x onerror=alert(1)>"),
        "{headers}"
    );
    let imgs = browser
        .find_all(Locator::Css("main img"))
        .await
        .expect("a query");
    assert!(imgs.is_empty(), "the header's HTML is text, not an element");
    nothing_refused(&driver, &browser, addr).await;

    orders.broken.store(false, Ordering::SeqCst);
    click(&browser, r#"#actions form[data-op="requeue"] button"#).await;
    wait_for_done(&browser, "requeued 1").await;
    wait_until("the handler gets the requeued order", WAIT, async || {
        orders
            .handled
            .lock()
            .expect("lock")
            .contains(&(Order { poison: true }, 1))
    })
    .await;

    odd_payloads_render_safely(env, &driver, &browser, addr).await;

    // An unknown id (answered 404: the console notes the status, nothing else), and a list
    // of jobs by state.
    goto(&browser, &format!("http://{addr}/search?q=no-such-job")).await;
    let none = text_of(&browser, "#no-jobs").await;
    assert!(none.contains("No jobs"), "{none}");
    only_not_found(&driver, &browser).await;
    goto(
        &browser,
        &format!("http://{addr}/job?b=0&name=%7Bshop%7D&id=no-such-job"),
    )
    .await;
    let error = text_of(&browser, "#error").await;
    assert!(error.contains("no-such-job"), "{error}");
    only_not_found(&driver, &browser).await;
    goto(&browser, &format!("http://{addr}/jobs")).await;
    browser
        .find(Locator::Css(r##"#queues a[href*="state=dead"]"##))
        .await
        .expect("the dead jobs' link")
        .click()
        .await
        .expect("click");
    let dead = browser
        .find_all(Locator::Css("#jobs tr[data-id]"))
        .await
        .expect("the dead jobs' rows");
    let mut ids = Vec::new();
    for row in dead {
        ids.push(
            row.attr("data-id")
                .await
                .expect("an id")
                .unwrap_or_default(),
        );
    }
    assert_eq!(ids, ["huge-1", "binary-1", "html-1"], "oldest first");
    nothing_refused(&driver, &browser, addr).await;

    goto(&browser, &format!("http://{addr}/features")).await;
    let periodic = text_of(&browser, "main").await;
    assert!(periodic.contains("Periodic jobs"), "{periodic}");
    assert!(periodic.contains("Rate limits and caps"), "{periodic}");
    nothing_refused(&driver, &browser, addr).await;
    for page in [
        "/jobs?b=0&state=completed",
        "/subscription?b=0&name=%7Bshop%7D",
    ] {
        goto(&browser, &format!("http://{addr}{page}")).await;
        nothing_refused(&driver, &browser, addr).await;
    }

    // The console check sees what it looks for: a page whose CSP refuses its inline script.
    goto(
        &browser,
        "data:text/html,<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'\"><script>1</script>",
    )
    .await;
    let refused = driver.console_errors(&browser).await;
    assert!(
        refused
            .iter()
            .any(|e| e.contains("Content Security Policy")),
        "{refused:?}"
    );

    let _ = browser.close().await;
    env.stop(running).await;
}

/// Dead letters no publisher of ours writes: a 2 MB payload, one that is not UTF-8, and one with
/// HTML in its payload and a header. Each job page shows them as text, cut to a size.
async fn odd_payloads_render_safely(
    env: &Env,
    driver: &Chromedriver,
    browser: &Client,
    addr: SocketAddr,
) {
    let huge = format!(r#"{{"blob":"{}"}}"#, "x".repeat(2_000_000));
    let mut html_header = ruststream::Headers::new();
    html_header.insert("x-note".into(), "<b>bold</b>".into());
    let odd: [(&str, ruststream::Headers, &[u8]); 3] = [
        ("huge-1", ruststream::Headers::new(), huge.as_bytes()),
        (
            "binary-1",
            ruststream::Headers::new(),
            &[0xff, 0xfe, 0x00, 0x80],
        ),
        (
            "html-1",
            html_header,
            br#"{"note":"</pre><script>alert(1)</script>"}"#,
        ),
    ];
    for (id, headers, payload) in &odd {
        let frame = ruststream::redis::frame::encode_parts(id, 1, headers, payload);
        env.cmd(
            "LPUSH",
            vec![Value::from(env.key("{shop}.dead")), Value::Bytes(frame)],
        )
        .await
        .expect("LPUSH a dead letter");
    }
    let open = async |id: &str| {
        goto(browser, &format!("http://{addr}/search?q={id}")).await;
        let state = text_of(browser, "#state").await;
        assert_eq!(state, "dead", "{id}");
        text_of(browser, "#payload").await
    };
    let shown = open("huge-1").await;
    assert!(shown.contains("cut at"), "the huge payload is cut");
    assert!(shown.len() < 100_000, "{}", shown.len());
    let source = browser.source().await.expect("the page's source");
    assert!(source.len() < 200_000, "{}", source.len());
    nothing_refused(driver, browser, addr).await;

    let shown = open("binary-1").await;
    assert!(shown.contains("not UTF-8"), "{shown}");
    nothing_refused(driver, browser, addr).await;

    let shown = open("html-1").await;
    assert!(shown.contains("</pre><script>alert(1)</script>"), "{shown}");
    let headers = text_of(browser, "#headers").await;
    assert!(headers.contains("x-note=<b>bold</b>"), "{headers}");
    for tag in ["main script", "main b"] {
        let found = browser.find_all(Locator::Css(tag)).await.expect("a query");
        assert!(
            found.is_empty(),
            "{tag}: HTML in a payload or header is text"
        );
    }
    nothing_refused(driver, browser, addr).await;
}

/// The console holds nothing but the note of a page answered 404.
async fn only_not_found(driver: &Chromedriver, browser: &Client) {
    let errors = driver.console_errors(browser).await;
    assert!(
        errors.iter().all(|e| e.contains("status of 404")),
        "{errors:?}"
    );
}

/// What the page loaded came from the dashboard itself and loaded: no script element, nothing
/// fetched from another origin, every fetched resource answered 200, and nothing in the console
/// (no CSP refusal, no failed load).
async fn nothing_refused(driver: &Chromedriver, browser: &Client, addr: SocketAddr) {
    let errors = driver.console_errors(browser).await;
    assert!(errors.is_empty(), "the console: {errors:?}");
    let check = r#"
        const origin = location.origin;
        const scripts = document.querySelectorAll('script').length;
        const foreign = performance.getEntriesByType('resource')
            .filter(r => !r.name.startsWith(origin) || (r.responseStatus && r.responseStatus !== 200))
            .map(r => r.name + ' ' + r.responseStatus);
        return { scripts, foreign };
    "#;
    let seen = bounded(
        "a script run",
        BROWSER_WAIT,
        browser.execute(check, Vec::new()),
    )
    .await
    .expect("the check runs");
    assert_eq!(seen["scripts"], 0, "{seen}");
    assert_eq!(seen["foreign"], serde_json::json!([]), "{seen}");
    let icon = http(addr, "GET", "/favicon.svg", &[], "").await;
    assert!(icon.starts_with("HTTP/1.1 200"), "{icon}");
    assert!(icon.contains("image/svg+xml"), "{icon}");
}
