//! Run-time loading of the three CANN libraries.
//!
//! The libraries are looked for under these roots, in order, each as `ROOT/lib64/NAME` (and, for
//! an explicit directory only, also `DIR/NAME`):
//!
//! 1. the directory passed to [`load_from`];
//! 2. `$ASCEND_TOOLKIT_HOME`;
//! 3. `$ASCEND_HOME_PATH`;
//! 4. `/usr/local/Ascend/ascend-toolkit/latest`;
//! 5. `/usr/local/Ascend/cann`;
//! 6. the system search path (`dlopen` by bare name: `LD_LIBRARY_PATH`, `ld.so.cache`, ...).
//!
//! The first root holding `libascendcl.so` supplies `libnnopbase.so` too (they are never mixed
//! across installs). Operators are resolved when first used ([`Cann::operator`]), from the same
//! directory: `libopapi.so` (CANN 8.x), else the library of the operator's package
//! (`libopapi_nn.so`, `libopapi_math.so` on CANN 8.5+ split packages); a toolkit lacking one
//! operator fails only that operator. Libraries are loaded once per process and never unloaded,
//! since CANN keeps process-wide state (threads, device contexts) that must not outlive its code.

use std::collections::HashMap;
use std::env;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use crate::bindings::{AscendCl, Hccl, NnOpBase, OpApi};
use crate::symbols::Operator;

/// File name of the ACL runtime library.
pub const ASCENDCL: &str = "libascendcl.so";
/// File name of the aclnn base library (tensors, executors).
pub const NNOPBASE: &str = "libnnopbase.so";
/// File name of the collectives library (on CANN 9.x it depends on `libhcomm.so`, found through it).
pub const HCCL: &str = "libhccl.so";
/// File name of the op library of CANN 8.x, holding every operator; tried first.
pub const OPAPI: &str = "libopapi.so";
/// File names of the op libraries of CANN 8.5+ split packages, by package.
pub const OPAPI_PACKAGES: [(&str, &str); 2] = [("nn", "libopapi_nn.so"), ("math", "libopapi_math.so")];

/// Install roots searched after an explicit directory, in order (after the two variables).
pub const DEFAULT_ROOTS: [&str; 2] = ["/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann"];

/// A loaded CANN toolkit: the runtime and aclnn base libraries, and its op libraries, each
/// loaded when an operator first needs it.
#[non_exhaustive]
pub struct Cann {
    /// `libascendcl.so`: runtime (init, devices, streams, memory, events).
    pub acl: AscendCl,
    /// `libnnopbase.so`: aclnn tensors and executors.
    pub nnopbase: NnOpBase,
    /// Where `libascendcl.so` and `libnnopbase.so` were loaded from (a path, or a bare name
    /// resolved by the system).
    pub paths: [PathBuf; 2],
    /// The directory both came from (`None`: the system search path); op libraries come from it.
    dir: Option<PathBuf>,
    /// Op libraries by file name, each opened once (or the reason it could not be).
    op_libraries: Mutex<Vec<(&'static str, Result<&'static OpLibrary, String>)>>,
    /// `libhccl.so`, opened when first needed.
    hccl: OnceLock<Result<&'static Hccl, LoadError>>,
}

/// One op library: where it is, its functions, and which of them it exports.
struct OpLibrary {
    path: PathBuf,
    api: OpApi,
    exported: Vec<&'static str>,
}

impl fmt::Debug for Cann {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cann").field("paths", &self.paths).finish_non_exhaustive()
    }
}

