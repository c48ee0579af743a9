use ruststream::prelude::*;

#[ruststream::app]
async fn app() -> impl App {
    RustStream::new(AppInfo::new("images", "0.1.0")).with_broker(RedisBroker::from_env(), |_b| {})
}
