use ruststream::prelude::*;

// A hash tag is not a field: name the key where the job is published instead.
#[derive(Deserialize, Serialize, Outgoing)]
#[outgoing(name = "{thumbnails}")]
struct ThumbnailJob {
    image: String,
}

fn main() {}
