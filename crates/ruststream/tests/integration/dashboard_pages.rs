//! The dashboard's charts and job pages in a real headless Chromium (the helpers of
//! `dashboard.rs`): a published burst shows on the overview's throughput chart; a dead letter
//! searched by its id opens its job page, with HTML in its payload and header shown as text, and
//! is requeued from there; a job list pages; an unknown id is a "not found" page; and nothing the
//! pages load is refused or fetched from elsewhere.

use crate::harness;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use fantoccini::{Client, Locator};
use harness::{Env, WAIT, bounded, on, wait_until};
use ruststream::prelude::*;

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
    nothing_refused(&browser, addr).await;

    // A dead letter with HTML in its payload and a header, found by its id.
    orders.broken.store(true, Ordering::SeqCst);
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
    nothing_refused(&browser, addr).await;

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

    // An unknown id, and a list of jobs by state.
    goto(&browser, &format!("http://{addr}/search?q=no-such-job")).await;
    let none = text_of(&browser, "#no-jobs").await;
    assert!(none.contains("No jobs"), "{none}");
    goto(
        &browser,
        &format!("http://{addr}/job?b=0&name=%7Bshop%7D&id=no-such-job"),
    )
    .await;
    let error = text_of(&browser, "#error").await;
    assert!(error.contains("no-such-job"), "{error}");
    goto(&browser, &format!("http://{addr}/jobs")).await;
    browser
        .find(Locator::Css(r##"#queues a[href*="state=dead"]"##))
        .await
        .expect("the dead jobs' link")
        .click()
        .await
        .expect("click");
    let empty = text_of(&browser, "#no-jobs").await;
    assert!(empty.contains("No jobs"), "{empty}");
    nothing_refused(&browser, addr).await;

    goto(&browser, &format!("http://{addr}/features")).await;
    let periodic = text_of(&browser, "main").await;
    assert!(periodic.contains("Periodic jobs"), "{periodic}");
    nothing_refused(&browser, addr).await;

    let _ = browser.close().await;
    env.stop(running).await;
}

/// What the page loaded came from the dashboard itself and loaded: no script element, nothing
/// fetched from another origin, every fetched resource answered 200.
async fn nothing_refused(browser: &Client, addr: SocketAddr) {
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
