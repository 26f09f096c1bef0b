//! [`Communicator::from_env`](super::Communicator::from_env): the launcher's environment, and a
//! small TCP rendezvous in which rank 0 hands its root info to the other ranks.
//!
//! The protocol (std::net only; one deadline per exchange bounds every connect, read and write):
//! 1. rank 0 makes its root info, listens on `MASTER_ADDR:port` and accepts connections;
//! 2. rank r > 0 connects (retrying while rank 0 is not listening yet) and sends
//!    `MAGIC | version u32 | rank u32 | world u32 | job-id length u32 | job id` (little-endian);
//! 3. rank 0 answers `MAGIC | status u8 | message length u32 | message`, then, when the status is
//!    0, `root-info length u32 | root-info bytes`; the peer answers one byte `ACK`. A peer of
//!    another job, with a rank out of range or already served gets a non-zero status (and an
//!    error naming the problem); rank 0 keeps waiting for its own ranks;
//! 4. once every rank has its root info, all call `HcclCommInitRootInfo`.
//!
//! The job id (`MASTER_PORT`, `WORLD_SIZE` and `ASCEND_JOB_ID` or `TORCHELASTIC_RUN_ID` when set)
//! tells apart jobs that reuse an address; the root info itself is opaque bytes here.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{rank_table::RankTable, Communicator, RootInfo};
use crate::context::{Context, ContextKind};
use crate::error::{Error, Result};

const MAGIC: &[u8; 8] = b"ASCENDRZ";
const VERSION: u32 = 1;
const ACK: u8 = 0x06;
/// The longest job id or message accepted from a peer.
const TEXT_MAX: u32 = 4096;
/// The largest root info accepted (HCCL's is 4108 bytes; room for an envelope).
const ROOT_MAX: u32 = 1 << 20;
/// The most ranks accepted (HCCL's rank-table limit, `rank_count` in 1..65536).
const MAX_WORLD: u32 = super::rank_table::MAX_RANKS;
/// The default of `ASCEND_RENDEZVOUS_TIMEOUT` (seconds), HCCL's connect timeout.
const DEFAULT_TIMEOUT_S: u64 = 120;

/// What the launcher's environment says.
#[derive(Debug)]
struct Settings {
    rank: u32,
    world: u32,
    addr: String,
    port: u16,
    job: String,
    timeout: Duration,
}

fn var(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => Ok(Some(v.trim().to_string())),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(Error::Config(format!("{name} is not valid UTF-8"))),
    }
}

fn required(name: &str, why: &str) -> Result<String> {
    var(name)?.ok_or_else(|| Error::Config(format!("{name} is not set ({why})")))
}

fn number<T: std::str::FromStr>(name: &str, value: &str, what: &str) -> Result<T> {
    value.parse().map_err(|_| Error::Config(format!("{name}=`{value}` is not {what}")))
}

/// `ASCEND_RENDEZVOUS_TIMEOUT` (seconds, 1..=86400), else 120 s.
fn timeout() -> Result<Duration> {
    const NAME: &str = "ASCEND_RENDEZVOUS_TIMEOUT";
    match var(NAME)? {
        None => Ok(Duration::from_secs(DEFAULT_TIMEOUT_S)),
        Some(v) => {
            let s: u64 = number(NAME, &v, "a whole number of seconds")?;
            if !(1..=86_400).contains(&s) {
                return Err(Error::Config(format!("{NAME}={s} must be in 1..=86400 seconds")));
            }
            Ok(Duration::from_secs(s))
        }
    }
}

