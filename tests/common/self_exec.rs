//! Re-running the current test binary as a child process, under the same runner cargo used.
#![allow(dead_code)]

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

/// Starts this binary's test `test` alone (`--exact`, output captured) with `envs` set: the
/// child side of a test whose ranks or scenarios are processes.
pub fn spawn_self(test: &str, envs: &[(&str, String)]) -> std::process::Child {
    use std::process::Stdio;
    let mut cmd = self_command();
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"]).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn the test binary")
}

/// Asserts that a child from [`spawn_self`] succeeded and ran its one test.
#[track_caller]
pub fn expect_success(what: &str, out: &std::process::Output) {
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The parent side of a test that runs in a child process (for its own environment): unless the
/// variable `role` already holds `value`, re-runs this binary's test `test` with it set, asserts
/// that it succeeded, and returns `false`; in the child it returns `true` (go on with the test).
pub fn run_as_child(test: &str, role: &str, value: &str) -> bool {
    if std::env::var(role).as_deref() == Ok(value) {
        return true;
    }
    let out = spawn_self(test, &[(role, value.to_string())]).wait_with_output().expect("wait for the child");
    expect_success(&format!("{test} in a child process"), &out);
    false
}
