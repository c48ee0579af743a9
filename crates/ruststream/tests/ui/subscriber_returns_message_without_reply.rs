use ruststream::prelude::*;

#[derive(Deserialize, Serialize, Outgoing)]
struct Job {
    image: String,
}

#[derive(Deserialize, Serialize, Outgoing)]
struct Done {
    image: String,
}

// Returns a message but has no `reply`: nothing would publish it.
#[subscriber(RedisList::new("jobs"))]
async fn render(job: &Job) -> Done {
    Done {
        image: job.image.clone(),
    }
}

fn main() {}
