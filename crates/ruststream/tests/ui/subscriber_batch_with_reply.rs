use ruststream::prelude::*;

#[derive(Deserialize, Serialize, Outgoing)]
struct Job {
    image: String,
}

#[subscriber(RedisList::new("jobs"), batch = 10, reply("done"))]
async fn render(jobs: &[Job]) -> HandlerOutcome {
    let _ = jobs.len();
    HandlerOutcome::ack()
}

fn main() {}