impl Settings {
    fn from_env() -> Result<Settings> {
        let why = "the launcher (torchrun, or your script) sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT";
        let world: u32 = number("WORLD_SIZE", &required("WORLD_SIZE", why)?, "a number of ranks")?;
        let rank: u32 = number("RANK", &required("RANK", why)?, "a rank number")?;
        if world == 0 || world > MAX_WORLD {
            return Err(Error::Config(format!(
                "WORLD_SIZE={world} must be in 1..={MAX_WORLD} (HCCL's largest rank count)"
            )));
        }
        if rank >= world {
            return Err(Error::Config(format!("RANK={rank} must be below WORLD_SIZE={world}")));
        }
        let addr = required("MASTER_ADDR", why)?;
        let master_port = required("MASTER_PORT", why)?;
        let port: u16 = number("MASTER_PORT", &master_port, "a TCP port (1..=65535)")?;
        if port == 0 {
            return Err(Error::Config("MASTER_PORT=0 is not a TCP port".into()));
        }
        // Under torchrun the elastic agent's TCPStore already listens on MASTER_PORT.
        let port = match var("ASCEND_RENDEZVOUS_PORT")? {
            Some(v) => number("ASCEND_RENDEZVOUS_PORT", &v, "a TCP port (1..=65535)")?,
            None if var("TORCHELASTIC_USE_AGENT_STORE")?.is_some_and(|v| v.eq_ignore_ascii_case("true")) => {
                port.checked_add(1).ok_or_else(|| {
                    Error::Config(
                        "MASTER_PORT=65535 leaves no port for the rendezvous: set ASCEND_RENDEZVOUS_PORT".into(),
                    )
                })?
            }
            None => port,
        };
        let run = match var("ASCEND_JOB_ID")? {
            Some(j) => j,
            None => var("TORCHELASTIC_RUN_ID")?.unwrap_or_default(),
        };
        let job = format!("port={master_port};world={world};run={run}");
        Ok(Settings { rank, world, addr, port, job, timeout: timeout()? })
    }

    fn endpoint(&self) -> String {
        format!("{}:{}", self.addr, self.port)
    }

    fn resolve(&self) -> Result<Vec<SocketAddr>> {
        // bounded: the addresses the resolver returned, a list it already holds in memory.
        #[allow(clippy::disallowed_methods)]
        let addrs: Vec<SocketAddr> = (self.addr.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| Error::Config(format!("MASTER_ADDR=`{}` does not resolve: {e}", self.addr)))?
            .collect();
        if addrs.is_empty() {
            return Err(Error::Config(format!("MASTER_ADDR=`{}` resolves to no address", self.addr)));
        }
        Ok(addrs)
    }
}

fn rendezvous_error(message: String) -> Error {
    Error::Rendezvous(message)
}

fn write_text(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// How many connections rank 0 serves at once (each on its own thread); more wait in the
/// listener's backlog until one finishes.
const MAX_IN_FLIGHT: usize = 64;

/// An `io::Error` of `kind` whose text says what was being read or written.
fn io_error(kind: ErrorKind, text: String) -> std::io::Error {
    std::io::Error::new(kind, text)
}

/// Fills `buf` from `s` by `deadline`: before each `read` the socket's timeout is set to the time
/// left, so a peer that trickles bytes cannot stretch the wait past the deadline (a plain
/// `read_exact` under a read timeout is bounded only per read). `what` names what is read, for
/// the error: `TimedOut` once the deadline has passed (whether the peer was silent or slow),
/// `UnexpectedEof` when the peer closed the connection before.
fn read_exact_by(s: &mut TcpStream, buf: &mut [u8], deadline: Instant, what: &str) -> std::io::Result<()> {
    let (mut got, len) = (0, buf.len());
    while got < len {
        let left = deadline.saturating_duration_since(Instant::now());
        let late = || io_error(ErrorKind::TimedOut, format!("{what}: {got} of {len} bytes by the deadline"));
        if left.is_zero() {
            return Err(late());
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[got..]) {
            Ok(0) if Instant::now() >= deadline => return Err(late()),
            Ok(0) => {
                return Err(io_error(
                    ErrorKind::UnexpectedEof,
                    format!("{what}: the connection closed after {got} of {len} bytes (short read)"),
                ))
            }
            Ok(n) => got += n,
            Err(e) if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) if Instant::now() >= deadline => return Err(late()),
            Err(e) => return Err(io_error(e.kind(), format!("{what}: {e}"))),
        }
    }
    Ok(())
}

/// Writes all of `buf` to `s` by `deadline`, the write timeout set to the time left before each
/// `write` (a peer that does not read cannot stretch the wait either).
fn write_all_by(s: &mut TcpStream, buf: &[u8], deadline: Instant, what: &str) -> std::io::Result<()> {
    let mut sent = 0;
    while sent < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io_error(
                ErrorKind::TimedOut,
                format!("{what}: {sent} of {} bytes by the deadline", buf.len()),
            ));
        }
        s.set_write_timeout(Some(left))?;
        match s.write(&buf[sent..]) {
            Ok(0) => return Err(io_error(ErrorKind::WriteZero, format!("{what}: the connection closed"))),
            Ok(n) => sent += n,
            Err(e) if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => return Err(io_error(e.kind(), format!("{what}: {e}"))),
        }
    }
    Ok(())
}

fn read_u32(s: &mut TcpStream, deadline: Instant, what: &str) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    read_exact_by(s, &mut b, deadline, what)?;
    Ok(u32::from_le_bytes(b))
}

