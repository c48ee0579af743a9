use ruststream::prelude::*;

#[derive(Deserialize, Serialize, Outgoing)]
struct Job {
    image: String,
}

fn jobs() -> RedisList {
    RedisList::new("jobs").reliable()
}

#[subscriber(jobs())]
async fn render(job: &Job) -> HandlerOutcome {
    let _ = &job.image;
    HandlerOutcome::ack()
}

fn main() {}
