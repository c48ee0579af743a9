use ruststream::prelude::*;

#[derive(Deserialize, Serialize, Outgoing)]
struct Envelope<T> {
    body: T,
}

fn main() {}