/// A length-prefixed byte string of at most `max` bytes.
fn read_bytes(s: &mut TcpStream, max: u32, deadline: Instant, what: &str) -> std::io::Result<Vec<u8>> {
    let n = read_u32(s, deadline, &format!("{what}'s length"))?;
    if n > max {
        return Err(io_error(ErrorKind::InvalidData, format!("{what}: a length of {n} bytes (at most {max})")));
    }
    // bounded: n <= max (TEXT_MAX or ROOT_MAX, at most 1 MiB), checked just above.
    #[allow(clippy::disallowed_methods)]
    let mut v = vec![0u8; n as usize];
    read_exact_by(s, &mut v, deadline, what)?;
    Ok(v)
}

/// Where rank 0 stands with each rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seat {
    /// Not joined yet.
    Open,
    /// A connection that said it is this rank is being served.
    Claimed,
    /// Joined: it has the root info and acknowledged it.
    Served,
}

/// Rank 0's side of one exchange, shared by the threads serving connections.
struct Server<'a> {
    set: &'a Settings,
    root: &'a [u8],
    deadline: Instant,
    seats: Mutex<Vec<Seat>>,
    /// Connections that were refused or failed, named in the timeout error (the first few).
    others: Mutex<Vec<String>>,
    /// The connections being served (a clone of each, to shut them down when rank 0 is done).
    live: Mutex<Vec<(u64, TcpStream)>>,
}

/// Locks `m`, whether or not a thread panicked while holding it (the data are plain values).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Server<'_> {
    /// Serves one connection; records a refused or failed one in `others`.
    fn connection(&self, mut s: TcpStream, peer: SocketAddr) {
        let refused = match self.exchange(&mut s) {
            Ok(Ok(())) => return,
            Ok(Err(why)) => why,
            Err(e) => e.to_string(),
        };
        let mut others = lock(&self.others);
        if others.len() < 8 {
            others.push(format!("{peer}: {refused}"));
        }
    }

    /// The protocol with one peer: `Ok(Err(why))` for a peer that was refused.
    fn exchange(&self, s: &mut TcpStream) -> std::io::Result<std::result::Result<(), String>> {
        let (set, deadline) = (self.set, self.deadline);
        let mut magic = [0u8; 8];
        read_exact_by(s, &mut magic, deadline, "its hello")?;
        if &magic != MAGIC {
            return Ok(Err("not an ascend rendezvous hello (bad magic)".into()));
        }
        let version = read_u32(s, deadline, "its hello's version")?;
        let rank = read_u32(s, deadline, "its hello's rank")?;
        let world = read_u32(s, deadline, "its hello's world size")?;
        let job = String::from_utf8_lossy(&read_bytes(s, TEXT_MAX, deadline, "its hello's job id")?).into_owned();
        let refusal = if version != VERSION {
            Some((1u8, format!("rank 0 speaks rendezvous version {VERSION}, the peer {version}")))
        } else if job != set.job {
            Some((2, format!("rank 0 at {} serves job `{}`, this rank is of job `{job}`", set.endpoint(), set.job)))
        } else if world != set.world || rank == 0 || rank >= set.world {
            Some((3, format!("rank {rank} of {world} does not fit the job's WORLD_SIZE={}", set.world)))
        } else {
            let mut seats = lock(&self.seats);
            let seat = &mut seats[rank as usize];
            if *seat == Seat::Open {
                *seat = Seat::Claimed;
                None
            } else {
                Some((4, format!("rank {rank} already joined: two processes were given RANK={rank}")))
            }
        };
        let mut out = MAGIC.to_vec();
        match &refusal {
            Some((code, msg)) => {
                out.push(*code);
                write_text(&mut out, msg);
            }
            None => {
                out.push(0);
                write_text(&mut out, "");
                out.extend_from_slice(&(self.root.len() as u32).to_le_bytes());
                out.extend_from_slice(self.root);
            }
        }
        let answered = write_all_by(s, &out, deadline, "the answer");
        if let Some((_, msg)) = refusal {
            return answered.map(|()| Err(msg));
        }
        // The rank's seat is claimed: it is Served once acknowledged, else open again.
        let mut ack = [0u8; 1];
        let done = answered.and_then(|()| read_exact_by(s, &mut ack, deadline, "its acknowledgement"));
        let joined = matches!(done, Ok(()) if ack[0] == ACK);
        lock(&self.seats)[rank as usize] = if joined { Seat::Served } else { Seat::Open };
        match done {
            Ok(()) if joined => Ok(Ok(())),
            Ok(()) => Ok(Err(format!("rank {rank} answered {:#04x}, not the acknowledgement", ack[0]))),
            Err(e) => Err(e),
        }
    }
}

