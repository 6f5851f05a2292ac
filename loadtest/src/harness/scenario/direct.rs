//! The baseline: load straight at the echo backend.

use super::{ScenarioEnv, StartError, Target};

pub(super) async fn start(env: &ScenarioEnv<'_>) -> Result<Target, StartError> {
    Ok(Target {
        addr: env.echo_addr,
        host: super::LOAD_HOST.to_owned(),
        server: None,
        helpers: Vec::new(),
        edge: None,
    })
}
