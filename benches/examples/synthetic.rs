//! Prints the benchmarks' synthetic config document of N rules (default 10,000) as JSON, e.g.
//! for `cftunnel-loadtest --memory-config`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = match std::env::args().nth(1) {
        Some(arg) => arg
            .parse()
            .map_err(|e| format!("rule count {arg:?}: {e}"))?,
        None => 10_000,
    };
    println!("{}", serde_json::to_string(&cftunnel_benches::config(n))?);
    Ok(())
}