impl Cann {
    /// The op library exporting `op`'s two functions, loaded on first use: `libopapi.so`
    /// (CANN 8.x), else the library of the operator's package (`libopapi_nn.so` or
    /// `libopapi_math.so`), from the directory `libascendcl.so` came from. A toolkit lacking the
    /// operator is a [`LoadError`] naming it and every library tried, for this operator only.
    pub fn operator(&self, op: &Operator) -> Result<&'static OpApi, LoadError> {
        let package = OPAPI_PACKAGES.iter().find(|(p, _)| *p == op.package).map(|(_, file)| *file);
        let mut tried = Vec::new();
        for file in std::iter::once(OPAPI).chain(package) {
            // (The path is spelled out only for the error: a launch looks its operator up here.)
            match self.op_library(file) {
                Ok(lib) if lib.exported.contains(&op.phase1) && lib.exported.contains(&op.name) => return Ok(&lib.api),
                Ok(lib) => tried.push((lib.path.display().to_string(), format!("lacks {} or {}", op.phase1, op.name))),
                Err(why) => tried.push((candidate(&self.dir, file).display().to_string(), why)),
            }
        }
        let library = std::iter::once(OPAPI).chain(package).collect::<Vec<_>>().join("|");
        Err(LoadError { library, symbol: Some(op.phase1.to_string()), operator: Some(op.name.to_string()), tried })
    }

    /// Opens an op library of this toolkit (once; the outcome is kept).
    fn op_library(&self, file: &'static str) -> Result<&'static OpLibrary, String> {
        let mut libs = self.op_libraries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, r)) = libs.iter().find(|(f, _)| *f == file) {
            return r.clone();
        }
        let r = open(&self.dir, file).and_then(|lib| {
            let exported = crate::symbols::OPERATORS
                .iter()
                .flat_map(|o| [o.phase1, o.name])
                // SAFETY: only looks the symbol up (its address is never used as this type).
                .filter(|name| unsafe { lib.get::<*const std::ffi::c_void>(name.as_bytes()) }.is_ok())
                .collect();
            // SAFETY: the op functions are resolved with the signatures bindgen derived from
            // wrapper.h, whose declarations are checked against CANN's public headers; a missing
            // one is an `Err` field, and `operator` hands out a library only when both functions
            // of the operator are exported.
            let api = unsafe { OpApi::from_library(lib) }.map_err(|e| e.to_string())?;
            let path = candidate(&self.dir, file);
            Ok(&*Box::leak(Box::new(OpLibrary { path, api, exported })))
        });
        libs.push((file, r.clone()));
        r
    }
}

impl Cann {
    /// HCCL (`libhccl.so`, from the directory `libascendcl.so` came from; on CANN 9.x it brings
    /// `libhcomm.so`, whose communicator functions resolve through it), loaded on first use, so
    /// single-device users never need it. Every function of [`HCCL_SYMBOLS`] must be exported;
    /// those of [`HCCL_OPTIONAL_SYMBOLS`] are `Err` fields when absent.
    ///
    /// [`HCCL_SYMBOLS`]: crate::symbols::HCCL_SYMBOLS
    /// [`HCCL_OPTIONAL_SYMBOLS`]: crate::symbols::HCCL_OPTIONAL_SYMBOLS
    pub fn hccl(&self) -> Result<&'static Hccl, LoadError> {
        self.hccl.get_or_init(|| self.load_hccl()).clone()
    }

    fn load_hccl(&self) -> Result<&'static Hccl, LoadError> {
        let path = candidate(&self.dir, HCCL);
        let fail = |symbol: Option<String>, why: String| LoadError {
            library: HCCL.into(),
            symbol,
            operator: None,
            tried: vec![(path.display().to_string(), why)],
        };
        let lib = open(&self.dir, HCCL).map_err(|why| fail(None, why))?;
        for name in crate::symbols::HCCL_SYMBOLS {
            // SAFETY: only looks the symbol up (its address is never used as this type).
            if let Err(e) = unsafe { lib.get::<*const std::ffi::c_void>(name.as_bytes()) } {
                return Err(fail(Some((*name).to_string()), e.to_string()));
            }
        }
        // SAFETY: the functions are resolved with the signatures bindgen derived from wrapper.h,
        // whose declarations are checked against HCCL's public headers (docs/cann/HCCL.md section 2); every
        // required one was just found, the optional ones are `Err` fields when absent.
        let hccl = unsafe { Hccl::from_library(lib) }.map_err(|e| fail(None, e.to_string()))?;
        Ok(Box::leak(Box::new(hccl)))
    }

    /// The op libraries opened so far, with where each came from.
    pub fn op_library_paths(&self) -> Vec<PathBuf> {
        let libs = self.op_libraries.lock().unwrap_or_else(|p| p.into_inner());
        libs.iter().filter_map(|(_, r)| r.as_ref().ok().map(|l| l.path.clone())).collect()
    }
}

