use ruststream::prelude::*;

#[derive(Deserialize, Serialize, Outgoing)]
struct Report {
    n: u32,
}

// Five fields: cron without seconds.
#[periodic("*/5 * * * *", tz = "UTC", to = "reports")]
fn report() -> Report {
    Report { n: 1 }
}

fn main() {}
