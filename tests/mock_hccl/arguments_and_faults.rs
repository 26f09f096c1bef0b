//! Arguments HCCL rejects, rendezvous misuse and faults at each HCCL call.

use super::*;

#[test]
fn bad_arguments_are_rejected_as_hccl_does() {
    let mut s = Session::new();
    let comms = init_all(2);
    let r = Rank::new(0);
    let c = comms[0];
    let buf = r.malloc(64);
    let st = r.stream;
    let nul = ptr::null_mut();
    // count 0 succeeds first, whatever the rest; nothing is queued
    assert_eq!(all_reduce(nul, nul, 0, Dt::F32, SUM, Comm(nul), nul), SUCCESS);
    assert_eq!(mock::live_events_and_queued_tasks().1, 0);
    // null pointers
    assert_eq!(all_reduce(buf, buf, 4, Dt::F32, SUM, Comm(nul), st), E_PTR);
    assert_eq!(all_reduce(nul, buf, 4, Dt::F32, SUM, c, st), E_PTR);
    assert_eq!(all_reduce(buf, nul, 4, Dt::F32, SUM, c, st), E_PTR);
    assert_eq!(all_reduce(buf, buf, 4, Dt::F32, SUM, c, nul), E_PTR, "HCCL rejects the default stream");
    assert_eq!(all_gather(buf, nul, 4, Dt::F32, c, st), E_PTR);
    assert_eq!(broadcast(nul, 4, Dt::F32, 0, c, st), E_PTR);
    // dtypes and ops (Atlas A2 table)
    // SAFETY: the mock validates the arguments before using them.
    let raw_reduce =
        |dt: u32, op: u32| unsafe { hccl().HcclAllReduce(buf, buf, 4, HcclDataType(dt), HcclReduceOp(op), c.0, st).0 };
    assert_eq!(raw_reduce(HcclDataType::HCCL_DATA_TYPE_FP64.0, 0), E_NOT_SUPPORT);
    assert_eq!(raw_reduce(HcclDataType::HCCL_DATA_TYPE_UINT8.0, 0), E_NOT_SUPPORT);
    assert_eq!(raw_reduce(HcclDataType::HCCL_DATA_TYPE_BFP16.0, PROD.0), E_NOT_SUPPORT);
    assert_eq!(raw_reduce(HcclDataType::HCCL_DATA_TYPE_INT16.0, PROD.0), E_NOT_SUPPORT);
    assert_eq!(raw_reduce(HcclDataType::HCCL_DATA_TYPE_FP32.0, 4), E_NOT_SUPPORT);
    assert_eq!(raw_reduce(99, 0), E_NOT_SUPPORT);
    // SAFETY: as above.
    let gather_dt = |dt: u32| unsafe { hccl().HcclAllGather(buf, buf, 1, HcclDataType(dt), c.0, st).0 };
    assert_eq!(gather_dt(HcclDataType::HCCL_DATA_TYPE_INT128.0), E_NOT_SUPPORT);
    assert_eq!(broadcast(buf, 4, Dt::F32, 2, c, st), E_PARA, "root outside the group");
    assert_eq!(all_reduce(buf, buf, 0x8_0000_0000, Dt::I8, SUM, c, st), E_PARA, "count above HCCL's maximum");
    s.expect_violations(0, &[]);
    assert_eq!(mock::live_events_and_queued_tasks().1, 0);

    // buffers outside live allocations, misaligned: violations
    assert_eq!(all_reduce(buf, buf, 17, Dt::F32, SUM, c, st), E_PARA);
    assert!(err_text().contains("not inside one live device allocation"));
    assert_eq!(all_gather(buf, buf, 9, Dt::F32, c, st), E_PARA, "recv must hold size x send");
    let host = [0u8; 64];
    assert_eq!(all_reduce(host.as_ptr() as *mut c_void, buf, 4, Dt::F32, SUM, c, st), E_PARA);
    let odd = (buf as usize + 2) as *mut c_void;
    assert_eq!(all_reduce(odd, odd, 4, Dt::F32, SUM, c, st), E_PARA);
    assert!(err_text().contains("aligned"));
    s.expect_violations(4, &["not aligned", "recvBuf"]);
    // the calling thread's device is not the communicator's; memory of another device
    assert_eq!(all_reduce(buf, buf, 4, Dt::F32, SUM, comms[1], st), E_PARA);
    s.expect_violations(1, &["belongs to device 1"]);
    let elsewhere = std::thread::spawn(|| Rank::new(1).malloc(16) as usize).join().unwrap() as *mut c_void;
    assert_eq!(all_reduce(elsewhere, buf, 4, Dt::F32, SUM, c, st), E_PARA);
    s.expect_violations(1, &["memory of device 1"]);
    r.free(elsewhere);
    assert_eq!(mock::live_events_and_queued_tasks().1, 0);

    // communicator arguments
    let mut size = 0;
    // SAFETY: the mock validates the arguments before using them.
    unsafe {
        assert_eq!(hccl().HcclGetRankSize(c.0, ptr::null_mut()).0, E_PTR);
        assert_eq!(hccl().HcclGetRankSize(nul, &mut size).0, E_PTR);
        assert_eq!(hccl().HcclGetRankId(0x1234 as HcclComm, &mut size).0, E_PARA);
    }
    assert_eq!(destroy(Comm(nul)), SUCCESS, "HcclCommDestroy(NULL) succeeds");
    s.expect_violations(1, &["not a communicator"]);

    // a communicator with a queued collective cannot be destroyed: synchronize first
    assert_eq!(all_reduce(buf, buf, 4, Dt::F32, SUM, c, st), SUCCESS);
    assert_eq!(destroy(c), E_AGAIN);
    s.expect_violations(1, &["queued"]);
    assert_eq!(mock::stats().live_comms, s.base.live_comms + 2, "still alive");
    assert_eq!(destroy(comms[1]), SUCCESS);
    assert_eq!(r.sync(), TASK_FAILED, "its peer is gone");
    assert_eq!(destroy(c), SUCCESS);
    assert_eq!(destroy(c), E_PARA, "destroyed twice");
    assert_eq!(all_reduce(buf, buf, 4, Dt::F32, SUM, c, st), E_PARA);
    s.expect_violations(2, &["already destroyed"]);

    // init arguments
    let ri = root_info();
    assert_eq!(init_rank(0, &ri, 0).0, E_PARA, "nRanks 0");
    assert_eq!(init_rank(2, &ri, 2).0, E_PARA, "rank >= nRanks");
    let mut out = nul;
    // SAFETY: null pointers are what is checked.
    unsafe {
        assert_eq!(hccl().HcclCommInitRootInfo(1, ptr::null(), 0, &mut out).0, E_PTR);
        assert_eq!(hccl().HcclCommInitRootInfo(1, &ri, 0, ptr::null_mut()).0, E_PTR);
        assert_eq!(hccl().HcclGetRootInfo(ptr::null_mut()).0, E_PTR);
    }
    s.expect_violations(0, &[]);
    // SAFETY: a zeroed root info is a valid value (and not one HcclGetRootInfo made).
    let zeros: HcclRootInfo = unsafe { std::mem::zeroed() };
    assert_eq!(init_rank(1, &zeros, 0).0, E_PARA);
    s.expect_violations(1, &["not one HcclGetRootInfo made"]);
    let mut devices = [0, 1, 0];
    let mut made = [nul; 3];
    // SAFETY: both arrays hold 3 elements.
    unsafe {
        assert_eq!(hccl().HcclCommInitAll(3, devices.as_mut_ptr(), made.as_mut_ptr()).0, E_PARA, "duplicate device");
        assert_eq!(hccl().HcclCommInitAll(0, devices.as_mut_ptr(), made.as_mut_ptr()).0, E_PARA);
        assert_eq!(hccl().HcclCommInitAll(1, ptr::null_mut(), made.as_mut_ptr()).0, E_PTR);
    }
    r.free(buf);
    drop(r);

    // HcclGetRootInfo needs a device on the calling thread
    std::thread::spawn(|| {
        let mut ri: HcclRootInfo = unsafe { std::mem::zeroed() };
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { hccl().HcclGetRootInfo(&mut ri).0 }, E_RUNTIME);
    })
    .join()
    .unwrap();
    s.expect_violations(1, &["aclrtSetDevice"]);
    s.expect_clean();
}

