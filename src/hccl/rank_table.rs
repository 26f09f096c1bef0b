//! Rank-table files (`RANK_TABLE_FILE`, HCCL's `HcclCommInitClusterInfo`): checked before HCCL
//! reads them, so a wrong path or table is an error naming the file and what is wrong.
//!
//! Formats (HCCL `docs/zh/user_guide/cluster_info_config/rank_table_config_{910,a2,a3,a5}.md`,
//! docs/cann/HCCL.md 4.5.3): version `"1.0"` (Atlas training, A2, A3 AI Server mode) and `"1.2"`
//! (A3 super-node mode) list `server_list[].device[]` entries with `"rank_id"` and `"device_id"`
//! (decimal strings); version `"2.0"` (Ascend 950) lists `rank_list[]` entries with numeric
//! `rank_id` and `device_id`. `"status"` must be `"completed"`.
//!
//! The parse keeps only what is read (the version, status and rank count, and each rank's
//! `rank_id` and `device_id`), checks the rest to be JSON and drops it, and stops at the first
//! server or rank beyond HCCL's 65536: memory stays near the file's size whatever a file holds.

use std::path::Path;

use crate::error::{Error, Result};

/// HCCL's limit on the rank-table path: 4096 bytes including the NUL (`HcclCommInitClusterInfo.md`).
pub(crate) const PATH_MAX_BYTES: usize = 4096;

/// The largest table read (far above any real cluster's).
const FILE_MAX_BYTES: u64 = 64 << 20;

/// The most ranks a table may list: HCCL's limit (`rank_count` 1..=65536).
pub(crate) const MAX_RANKS: u32 = 65_536;

/// One rank of a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) rank: u32,
    pub(crate) device: u32,
}

/// A parsed, consistent rank table: its ranks are exactly `0..size`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RankTable {
    pub(crate) entries: Vec<Entry>,
}

impl RankTable {
    /// Reads and checks the table at `path`; errors name the path and what is wrong.
    pub(crate) fn load(path: &Path) -> Result<RankTable> {
        let bad = |what: String| Error::invalid("path", format!("rank table {}: {what}", path.display()));
        let len = path.as_os_str().len();
        if len + 1 > PATH_MAX_BYTES {
            return Err(Error::invalid(
                "path",
                format!("a rank-table path has at most {} bytes (HCCL's limit), got {len}", PATH_MAX_BYTES - 1),
            ));
        }
        let meta = std::fs::metadata(path).map_err(|e| bad(format!("cannot be opened: {e}")))?;
        if !meta.is_file() {
            return Err(bad("is not a regular file".into()));
        }
        if meta.len() > FILE_MAX_BYTES {
            return Err(bad(format!("is {} bytes, more than {FILE_MAX_BYTES}", meta.len())));
        }
        let bytes = std::fs::read(path).map_err(|e| bad(format!("cannot be read: {e}")))?;
        let text = std::str::from_utf8(&bytes).map_err(|_| bad("is not UTF-8 text".into()))?;
        RankTable::parse(text).map_err(bad)
    }

