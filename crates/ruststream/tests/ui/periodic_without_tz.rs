use ruststream::prelude::*;

#[derive(Deserialize, Serialize, Outgoing)]
struct Report {
    n: u32,
}

#[periodic("0 */5 * * * *", to = "reports")]
fn report() -> Report {
    Report { n: 1 }
}

fn main() {}