/// A rank joined twice, ranks disagreeing on nRanks: HCCL_E_PARA for every rank of the attempt
/// (one violation, for the offender), never a hang; a join of a group that completed, too.
#[test]
fn rendezvous_misuse_fails_fast() {
    let mut s = Session::new();
    let main = Rank::new(0);
    for (what, a, b) in [("twice", (2, 0), (2, 0)), ("nRanks", (2, 0), (3, 1))] {
        let ri = root_info();
        let start = Instant::now();
        let sts: Vec<u32> = std::thread::scope(|sc| {
            [a, b]
                .into_iter()
                .enumerate()
                .map(|(i, (n, rank))| {
                    let ri = &ri;
                    sc.spawn(move || {
                        let _r = Rank::new(i as u32);
                        init_rank(n, ri, rank).0
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect()
        });
        assert_eq!(sts, [E_PARA, E_PARA], "{what}");
        assert!(start.elapsed() < Duration::from_secs(3), "{what}: no wait for the timeout");
        s.expect_violations(1, &[if what == "twice" { "joined twice" } else { "passed nRanks" }]);
    }
    let ri = root_info();
    let (st, c) = init_rank(1, &ri, 0);
    assert_eq!(st, SUCCESS);
    assert_eq!(init_rank(1, &ri, 0).0, E_PARA, "the group is complete");
    s.expect_violations(1, &["joined already"]);
    assert_eq!(destroy(c), SUCCESS);
    s.expect_clean_after(main);
}

#[test]
fn faults_at_each_hccl_call_fail_cleanly() {
    let mut s = Session::new();
    let main = Rank::new(0);
    let ri = root_info();
    let nul = ptr::null_mut();
    mock::fail_next_on_this_thread("HcclGetRootInfo", 7);
    // SAFETY: a valid out-pointer.
    let mut tmp: HcclRootInfo = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { hccl().HcclGetRootInfo(&mut tmp).0 }, 7);
    mock::fail_next_on_this_thread("HcclCommInitRootInfo", 7);
    assert_eq!(init_rank(1, &ri, 0), (7, Comm(nul)));
    assert_eq!(mock::stats().live_comms, s.base.live_comms);
    mock::fail_next_on_this_thread("HcclCommInitAll", 7);
    let mut devices = [0, 1];
    let mut made = [nul; 2];
    // SAFETY: both arrays hold 2 elements.
    assert_eq!(unsafe { hccl().HcclCommInitAll(2, devices.as_mut_ptr(), made.as_mut_ptr()).0 }, 7);
    // a rank of HcclCommInitAll that fails (its aclrtSetDevice): the others give up at once,
    // the ones made are destroyed, HCCL_E_INTERNAL
    mock::fail_next("aclrtSetDevice", 107001);
    let mut devices = [0, 1, 2, 3];
    let mut made = [nul; 4];
    let start = Instant::now();
    // SAFETY: both arrays hold 4 elements.
    assert_eq!(unsafe { hccl().HcclCommInitAll(4, devices.as_mut_ptr(), made.as_mut_ptr()).0 }, E_INTERNAL);
    assert!(err_text().contains("aclrtSetDevice"));
    assert!(start.elapsed() < Duration::from_secs(3), "the other ranks do not wait for the timeout");
    assert_eq!(made, [nul; 4]);
    assert_eq!(mock::stats().live_comms, s.base.live_comms);

    let (st, c) = init_rank(1, &ri, 0);
    assert_eq!(st, SUCCESS);
    let buf = main.malloc(16);
    for api in ["HcclAllReduce", "HcclAllGather", "HcclBroadcast"] {
        mock::fail_next_on_this_thread(api, 4);
        let got = match api {
            "HcclAllReduce" => all_reduce(buf, buf, 4, Dt::F32, SUM, c, main.stream),
            "HcclAllGather" => all_gather(buf, buf, 4, Dt::F32, c, main.stream),
            _ => broadcast(buf, 4, Dt::F32, 0, c, main.stream),
        };
        assert_eq!(got, 4, "{api}");
        assert_eq!(mock::live_events_and_queued_tasks().1, 0, "{api} queued nothing");
    }
    let mut v = 99;
    mock::fail_next_on_this_thread("HcclGetRankSize", 7);
    // SAFETY: valid arguments.
    unsafe {
        assert_eq!(hccl().HcclGetRankSize(c.0, &mut v).0, 7);
        mock::fail_next_on_this_thread("HcclGetRankId", 7);
        assert_eq!(hccl().HcclGetRankId(c.0, &mut v).0, 7);
        assert_eq!(v, 99, "untouched");
        mock::fail_next("HcclGetErrorString", 0);
        assert!(hccl().HcclGetErrorString(ascend_sys::HcclResult(9)).is_null());
        let name = CStr::from_ptr(hccl().HcclGetErrorString(ascend_sys::HcclResult(9)));
        assert_eq!(name.to_str().unwrap(), "HCCL_E_TIMEOUT");
    }
    mock::fail_next_on_this_thread("HcclCommDestroy", 7);
    assert_eq!(destroy(c), 7);
    assert_eq!(mock::stats().live_comms, s.base.live_comms + 1, "a failed destroy leaves it alive");
    assert_eq!(destroy(c), SUCCESS);
    main.free(buf);
    s.expect_clean_after(main);
}
