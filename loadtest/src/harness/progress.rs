//! What a run shows while it runs, on stderr: one line per step, and on a terminal a status
//! line redrawn in place (scenario, round, a bar for the elapsed time, live requests/s).
//! Redirected to a file, only the step lines are written.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::stats::format_thousands;

/// How often the status line is redrawn.
pub const REDRAW: Duration = Duration::from_millis(250);
/// The live rate is taken over about this much of the latest history.
const RATE_WINDOW: Duration = Duration::from_secs(1);
const BAR_WIDTH: usize = 24;

/// Where progress goes.
pub struct Progress {
    sink: Sink,
    /// Whether a status line is on screen and must be cleared before the next step line.
    drawn: Mutex<bool>,
}

enum Sink {
    Stderr {
        live: bool,
    },
    /// Step lines are kept (for tests); status lines dropped.
    Collect(Mutex<Vec<String>>),
}

impl Progress {
    /// Steps on stderr; the live status line only when stderr is a terminal.
    pub fn stderr() -> Self {
        Self {
            sink: Sink::Stderr {
                live: std::io::stderr().is_terminal(),
            },
            drawn: Mutex::new(false),
        }
    }

    /// Keeps the step lines in memory ([`Progress::lines`]) and shows nothing.
    pub fn collect() -> Self {
        Self {
            sink: Sink::Collect(Mutex::new(Vec::new())),
            drawn: Mutex::new(false),
        }
    }

    /// Whether status lines are drawn at all.
    pub fn is_live(&self) -> bool {
        matches!(self.sink, Sink::Stderr { live: true })
    }

    /// A step: printed on a line of its own, above the status line.
    pub fn line(&self, text: &str) {
        match &self.sink {
            Sink::Stderr { live } => {
                let mut err = std::io::stderr().lock();
                if *live && self.take_drawn() {
                    let _ = write!(err, "\r\x1b[2K");
                }
                let _ = writeln!(err, "{text}");
            }
            Sink::Collect(lines) => {
                if let Ok(mut lines) = lines.lock() {
                    lines.push(text.to_owned());
                }
            }
        }
    }

    /// Replaces the status line (terminal only).
    pub fn status(&self, text: &str) {
        if !self.is_live() {
            return;
        }
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{text}");
        let _ = err.flush();
        if let Ok(mut drawn) = self.drawn.lock() {
            *drawn = true;
        }
    }

    /// Removes the status line, if one is drawn.
    pub fn clear(&self) {
        if self.is_live() && self.take_drawn() {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }

    /// The step lines so far ([`Progress::collect`] only).
    pub fn lines(&self) -> Vec<String> {
        match &self.sink {
            Sink::Collect(lines) => lines.lock().map(|l| l.clone()).unwrap_or_default(),
            Sink::Stderr { .. } => Vec::new(),
        }
    }

    fn take_drawn(&self) -> bool {
        self.drawn
            .lock()
            .map(|mut d| std::mem::replace(&mut *d, false))
            .unwrap_or(false)
    }
}

/// The live rate of a counter sampled now and then: requests per second over the latest
/// [`RATE_WINDOW`] of samples.
#[derive(Debug, Default)]
pub struct RateMeter {
    samples: std::collections::VecDeque<(Instant, u64)>,
}

impl RateMeter {
    /// Adds a sample of the running total and returns the rate, once two samples exist.
    pub fn sample(&mut self, at: Instant, total: u64) -> Option<f64> {
        self.samples.push_back((at, total));
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|(t, _)| at.duration_since(*t) >= RATE_WINDOW)
        {
            self.samples.pop_front();
        }
        let (t0, n0) = *self.samples.front()?;
        let secs = at.duration_since(t0).as_secs_f64();
        (secs > 0.0).then(|| total.saturating_sub(n0) as f64 / secs)
    }
}

/// A status line: `label [████████········] 5.1/8.0 s  31,245 req/s`.
pub fn status_line(label: &str, elapsed: Duration, total: Duration, rps: Option<f64>) -> String {
    let total_s = total.as_secs_f64();
    let done = if total_s > 0.0 {
        (elapsed.as_secs_f64() / total_s).clamp(0.0, 1.0)
    } else {
        1.0
    };
    let filled = (done * BAR_WIDTH as f64).round() as usize;
    let bar: String = "█".repeat(filled) + &"·".repeat(BAR_WIDTH - filled);
    let rate = rps.map_or(String::new(), |r| {
        format!("  {} req/s", format_thousands(r))
    });
    format!(
        "{label} [{bar}] {:.1}/{:.1} s{rate}",
        elapsed.as_secs_f64().min(total_s),
        total_s
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_line_shows_the_share_done_and_the_rate() {
        let line = status_line(
            "round 2/3 · c64 · haproxy",
            Duration::from_secs(4),
            Duration::from_secs(8),
            Some(31_245.4),
        );
        assert_eq!(
            line,
            "round 2/3 · c64 · haproxy [████████████············] 4.0/8.0 s  31,245 req/s"
        );
        let over = status_line("x", Duration::from_secs(9), Duration::from_secs(8), None);
        assert_eq!(over, format!("x [{}] 8.0/8.0 s", "█".repeat(BAR_WIDTH)));
    }

    #[test]
    fn the_rate_is_taken_over_the_latest_second() {
        let t0 = Instant::now();
        let mut meter = RateMeter::default();
        let ms = Duration::from_millis;
        assert_eq!(meter.sample(t0, 0), None);
        assert_eq!(meter.sample(t0 + ms(500), 5_000), Some(10_000.0));
        assert_eq!(meter.sample(t0 + ms(1000), 10_000), Some(10_000.0));
        // The first second is forgotten once a full second of newer samples exists.
        assert_eq!(meter.sample(t0 + ms(1500), 10_000), Some(5_000.0));
        assert_eq!(meter.sample(t0 + ms(2000), 10_000), Some(0.0));
    }

    #[test]
    fn collected_progress_keeps_steps_and_drops_status() {
        let p = Progress::collect();
        p.status("transient");
        p.line("nginx: 40,000 req/s");
        p.clear();
        assert_eq!(p.lines(), ["nginx: 40,000 req/s"]);
        assert!(!p.is_live());
    }
}