    /// Parses a table's text.
    pub(crate) fn parse(text: &str) -> std::result::Result<RankTable, String> {
        let root = Json::parse(text)?;
        let version = root.get("version").and_then(Json::as_str).ok_or("it has no \"version\" string")?;
        let v2 = match version {
            "1.0" | "1.2" => false,
            "2.0" => true,
            v => return Err(format!("version \"{v}\" is not one HCCL documents (1.0, 1.2, 2.0)")),
        };
        match root.get("status").map(|s| s.as_str()) {
            Some(Some("completed")) => {}
            None if v2 => {}
            _ => return Err("\"status\" must be \"completed\" (the table is not ready)".into()),
        }
        let mut entries = Vec::new();
        let mut add = |e: &Json, at: String| -> std::result::Result<(), String> {
            let rank = e.get("rank_id").and_then(Json::as_u32).ok_or(format!("{at} has no integer \"rank_id\""))?;
            let device =
                e.get("device_id").and_then(Json::as_u32).ok_or(format!("{at} has no integer \"device_id\""))?;
            entries.push(Entry { rank, device });
            Ok(())
        };
        if v2 {
            let list =
                root.get("rank_list").and_then(Json::as_array).ok_or("version 2.0 needs a \"rank_list\" array")?;
            for (i, e) in list.iter().enumerate() {
                add(e, format!("rank_list[{i}]"))?;
            }
            let count = root.get("rank_count").and_then(Json::as_u32);
            if count != Some(list.len() as u32) {
                return Err(format!("\"rank_count\" must be the number of entries of \"rank_list\" ({})", list.len()));
            }
        } else {
            let servers = root.get("server_list").and_then(Json::as_array).ok_or("it has no \"server_list\" array")?;
            for (s, server) in servers.iter().enumerate() {
                let devices = server
                    .get("device")
                    .and_then(Json::as_array)
                    .ok_or(format!("server_list[{s}] has no \"device\" array"))?;
                for (d, e) in devices.iter().enumerate() {
                    add(e, format!("server_list[{s}].device[{d}]"))?;
                }
            }
        }
        if entries.is_empty() {
            return Err("it lists no ranks".into());
        }
        entries.sort_by_key(|e| e.rank);
        for (i, e) in entries.iter().enumerate() {
            if e.rank as usize != i {
                return Err(if i > 0 && entries[i - 1].rank == e.rank {
                    format!("rank_id {} appears twice", e.rank)
                } else {
                    format!("the rank ids are not 0..{}: rank_id {i} is missing", entries.len() - 1)
                });
            }
        }
        Ok(RankTable { entries })
    }

    /// The number of ranks.
    pub(crate) fn size(&self) -> u32 {
        self.entries.len() as u32
    }

    /// Checks that the table places `rank` (one of its ranks) on the device that
    /// `aclrtSetDevice(device)` binds, as far as the environment tells (see [`expected_device_id`]);
    /// the error names the table, the rank and both ids.
    pub(crate) fn check_device(&self, path: &Path, rank: u32, device: i32) -> Result<()> {
        let visible = std::env::var("ASCEND_RT_VISIBLE_DEVICES").ok();
        let Some(expected) = expected_device_id(device, visible.as_deref()) else {
            return Ok(());
        };
        let listed = self.entries[rank as usize].device;
        if listed == expected {
            return Ok(());
        }
        let ours = match visible.as_deref().map(str::trim).filter(|v| !v.is_empty()) {
            Some(v) => format!("device {device}, which ASCEND_RT_VISIBLE_DEVICES=`{v}` makes device_id {expected}"),
            None => format!("device {device} (device_id {expected}, ASCEND_RT_VISIBLE_DEVICES being unset)"),
        };
        Err(Error::invalid(
            "ctx",
            format!(
                "rank table {} places rank {rank} on device_id {listed}, but ctx is {ours}: HCCL requires a rank's \
                 device_id to be the device of the thread that joins it (pick the context or the rank to match)",
                path.display()
            ),
        ))
    }
}

/// The `device_id` a rank table holds for the device that `aclrtSetDevice(device)` binds, given
/// `ASCEND_RT_VISIBLE_DEVICES` (`visible`), or `None` when the environment does not say.
///
/// CANN has three ids (runtime API docs of `aclrtGetPhyDevIdByLogicDevId`): the user id given to
/// `aclrtSetDevice`; the logical id, which is the user id when `ASCEND_RT_VISIBLE_DEVICES` is
/// unset and otherwise that comma-separated list's entry at index user id; and the physical id, which
/// a rank table holds and which equals the logical id outside containers. So: the list's entry
/// when the variable is set (`None` when it has no such entry or it is not a number: HCCL
/// decides), the id itself otherwise.
///
/// Limit: in a container that exposes only some devices, the runtime renumbers them once more
/// (logical 0 may be physical 4), which no variable shows; there this rule compares the logical
/// id with the table's physical one. The exact mapping is `aclrtGetPhyDevIdByLogicDevId`
/// (`acl_rt.h`), not bound yet.
fn expected_device_id(device: i32, visible: Option<&str>) -> Option<u32> {
    let user = usize::try_from(device).ok()?;
    match visible.map(str::trim).filter(|v| !v.is_empty()) {
        None => u32::try_from(device).ok(),
        Some(list) => list.split(',').nth(user)?.trim().parse().ok(),
    }
}

