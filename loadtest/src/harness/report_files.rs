//! The files a run leaves beside its table: the results file (JSON, [`Results`]) and its
//! chart (SVG, drawn by [`chart::render_svg`]).

use std::path::{Path, PathBuf};

use super::chart::{self, ChartError};
use super::results::Results;

/// Writes `<dir>/<stem>.json` and `<dir>/<stem>.svg` (the chart), creating `dir`.
pub fn write(results: &Results, dir: &Path, stem: &str) -> Result<ReportFiles, WriteError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| WriteError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let json = dir.join(format!("{stem}.json"));
    let svg = dir.join(format!("{stem}.svg"));
    let text = serde_json::to_string_pretty(results).map_err(WriteError::Encode)?;
    std::fs::write(&json, text + "\n").map_err(io(&json))?;
    std::fs::write(&svg, chart::render_svg(results)?).map_err(io(&svg))?;
    Ok(ReportFiles { json, svg })
}

/// Where a report was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportFiles {
    pub json: PathBuf,
    pub svg: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("writing {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("encoding the results: {0}")]
    Encode(serde_json::Error),
    #[error("drawing the chart: {0}")]
    Chart(#[from] ChartError),
}