/// Rank 0: hands `root` to ranks 1..world, within the timeout. Each connection is served on its
/// own thread (at most [`MAX_IN_FLIGHT`] at once), every read and write of it bounded by the one
/// deadline, so a slow or silent peer holds up neither the others nor the deadline.
fn serve(set: &Settings, root: &[u8]) -> Result<()> {
    let deadline = Instant::now() + set.timeout;
    let addrs = set.resolve()?;
    let listener = TcpListener::bind(&addrs[..]).map_err(|e| {
        let hint = if e.kind() == ErrorKind::AddrInUse {
            " (under torchrun the agent's store holds MASTER_PORT: set ASCEND_RENDEZVOUS_PORT to a free port, the same on every rank)"
        } else {
            ""
        };
        rendezvous_error(format!("rank 0 cannot listen on {} (MASTER_ADDR:MASTER_PORT): {e}{hint}", set.endpoint()))
    })?;
    listener.set_nonblocking(true).map_err(|e| rendezvous_error(format!("rank 0: {e}")))?;
    // bounded: world <= MAX_WORLD (65536), checked when the settings were read.
    #[allow(clippy::disallowed_methods)]
    let mut seats = vec![Seat::Open; set.world as usize];
    seats[0] = Seat::Served;
    let server = Server {
        set,
        root,
        deadline,
        seats: Mutex::new(seats),
        others: Mutex::new(Vec::new()),
        live: Mutex::new(Vec::new()),
    };
    let joined = || lock(&server.seats).iter().all(|s| *s == Seat::Served);
    let outcome = std::thread::scope(|scope| {
        let mut next_id = 0u64;
        let outcome = loop {
            if joined() {
                break Ok(());
            }
            if Instant::now() >= deadline {
                break Err(None);
            }
            if lock(&server.live).len() >= MAX_IN_FLIGHT {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            let (s, peer) = match listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                Err(e) => break Err(Some(format!("accept failed: {e}"))),
            };
            // The connection inherits nothing from the listener on Linux, but be explicit.
            let clone = s.set_nonblocking(false).and_then(|()| s.try_clone());
            let clone = match clone {
                Ok(c) => c,
                Err(e) => break Err(Some(format!("a connection from {peer}: {e}"))),
            };
            let id = next_id;
            next_id += 1;
            lock(&server.live).push((id, clone));
            let server = &server;
            let spawned = std::thread::Builder::new().name("ascend-rendezvous".into()).spawn_scoped(scope, move || {
                server.connection(s, peer);
                lock(&server.live).retain(|(i, _)| *i != id);
            });
            if let Err(e) = spawned {
                break Err(Some(format!("cannot start a thread for the connection from {peer}: {e}")));
            }
        };
        // Connections still open are strays or failed peers: end them now, so that their threads
        // (which the scope joins) return at once.
        for (_, s) in lock(&server.live).iter() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        outcome
    });
    match outcome {
        Ok(()) => return Ok(()),
        Err(Some(why)) => return Err(rendezvous_error(format!("rank 0 at {}: {why}", set.endpoint()))),
        Err(None) => {}
    }
    let seats = lock(&server.seats);
    // bounded: world <= MAX_WORLD (65536), checked when the settings were read.
    #[allow(clippy::disallowed_methods)]
    let missing: Vec<String> =
        seats.iter().enumerate().filter(|(_, s)| **s != Seat::Served).map(|(r, _)| r.to_string()).collect();
    let others = lock(&server.others);
    // A connection that never finished its hello may have been one of the missing ranks: say so
    // rather than claim that they never connected.
    let (verdict, others) = if others.is_empty() {
        ("never connected", String::new())
    } else {
        ("did not join", format!("; refused or unfinished connections: {}", others.join("; ")))
    };
    Err(rendezvous_error(format!(
        "rank 0 at {} waited {} s (ASCEND_RENDEZVOUS_TIMEOUT) for rank(s) {} of WORLD_SIZE={}, which {verdict}{others}",
        set.endpoint(),
        set.timeout.as_secs(),
        missing.join(", "),
        set.world
    )))
}

