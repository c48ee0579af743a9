use ruststream::prelude::*;

#[derive(Deserialize, Serialize, Outgoing)]
#[outgoing(topic = "uploads")]
struct Upload {
    image: String,
}

fn main() {}
