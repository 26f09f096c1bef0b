//! The CPU engine honours `HCCL_CONNECT_TIMEOUT`: a rank that never arrives ends in
//! HCCL_E_TIMEOUT (9), never a hang — when joining and in a collective. (A binary of its own: the
//! variable is set once, before any communicator is made.)

use std::time::{Duration, Instant};

use ascend::hccl::{Communicator, ReduceOp, RootInfo};
use ascend::{Context, DType, Tensor};

#[test]
fn missing_ranks_time_out() {
    std::env::set_var("HCCL_CONNECT_TIMEOUT", "1"); // whole seconds, 1..=7200
                                                    // Joining: 2 ranks expected, 1 comes.
    let root = RootInfo::new(&Context::cpu()).unwrap();
    let start = Instant::now();
    let err = Communicator::init_rank(&Context::cpu(), 2, &root, 0).unwrap_err();
    assert_eq!(err.hccl_result(), Some(9), "{err}");
    assert!(err.to_string().contains("[1]"), "names the missing rank: {err}");
    assert!(start.elapsed() < Duration::from_secs(5));

    // A collective only one of two ranks issues.
    let comms = Communicator::init_all(&[Context::cpu(), Context::cpu()]).unwrap();
    let s = Context::cpu().new_stream().unwrap();
    let mut t = Tensor::zeros(&s, DType::F32, &[4]).unwrap();
    let start = Instant::now();
    let err = comms[0].all_reduce(&s, &mut t, ReduceOp::Sum).unwrap_err();
    assert_eq!(err.hccl_result(), Some(9), "{err}");
    assert!(start.elapsed() < Duration::from_secs(5));
    // The group is broken from then on: the late rank fails at once.
    let err = comms[1].all_reduce(&s, &mut t, ReduceOp::Sum).unwrap_err();
    assert_eq!(err.hccl_result(), Some(9), "{err}");
}