/// Rank r > 0: fetches rank 0's root-info bytes, within the timeout.
fn fetch(set: &Settings) -> Result<Vec<u8>> {
    let deadline = Instant::now() + set.timeout;
    let addrs = set.resolve()?;
    let peer = format!("rank 0 at {} (MASTER_ADDR:MASTER_PORT)", set.endpoint());
    let mut last = String::from("no attempt");
    let mut pause = Duration::from_millis(20);
    let mut stream = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(rendezvous_error(format!(
                "rank {} could not reach {peer} within {} s (ASCEND_RENDEZVOUS_TIMEOUT): {last}",
                set.rank,
                set.timeout.as_secs()
            )));
        }
        // Each address gets at most the time left now (not the time left before the previous
        // address's attempt): one deadline, however many addresses MASTER_ADDR resolves to.
        let attempt = addrs.iter().find_map(|a| {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            match TcpStream::connect_timeout(a, left.min(Duration::from_secs(2))) {
                Ok(s) => Some(s),
                Err(e) => {
                    last = e.to_string();
                    None
                }
            }
        });
        if let Some(s) = attempt {
            break s;
        }
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(500));
    };
    let io = |e: std::io::Error| {
        let what = if e.kind() == ErrorKind::TimedOut {
            format!("no complete answer within {} s (ASCEND_RENDEZVOUS_TIMEOUT): {e}", set.timeout.as_secs())
        } else {
            e.to_string()
        };
        rendezvous_error(format!("rank {}: {peer}: {what}", set.rank))
    };
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&VERSION.to_le_bytes());
    hello.extend_from_slice(&set.rank.to_le_bytes());
    hello.extend_from_slice(&set.world.to_le_bytes());
    write_text(&mut hello, &set.job);
    write_all_by(&mut stream, &hello, deadline, "the hello").map_err(io)?;
    let mut magic = [0u8; 8];
    read_exact_by(&mut stream, &mut magic, deadline, "its answer").map_err(io)?;
    if &magic != MAGIC {
        return Err(rendezvous_error(format!("rank {}: {peer} is not an ascend rendezvous (bad magic)", set.rank)));
    }
    let mut status = [0u8; 1];
    read_exact_by(&mut stream, &mut status, deadline, "its answer's status").map_err(io)?;
    let message = read_bytes(&mut stream, TEXT_MAX, deadline, "its answer's message").map_err(io)?;
    let message = String::from_utf8_lossy(&message).into_owned();
    if status[0] != 0 {
        return Err(rendezvous_error(format!("rank {}: {peer} refused it: {message}", set.rank)));
    }
    let root = read_bytes(&mut stream, ROOT_MAX, deadline, "the root info").map_err(io)?;
    write_all_by(&mut stream, &[ACK], deadline, "the acknowledgement").map_err(io)?;
    Ok(root)
}

/// The CPU engine's refusal.
fn cpu_error() -> Error {
    Error::invalid(
        "ctx",
        "Communicator::from_env starts HCCL ranks (one process per device); the CPU engine joins ranks in one \
         process only (Communicator::init_all, Communicator::init_rank)",
    )
}

pub(super) fn from_env(ctx: &Context) -> Result<Communicator> {
    if matches!(ctx.kind, ContextKind::Cpu) {
        return Err(cpu_error());
    }
    if let Some(table) = var("RANK_TABLE_FILE")? {
        let (name, value) = match (var("RANK")?, var("RANK_ID")?) {
            (Some(r), _) => ("RANK", r),
            (None, Some(r)) => ("RANK_ID", r),
            (None, None) => {
                return Err(Error::Config(format!(
                    "RANK_TABLE_FILE={table} is set, but neither RANK nor RANK_ID says which of its ranks this is"
                )))
            }
        };
        let rank: u32 = number(name, &value, "a rank number")?;
        let size = RankTable::load(std::path::Path::new(&table))?.size();
        for world_var in ["WORLD_SIZE", "RANK_SIZE"] {
            if let Some(w) = var(world_var)? {
                let w: u32 = number(world_var, &w, "a number of ranks")?;
                if w != size {
                    return Err(Error::Config(format!(
                        "{world_var}={w}, but RANK_TABLE_FILE={table} lists {size} ranks"
                    )));
                }
            }
        }
        return Communicator::from_rank_table(ctx, &table, rank);
    }
    let set = Settings::from_env()?;
    let root = if set.rank == 0 {
        let root = RootInfo::new(ctx)?;
        if set.world > 1 {
            serve(&set, root.as_bytes())?;
        }
        root
    } else {
        RootInfo::from_bytes(&fetch(&set)?)?
    };
    Communicator::init_rank(ctx, set.world, &root, set.rank)
}
