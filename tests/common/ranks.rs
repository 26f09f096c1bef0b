//! Collectives' tests: one thread per rank.

use ascend::hccl::Communicator;
use ascend::Context;

/// Runs `f(rank, communicator, context)` on one thread per rank, the i-th communicator with the
/// i-th context, and returns each rank's result (a rank's panic fails the test).
pub fn on_ranks<T: Send>(
    comms: Vec<Communicator>,
    ctxs: &[Context],
    f: impl Fn(u32, &Communicator, &Context) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .zip(ctxs)
            .map(|(c, ctx)| {
                let f = &f;
                s.spawn(move || f(c.rank(), &c, ctx))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
    })
}
