//! Every job findable: a list queue's jobs by state a page at a time, found by id and by a
//! header, through the operator library and the `job` command words.

use std::process::ExitCode;
use std::time::Duration;

use ruststream::Mount;
use ruststream::operate::run_args;
use ruststream::prelude::*;
use ruststream::redis::operate::JobState;

use crate::harness;
use harness::{Env, on};

use super::{Poisonable, job, operator_of};

on!([standalone, cluster] queued_jobs_page_and_are_found_by_id_and_header,);

async fn queued_jobs_page_and_are_found_by_id_and_header(env: &Env) {
    let handler = Poisonable::default();
    let mount = move |b: &mut Mount<RedisBroker>| {
        b.include(
            subscriber(
                RedisList::new("{paged}")
                    .reliable()
                    .block(Duration::from_millis(200)),
                handler.clone(),
            )
            .build(),
        );
    };
    let app = || env.app(mount.clone());
    let op = operator_of(&app()).await;
    let publisher = env.broker().publisher();
    for n in 0..120 {
        let tenant = if n == 77 { "acme" } else { "globex" };
        publisher
            .message(&job(n, false))
            .to("{paged}")
            .id(format!("job-{n}"))
            .header("tenant", tenant)
            .publish()
            .await
            .expect("publish");
    }

    let first = op
        .jobs("{paged}", JobState::Queued, 0, 50)
        .await
        .expect("a page");
    assert_eq!(first.total, 120);
    assert_eq!(first.jobs.len(), 50);
    assert_eq!(first.jobs[0].id, "job-0", "oldest first");
    assert_eq!(first.jobs[49].id, "job-49");
    let last = op
        .jobs("{paged}", JobState::Queued, 100, 50)
        .await
        .expect("a page");
    assert_eq!(last.jobs.len(), 20);
    assert_eq!(last.jobs[19].id, "job-119");
    let running = op
        .jobs("{paged}", JobState::Running, 0, 50)
        .await
        .expect("none");
    assert_eq!((running.total, running.jobs.len()), (0, 0));

    let found = op.find_job("job-7").await.expect("a search");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].state, JobState::Queued);
    assert_eq!(found[0].payload["n"], 7);
    let by_header = op.find_by_header("tenant", "acme").await.expect("a search");
    assert_eq!(
        by_header.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(),
        ["job-77"]
    );

    let code = |words: Vec<&'static str>| async move { run_args(app(), words).await };
    assert_eq!(
        code(vec!["job", "list", "queued", "--limit", "3"]).await,
        ExitCode::SUCCESS
    );
    assert_eq!(
        code(vec!["job", "show", "job-7", "--json"]).await,
        ExitCode::SUCCESS
    );
    assert_eq!(
        code(vec!["job", "show", "no-such-job"]).await,
        ExitCode::from(3)
    );
    assert_eq!(
        code(vec!["job", "list", "finished"]).await,
        ExitCode::from(2)
    );
}
