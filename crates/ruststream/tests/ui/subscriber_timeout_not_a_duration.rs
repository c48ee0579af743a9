use ruststream::prelude::*;

#[derive(Deserialize, Serialize, Outgoing)]
struct Job {
    image: String,
}

#[subscriber(RedisList::new("jobs").reliable(), timeout = "30s")]
async fn render(job: &Job) -> HandlerOutcome {
    let _ = &job.image;
    HandlerOutcome::ack()
}

fn main() {}
