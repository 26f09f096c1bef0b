//! Re-running the current test binary as a child process, under the same runner cargo used.

use std::process::Command;

/// This test binary as a command. When cargo ran it through a runner
/// (`CARGO_TARGET_<TRIPLE>_RUNNER`, e.g. `qemu-aarch64 -L /usr/aarch64-linux-gnu` for a cross
/// build under user emulation, where the binary cannot be executed directly), the child goes
/// through the same runner.
pub fn self_command() -> Command {
    let exe = std::env::current_exe().expect("current_exe");
    let var = format!("CARGO_TARGET_{}_UNKNOWN_LINUX_GNU_RUNNER", std::env::consts::ARCH.to_uppercase());
    let runner = std::env::var(&var).ok().filter(|r| !r.trim().is_empty());
    match runner {
        Some(runner) => {
            let mut words = runner.split_whitespace();
            let mut cmd = Command::new(words.next().expect("a non-empty runner"));
            cmd.args(words).arg(exe);
            cmd
        }
        None => Command::new(exe),
    }
}
