//! What the examples share.

/// Runs an example's `run`; an error is printed in its `Display` form (which lists, e.g., every
/// path tried for a missing CANN) and the process exits with status 1.
pub fn main(run: impl FnOnce() -> ascend::Result<()>) {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
