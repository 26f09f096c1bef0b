//! The PyTorch peer of the CPU benches (`benches/torch_peer.py`, run with the interpreter in
//! `TORCH_PYTHON`, default `python3`) and the inputs it shares with them.

use ascend::Element;

/// PyTorch's kernel on one case, in a `benches/torch_peer.py --serve` process that maps the
/// case's inputs from the same file ([`SharedInputs`]) and keeps them: each [`Peer::time`] is one
/// timing (seconds per call, best of its rounds), so ours and the peer's can alternate several
/// times per case (a shared VM's memory bandwidth drifts by half over seconds; alternating keeps
/// that from favouring either side).
pub struct Peer {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl Peer {
    /// The peer (`benches/torch_peer.py MODE`, `--serve` or `--serve-step`) of case `key` at
    /// `threads` threads on `inputs` (it maps their file), ready to time; `None` when it is turned
    /// off (the environment variable `off` is `0`) or torch cannot be imported. The first start
    /// prints its header.
    pub fn start<T: Element>(
        mode: &str,
        off: &str,
        key: &str,
        threads: usize,
        inputs: &SharedInputs<T>,
    ) -> Option<Peer> {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        static ANNOUNCED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let announce = |line: &str| {
            if !ANNOUNCED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                println!("{line}");
            }
        };
        if std::env::var(off).is_ok_and(|v| v == "0") {
            return None;
        }
        let python = std::env::var("TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/torch_peer.py");
        let spawned = Command::new(&python)
            .args([script, mode, &threads.to_string(), key])
            .arg(&inputs.path)
            .arg(inputs.x_offset.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // Import-time warnings (NumPy missing, ...); a failed import is in its header.
            .stderr(Stdio::null())
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                announce(&format!("peer: cannot run {python}: {e}"));
                return None;
            }
        };
        let (stdin, stdout) = (child.stdin.take()?, child.stdout.take()?);
        let mut stdout = std::io::BufReader::new(stdout).lines();
        for line in stdout.by_ref() {
            let line = line.ok()?;
            if line == "# ready" {
                return Some(Peer { child, stdin, stdout });
            }
            if let Some(h) = line.strip_prefix('#') {
                announce(&format!("peer ({python}):{h}"));
            }
        }
        // No "ready": torch is not importable (the peer said why in its header).
        let _ = child.wait();
        None
    }

    /// One timing of the peer: seconds per call.
    pub fn time(&mut self) -> Option<f64> {
        use std::io::Write;
        writeln!(self.stdin, "time").ok()?;
        self.stdout.next()?.ok()?.trim().parse().ok()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        // It may be mid-timing or blocked on stdin: stop it either way.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How many times ours and the peer's timings alternate per case and thread count (odd: the
/// `xtorch` column is the median of the paired ratios).
pub const ALTERNATIONS: usize = 7;

/// The median of `v` (the middle value; the mean of the middle two for an even count), `None`
/// when empty.
pub fn median(v: &mut [f64]) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    (n > 0).then(|| if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

/// Lets the other side's threads go idle before a timing (libgomp's workers spin for a while
/// after a parallel region, the pool's helpers for 100 µs).
pub fn settle() {
    std::thread::sleep(std::time::Duration::from_millis(20));
}

/// dy and x of one case in a file that this process and the peer both map shared, so both
/// kernels read the same physical pages: x starts one page after dy's last page, the distance two
/// large allocations made one after the other get from the allocator. Both matter on this VM: one
/// C read loop in one process read two copies of the same tensors at speeds 5-37% apart, and x
/// exactly 256 MiB after dy read at 18 GB/s on one thread, at 256 MiB + 4 KiB at 27.5, at
/// 256 MiB + 1012 KiB at 31.
pub struct SharedInputs<T> {
    base: *const u8,
    len: usize,
    /// Elements of dy and of x.
    n: usize,
    /// Byte offset of x in the file (dy is at 0).
    x_offset: usize,
    path: std::path::PathBuf,
    values: std::marker::PhantomData<T>,
}

impl<T: Element> SharedInputs<T> {
    pub fn new(dy: &[T], x: &[T]) -> std::io::Result<Self> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::FileExt;
        assert_eq!(dy.len(), x.len(), "dy and x have one shape");
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let shm = std::path::Path::new("/dev/shm");
        let dir = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
        let path = dir.join(format!(
            "ascend-bench-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let file = std::fs::File::options().read(true).write(true).create(true).truncate(true).open(&path)?;
        const PAGE: usize = 4096;
        let bytes = std::mem::size_of_val(dy);
        let x_offset = bytes.next_multiple_of(PAGE) + PAGE;
        let len = x_offset + bytes;
        let written = [(dy, 0), (x, x_offset)].into_iter().try_for_each(|(s, at)| {
            // SAFETY: f32, f16 and bf16 are plain values without padding: their bytes are
            // initialised and `size_of_val(s)` of them are readable at `s`.
            let b = unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) };
            file.write_all_at(b, at as u64)
        });
        // SAFETY: a fresh read-only shared mapping of `len` bytes of a file that holds them; the
        // kernel picks the address.
        let p = written.map(|()| unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0)
        });
        match p {
            Ok(p) if p != libc::MAP_FAILED => Ok(SharedInputs {
                base: p.cast::<u8>().cast_const(),
                len,
                n: dy.len(),
                x_offset,
                path,
                values: std::marker::PhantomData,
            }),
            other => {
                let e = other.err().unwrap_or_else(std::io::Error::last_os_error);
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// dy, then x.
    pub fn slices(&self) -> (&[T], &[T]) {
        // SAFETY: the mapping holds n initialised values of T at 0 and at `x_offset` (written
        // before mapping; both offsets are multiples of the page size, so aligned), read-only and
        // alive until drop; nothing writes the file meanwhile.
        unsafe {
            let at = |o: usize| std::slice::from_raw_parts(self.base.add(o).cast::<T>(), self.n);
            (at(0), at(self.x_offset))
        }
    }
}

impl<T> Drop for SharedInputs<T> {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, of that length; no slice of it outlives `self`.
        unsafe { libc::munmap(self.base.cast_mut().cast(), self.len) };
        let _ = std::fs::remove_file(&self.path);
    }
}
