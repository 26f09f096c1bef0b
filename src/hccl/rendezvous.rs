//! [`Communicator::from_env`](super::Communicator::from_env): the launcher's environment, and a
//! small TCP rendezvous in which rank 0 hands its root info to the other ranks.
//!
//! The protocol (std::net only, every read and connect bounded by the timeout):
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

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
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
const MAX_WORLD: u32 = 65_536;
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

fn read_u32(s: &mut TcpStream) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    s.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_bytes(s: &mut TcpStream, max: u32) -> std::io::Result<Vec<u8>> {
    let n = read_u32(s)?;
    if n > max {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("a length of {n} bytes")));
    }
    // bounded: n <= max (TEXT_MAX or ROOT_MAX, at most 1 MiB), checked just above.
    #[allow(clippy::disallowed_methods)]
    let mut v = vec![0u8; n as usize];
    s.read_exact(&mut v)?;
    Ok(v)
}

/// What rank 0 says to one peer: `Ok(rank)` when it was served.
fn serve_one(s: &mut TcpStream, set: &Settings, root: &[u8], served: &[bool]) -> std::io::Result<Option<u32>> {
    let mut magic = [0u8; 8];
    s.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Ok(None); // not one of ours: ignored
    }
    let version = read_u32(s)?;
    let rank = read_u32(s)?;
    let world = read_u32(s)?;
    let job = String::from_utf8_lossy(&read_bytes(s, TEXT_MAX)?).into_owned();
    let refusal = if version != VERSION {
        Some((1u8, format!("rank 0 speaks rendezvous version {VERSION}, the peer {version}")))
    } else if job != set.job {
        Some((2, format!("rank 0 at {} serves job `{}`, this rank is of job `{job}`", set.endpoint(), set.job)))
    } else if world != set.world || rank == 0 || rank >= set.world {
        Some((3, format!("rank {rank} of {world} does not fit the job's WORLD_SIZE={}", set.world)))
    } else if served[rank as usize] {
        Some((4, format!("rank {rank} already joined: two processes were given RANK={rank}")))
    } else {
        None
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
            out.extend_from_slice(&(root.len() as u32).to_le_bytes());
            out.extend_from_slice(root);
        }
    }
    s.write_all(&out)?;
    if refusal.is_some() {
        return Ok(None);
    }
    let mut ack = [0u8; 1];
    s.read_exact(&mut ack)?;
    Ok((ack[0] == ACK).then_some(rank))
}

/// Rank 0: hands `root` to ranks 1..world, within the timeout.
fn serve(set: &Settings, root: &[u8]) -> Result<()> {
    let deadline = Instant::now() + set.timeout;
    let addrs = set.resolve()?;
    let listener = TcpListener::bind(&addrs[..]).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
            " (under torchrun the agent's store holds MASTER_PORT: set ASCEND_RENDEZVOUS_PORT to a free port, the same on every rank)"
        } else {
            ""
        };
        rendezvous_error(format!("rank 0 cannot listen on {} (MASTER_ADDR:MASTER_PORT): {e}{hint}", set.endpoint()))
    })?;
    listener.set_nonblocking(true).map_err(|e| rendezvous_error(format!("rank 0: {e}")))?;
    // bounded: world <= MAX_WORLD (65536), checked when the settings were read.
    #[allow(clippy::disallowed_methods)]
    let mut served = vec![false; set.world as usize];
    served[0] = true;
    let mut strays = Vec::new();
    while served.iter().any(|s| !s) {
        let now = Instant::now();
        if now >= deadline {
            // bounded: world <= MAX_WORLD (65536), checked when the settings were read.
            #[allow(clippy::disallowed_methods)]
            let missing: Vec<String> =
                served.iter().enumerate().filter(|(_, s)| !**s).map(|(r, _)| r.to_string()).collect();
            let strays = if strays.is_empty() { String::new() } else { format!("; refused: {}", strays.join("; ")) };
            return Err(rendezvous_error(format!(
                "rank 0 at {} waited {} s (ASCEND_RENDEZVOUS_TIMEOUT) for rank(s) {} of WORLD_SIZE={}, which never \
                 connected{strays}",
                set.endpoint(),
                set.timeout.as_secs(),
                missing.join(", "),
                set.world
            )));
        }
        match listener.accept() {
            Ok((mut s, peer)) => {
                let io =
                    deadline.saturating_duration_since(now).min(Duration::from_secs(10)).max(Duration::from_millis(1));
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(io));
                let _ = s.set_write_timeout(Some(io));
                let refused = match serve_one(&mut s, set, root, &served) {
                    Ok(Some(rank)) => {
                        served[rank as usize] = true;
                        None
                    }
                    Ok(None) => Some(format!("{peer}")),
                    Err(e) => Some(format!("{peer}: {e}")),
                };
                // The first few refused peers are named in the timeout error.
                strays.extend(refused.filter(|_| strays.len() < 8));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(rendezvous_error(format!("rank 0 at {}: accept failed: {e}", set.endpoint()))),
        }
    }
    Ok(())
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
        let attempt =
            addrs.iter().find_map(|a| match TcpStream::connect_timeout(a, left.min(Duration::from_secs(2))) {
                Ok(s) => Some(s),
                Err(e) => {
                    last = e.to_string();
                    None
                }
            });
        if let Some(s) = attempt {
            break s;
        }
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(500));
    };
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    let io = |e: std::io::Error| {
        let what = if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
            format!("no answer within {} s (ASCEND_RENDEZVOUS_TIMEOUT)", set.timeout.as_secs())
        } else if e.kind() == std::io::ErrorKind::UnexpectedEof {
            "the connection closed early (short read)".to_string()
        } else {
            e.to_string()
        };
        rendezvous_error(format!("rank {}: {peer}: {what}", set.rank))
    };
    stream.set_read_timeout(Some(left)).map_err(io)?;
    stream.set_write_timeout(Some(left)).map_err(io)?;
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&VERSION.to_le_bytes());
    hello.extend_from_slice(&set.rank.to_le_bytes());
    hello.extend_from_slice(&set.world.to_le_bytes());
    write_text(&mut hello, &set.job);
    stream.write_all(&hello).map_err(io)?;
    let mut magic = [0u8; 8];
    stream.read_exact(&mut magic).map_err(io)?;
    if &magic != MAGIC {
        return Err(rendezvous_error(format!("rank {}: {peer} is not an ascend rendezvous (bad magic)", set.rank)));
    }
    let mut status = [0u8; 1];
    stream.read_exact(&mut status).map_err(io)?;
    let message = String::from_utf8_lossy(&read_bytes(&mut stream, TEXT_MAX).map_err(io)?).into_owned();
    if status[0] != 0 {
        return Err(rendezvous_error(format!("rank {}: {peer} refused it: {message}", set.rank)));
    }
    let root = read_bytes(&mut stream, ROOT_MAX).map_err(io)?;
    stream.write_all(&[ACK]).map_err(io)?;
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
