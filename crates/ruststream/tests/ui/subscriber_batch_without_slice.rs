use ruststream::prelude::*;

#[derive(Deserialize, Serialize, Outgoing)]
struct Job {
    image: String,
}

#[subscriber(RedisList::new("jobs"), batch = 10)]
async fn render(job: &Job) -> HandlerOutcome {
    let _ = &job.image;
    HandlerOutcome::ack()
}

fn main() {}