impl fmt::Debug for Hccl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hccl").finish_non_exhaustive()
    }
}

impl fmt::Debug for OpApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpApi").finish_non_exhaustive()
    }
}

/// Why the CANN libraries, or one operator, could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoadError {
    /// The library that failed (e.g. `libascendcl.so`, or `libopapi.so|libopapi_nn.so`).
    pub library: String,
    /// The operator that is not available, when loading one failed (e.g. `aclnnBatchNormStats`).
    pub operator: Option<String>,
    /// The missing symbol, when the library loaded but lacks one the bindings require.
    pub symbol: Option<String>,
    /// Every path (or bare name) tried, each with why it failed.
    pub tried: Vec<(String, String)>,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.operator, &self.symbol) {
            (Some(op), _) => write!(f, "the operator {op} is not in this CANN toolkit ({})", self.library)?,
            (None, Some(sym)) => write!(f, "{} lacks the symbol `{sym}`", self.library)?,
            (None, None) => write!(f, "could not load {}", self.library)?,
        }
        if self.tried.is_empty() {
            return Ok(());
        }
        write!(f, "; tried:")?;
        for (path, why) in &self.tried {
            write!(f, " {path} ({why});")?;
        }
        write!(f, " set ASCEND_TOOLKIT_HOME to a CANN install (source its set_env.sh) or pass a directory explicitly")
    }
}

impl std::error::Error for LoadError {}

/// Loads CANN from the default search order (see the module docs), once per process.
///
/// Loading runs no CANN call (no `aclInit`); it only maps the libraries and resolves symbols.
pub fn load() -> Result<&'static Cann, LoadError> {
    static DEFAULT: OnceLock<Result<&'static Cann, LoadError>> = OnceLock::new();
    DEFAULT.get_or_init(|| search(&roots(None))).clone()
}

/// Loads CANN from `dir` first (a toolkit root holding `lib64/`, or the library directory
/// itself), then the default search order. Cached per directory for the life of the process.
pub fn load_from(dir: &Path) -> Result<&'static Cann, LoadError> {
    static BY_DIR: OnceLock<Mutex<HashMap<PathBuf, Result<&'static Cann, LoadError>>>> = OnceLock::new();
    let map = BY_DIR.get_or_init(Default::default);
    let mut map = map.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    map.entry(dir.to_path_buf()).or_insert_with(|| search(&roots(Some(dir)))).clone()
}

/// Whether the CANN libraries load from the default search order. Runs no CANN call.
pub fn is_available() -> bool {
    load().is_ok()
}

/// The library directories to try, in order; `None` stands for the system search path.
fn roots(explicit: Option<&Path>) -> Vec<Option<PathBuf>> {
    let mut dirs = Vec::new();
    if let Some(dir) = explicit {
        dirs.push(Some(dir.join("lib64")));
        dirs.push(Some(dir.to_path_buf()));
    }
    for var in ["ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"] {
        if let Some(root) = env::var_os(var).filter(|v| !v.is_empty()) {
            dirs.push(Some(PathBuf::from(root).join("lib64")));
        }
    }
    for root in DEFAULT_ROOTS {
        dirs.push(Some(Path::new(root).join("lib64")));
    }
    dirs.push(None);
    dirs
}

fn candidate(dir: &Option<PathBuf>, name: &str) -> PathBuf {
    match dir {
        Some(d) => d.join(name),
        None => PathBuf::from(name),
    }
}

/// Opens one library file. A directory candidate that does not exist is reported as such
/// without calling `dlopen`.
fn open(dir: &Option<PathBuf>, name: &str) -> Result<libloading::Library, String> {
    let path = candidate(dir, name);
    if dir.is_some() && !path.is_file() {
        return Err("not found".into());
    }
    let os: OsString = path.into_os_string();
    // SAFETY: loading a shared library runs its initialisers. The CANN libraries (and the mock)
    // have initialisers that only set up their own state; nothing here relies on Rust invariants.
    unsafe { libloading::Library::new(os) }.map_err(|e| e.to_string())
}