/// A JSON value (just what a rank table needs: numbers are kept as text).
#[derive(Debug, PartialEq)]
enum Json {
    Null,
    Bool,
    Number(String),
    Str(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    fn parse(text: &str) -> std::result::Result<Json, String> {
        let mut p = Parser { s: text.as_bytes(), i: 0, servers: 0, ranks: 0 };
        let v = p.value(0, At::Root)?;
        p.ws();
        if p.i != p.s.len() {
            return Err(format!("it is not valid JSON: text after the value at byte {}", p.i));
        }
        Ok(v)
    }

    fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    fn as_array(&self) -> Option<&[Json]> {
        match self {
            Json::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A non-negative integer given as a number or as a string of decimal digits.
    fn as_u32(&self) -> Option<u32> {
        let s = match self {
            Json::Number(s) | Json::Str(s) => s,
            _ => return None,
        };
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    /// Servers and ranks kept so far (each at most [`MAX_RANKS`]).
    servers: u32,
    ranks: u32,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn fail<T>(&self, what: &str) -> std::result::Result<T, String> {
        Err(format!("it is not valid JSON: {what} at byte {} (comments are not allowed)", self.i))
    }

    fn value(&mut self, depth: usize, at: At) -> std::result::Result<Json, String> {
        self.ws();
        if depth > 64 {
            return self.fail("nested too deeply");
        }
        let count = match at {
            At::Server => Some((&mut self.servers, "servers")),
            At::Entry => Some((&mut self.ranks, "ranks")),
            _ => None,
        };
        if let Some((n, what)) = count {
            *n += 1;
            if *n > MAX_RANKS {
                return Err(format!("it lists more than {MAX_RANKS} {what} (HCCL's limit is {MAX_RANKS} ranks)"));
            }
        }
        let keep = at != At::Skip;
        match self.s.get(self.i) {
            None => self.fail("the text ended where a value was expected"),
            Some(b'"') => {
                let s = self.string(keep)?;
                Ok(if keep { Json::Str(s) } else { Json::Null })
            }
            Some(b'{') | Some(b'[') => {
                let object = self.s[self.i] == b'{';
                let close = if object { b'}' } else { b']' };
                self.i += 1;
                let (mut items, mut members) = (Vec::new(), Vec::new());
                self.ws();
                if self.s.get(self.i) == Some(&close) {
                    self.i += 1;
                } else {
                    loop {
                        if object {
                            self.ws();
                            let key = self.string(keep)?;
                            self.ws();
                            if self.s.get(self.i) != Some(&b':') {
                                return self.fail("':' expected");
                            }
                            self.i += 1;
                            let child = at.member(&key);
                            let v = self.value(depth + 1, child)?;
                            if child != At::Skip {
                                members.push((key, v));
                            }
                        } else {
                            let child = at.item();
                            let v = self.value(depth + 1, child)?;
                            if child != At::Skip {
                                items.push(v);
                            }
                        }
                        self.ws();
                        match self.s.get(self.i) {
                            Some(b',') => self.i += 1,
                            Some(c) if *c == close => {
                                self.i += 1;
                                break;
                            }
                            _ => return self.fail("',' or a closing bracket expected"),
                        }
                    }
                }
                Ok(if object { Json::Object(members) } else { Json::Array(items) })
            }
            Some(b'-' | b'0'..=b'9') => {
                let start = self.i;
                while self.i < self.s.len() && matches!(self.s[self.i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    self.i += 1;
                }
                Ok(if keep {
                    Json::Number(String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
                } else {
                    Json::Null
                })
            }
            _ => {
                for (word, v) in [("true", Json::Bool), ("false", Json::Bool), ("null", Json::Null)] {
                    if self.s[self.i..].starts_with(word.as_bytes()) {
                        self.i += word.len();
                        return Ok(v);
                    }
                }
                self.fail("unexpected character")
            }
        }
    }

    /// A string's text (escapes simplified), or nothing when `keep` is false (only checked).
    fn string(&mut self, keep: bool) -> std::result::Result<String, String> {
        if self.s.get(self.i) != Some(&b'"') {
            return self.fail("a string expected");
        }
        self.i += 1;
        let mut out = Vec::new();
        let mut push = |b: u8| {
            if keep {
                out.push(b);
            }
        };
        while let Some(&c) = self.s.get(self.i) {
            self.i += 1;
            match c {
                b'"' => return Ok(String::from_utf8_lossy(&out).into_owned()),
                b'\\' => {
                    let e = self.s.get(self.i).copied();
                    self.i += 1;
                    match e {
                        Some(b'"') => push(b'"'),
                        Some(b'\\') => push(b'\\'),
                        Some(b'/') => push(b'/'),
                        Some(b'n' | b't' | b'r' | b'b' | b'f') => push(b' '),
                        Some(b'u') if self.i + 4 <= self.s.len() => {
                            self.i += 4;
                            push(b'?');
                        }
                        _ => return self.fail("a bad escape"),
                    }
                }
                c if c < 0x20 => return self.fail("a control character in a string"),
                c => push(c),
            }
        }
        self.fail("an unterminated string")
    }
}

/// Where a value sits in a rank table, which says what of it the parse keeps: only what
/// [`RankTable::parse`] reads, so that the tree stays small whatever else a (large) file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    /// The top-level value.
    Root,
    /// `server_list`.
    Servers,
    /// One server of `server_list` (at most [`MAX_RANKS`]).
    Server,
    /// A list of ranks: `server_list[].device` or `rank_list`.
    Ranks,
    /// One rank of such a list (at most [`MAX_RANKS`] in the whole table).
    Entry,
    /// A value read by name: `version`, `status`, `rank_count`, `rank_id`, `device_id`.
    Field,
    /// Anything else: checked to be JSON, then dropped.
    Skip,
}

impl At {
    /// Where the member `key` of an object here sits.
    fn member(self, key: &str) -> At {
        match (self, key) {
            (At::Root, "server_list") => At::Servers,
            (At::Root, "rank_list") => At::Ranks,
            (At::Root, "version" | "status" | "rank_count") => At::Field,
            (At::Server, "device") => At::Ranks,
            (At::Entry, "rank_id" | "device_id") => At::Field,
            _ => At::Skip,
        }
    }

    /// Where the items of an array here sit.
    fn item(self) -> At {
        match self {
            At::Servers => At::Server,
            At::Ranks => At::Entry,
            _ => At::Skip,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The user id indexes ASCEND_RT_VISIBLE_DEVICES when it is set; otherwise it is the id.
    #[test]
    fn the_expected_device_id_follows_ascend_rt_visible_devices() {
        assert_eq!(expected_device_id(3, None), Some(3));
        assert_eq!(expected_device_id(3, Some(" ")), Some(3));
        assert_eq!(expected_device_id(0, Some("4,6")), Some(4));
        assert_eq!(expected_device_id(1, Some(" 4 , 6 ")), Some(6));
        assert_eq!(expected_device_id(2, Some("4,6")), None);
        assert_eq!(expected_device_id(0, Some("x,6")), None);
        assert_eq!(expected_device_id(-1, None), None);
    }

    #[test]
    fn reads_the_documented_formats_and_rejects_bad_tables() {
        let v1 = r#"{"status":"completed","version":"1.0","server_count":"2","server_list":[
            {"server_id":"node_0","device":[{"device_id":"0","device_ip":"192.168.1.8","rank_id":"0"},
                                            {"device_id":"1","rank_id":"1"}]},
            {"server_id":"node_1","device":[{"device_id":"0","rank_id":"2"}]}]}"#;
        let t = RankTable::parse(v1).unwrap();
        assert_eq!(t.size(), 3);
        assert_eq!(t.entries[2], Entry { rank: 2, device: 0 });
        let v2 = r#"{"version":"2.0","rank_count":2,"rank_list":[{"rank_id":1,"device_id":3,"local_id":0},
            {"rank_id":0,"device_id":2,"local_id":1}]}"#;
        assert_eq!(RankTable::parse(v2).unwrap().entries[0], Entry { rank: 0, device: 2 });
        for (text, want) in [
            ("{", "not valid JSON"),
            ("{\"version\":\"1.0\" // c\n}", "comments"),
            (r#"{"version":"3.0","status":"completed"}"#, "version \"3.0\""),
            (r#"{"version":"1.0","status":"initializing","server_list":[]}"#, "status"),
            (
                r#"{"version":"1.0","status":"completed","server_list":[{"device":[{"rank_id":"1","device_id":"0"}]}]}"#,
                "rank_id 0 is missing",
            ),
            (
                r#"{"version":"1.0","status":"completed","server_list":[{"device":[{"rank_id":"0","device_id":"0"},{"rank_id":"0","device_id":"1"}]}]}"#,
                "appears twice",
            ),
            (
                r#"{"version":"1.0","status":"completed","server_list":[{"device":[{"rank_id":"x","device_id":"0"}]}]}"#,
                "rank_id",
            ),
            (r#"{"version":"2.0","rank_count":3,"rank_list":[{"rank_id":0,"device_id":0}]}"#, "rank_count"),
        ] {
            let e = RankTable::parse(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    /// Only what the table's reading uses is kept (measured before: a 63 MiB file of numbers
    /// took 2 GB), and what is dropped is still checked to be JSON.
    #[test]
    fn the_tree_keeps_only_what_a_rank_table_reads() {
        let text = r#"{"version":"1.0","junk":[1,{"a":"b"},[2]],"server_list":[{"server_id":"x","device":[
            {"rank_id":"0","device_ip":"1.2.3.4","device_id":"3","more":{"rank_id":"9"}}]}],"status":"completed"}"#;
        let s = |v: &str| Json::Str(v.to_string());
        let entry = Json::Object(vec![("rank_id".into(), s("0")), ("device_id".into(), s("3"))]);
        let server = Json::Object(vec![("device".into(), Json::Array(vec![entry]))]);
        let root = Json::Object(vec![
            ("version".into(), s("1.0")),
            ("server_list".into(), Json::Array(vec![server])),
            ("status".into(), s("completed")),
        ]);
        assert_eq!(Json::parse(text).unwrap(), root);
        let bad = r#"{"version":"1.0","junk":[1,{"a":tru}],"status":"completed","server_list":[]}"#;
        assert!(Json::parse(bad).unwrap_err().contains("not valid JSON"));
    }

    /// More ranks (or servers) than HCCL allows stop the parse at the first one too many.
    #[test]
    fn more_ranks_than_hccl_allows_are_refused_while_parsing() {
        let entries: Vec<String> = (0..=MAX_RANKS).map(|r| format!(r#"{{"rank_id":{r},"device_id":0}}"#)).collect();
        let v2 = format!(r#"{{"version":"2.0","rank_count":{},"rank_list":[{}]}}"#, MAX_RANKS + 1, entries.join(","));
        assert!(RankTable::parse(&v2).unwrap_err().contains("more than 65536 ranks"));
        let servers = vec![r#"{"device":[]}"#; MAX_RANKS as usize + 1].join(",");
        let v1 = format!(r#"{{"version":"1.0","status":"completed","server_list":[{servers}]}}"#);
        assert!(RankTable::parse(&v1).unwrap_err().contains("more than 65536 servers"));
        let fits = &entries[..MAX_RANKS as usize].join(",");
        let v2 = format!(r#"{{"version":"2.0","rank_count":{MAX_RANKS},"rank_list":[{fits}]}}"#);
        assert_eq!(RankTable::parse(&v2).unwrap().size(), MAX_RANKS);
    }
}