fn search(dirs: &[Option<PathBuf>]) -> Result<&'static Cann, LoadError> {
    let mut tried = Vec::new();
    for dir in dirs {
        let acl_path = candidate(dir, ASCENDCL);
        // The same install reached through two routes (an explicit directory and a variable, say)
        // is one toolkit: hand out the same `Cann`, so its devices compare equal.
        if let Some(known) = dir.as_ref().and_then(|_| already_loaded(&acl_path)) {
            return Ok(known);
        }
        let acl_lib = match open(dir, ASCENDCL) {
            Ok(lib) => lib,
            Err(why) => {
                tried.push((acl_path.display().to_string(), why));
                continue;
            }
        };
        // This root has the runtime: libnnopbase.so must come from the same root.
        let nn_path = candidate(dir, NNOPBASE);
        let nn_lib = open(dir, NNOPBASE).map_err(|why| LoadError {
            library: NNOPBASE.into(),
            symbol: None,
            operator: None,
            tried: vec![(nn_path.display().to_string(), why)],
        })?;
        // SAFETY: each struct's symbols are resolved with the signatures bindgen derived from
        // wrapper.h, whose declarations are checked against CANN's public headers (docs/cann/API.md).
        let acl = unsafe { AscendCl::from_library(acl_lib) }.map_err(|e| missing(&acl_path, e))?;
        // SAFETY: as above.
        let nnopbase = unsafe { NnOpBase::from_library(nn_lib) }.map_err(|e| missing(&nn_path, e))?;
        let cann: &'static Cann = Box::leak(Box::new(Cann {
            acl,
            nnopbase,
            paths: [acl_path, nn_path],
            dir: dir.clone(),
            op_libraries: Mutex::new(Vec::new()),
            hccl: OnceLock::new(),
        }));
        LOADED.lock().unwrap_or_else(|p| p.into_inner()).push(cann);
        return Ok(cann);
    }
    Err(LoadError { library: ASCENDCL.into(), symbol: None, operator: None, tried })
}

/// Every toolkit loaded so far.
static LOADED: Mutex<Vec<&'static Cann>> = Mutex::new(Vec::new());

/// The toolkit already loaded from the same `libascendcl.so` file (compared canonically).
fn already_loaded(acl_path: &Path) -> Option<&'static Cann> {
    let wanted = acl_path.canonicalize().ok()?;
    let loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    loaded.iter().copied().find(|c| c.paths[0].canonicalize().ok().as_deref() == Some(wanted.as_path()))
}

/// A library that loaded but lacks a symbol: `dlerror` reads "PATH: undefined symbol: NAME".
fn missing(path: &Path, err: libloading::Error) -> LoadError {
    let text = err.to_string();
    let symbol = text.rsplit("undefined symbol: ").next().filter(|_| text.contains("undefined symbol: "));
    LoadError {
        library: path.display().to_string(),
        symbol: Some(symbol.map(|s| s.trim().to_string()).unwrap_or(text.clone())),
        operator: None,
        tried: vec![(path.display().to_string(), text)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_order_starts_with_explicit_dir_and_ends_with_system_path() {
        let dirs = roots(Some(Path::new("/x")));
        assert_eq!(dirs[0], Some(PathBuf::from("/x/lib64")));
        assert_eq!(dirs[1], Some(PathBuf::from("/x")));
        assert_eq!(dirs.last(), Some(&None));
        let n = dirs.len();
        assert_eq!(dirs[n - 3], Some(PathBuf::from("/usr/local/Ascend/ascend-toolkit/latest/lib64")));
        assert_eq!(dirs[n - 2], Some(PathBuf::from("/usr/local/Ascend/cann/lib64")));
    }

    #[test]
    fn display_names_library_and_paths() {
        let e = LoadError {
            library: ASCENDCL.into(),
            symbol: None,
            operator: None,
            tried: vec![("/a/lib64/libascendcl.so".into(), "not found".into())],
        };
        let s = e.to_string();
        assert!(s.contains("libascendcl.so") && s.contains("/a/lib64/libascendcl.so (not found)"), "{s}");
    }
}
