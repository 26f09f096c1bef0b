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

use crate::bindings::{AclCapture, AscendCl, Hccl, NnOpBase, OpApi};
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
    /// The graph capture functions of `libascendcl.so`, resolved when first needed.
    capture: OnceLock<Result<&'static AclCapture, LoadError>>,
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
        Err(LoadError::Operator { operator: op.name.to_string(), tried })
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
        let lib = open(&self.dir, HCCL).map_err(|why| LoadError::Library {
            library: HCCL.into(),
            tried: vec![(path.display().to_string(), why)],
        })?;
        for name in crate::symbols::HCCL_SYMBOLS {
            // SAFETY: only looks the symbol up (its address is never used as this type).
            if let Err(e) = unsafe { lib.get::<*const std::ffi::c_void>(name.as_bytes()) } {
                return Err(LoadError::missing_symbol(path.display().to_string(), *name, e.to_string()));
            }
        }
        // SAFETY: the functions are resolved with the signatures bindgen derived from wrapper.h,
        // whose declarations are checked against HCCL's public headers (docs/cann/HCCL.md section 2); every
        // required one was just found, the optional ones are `Err` fields when absent.
        let hccl = unsafe { Hccl::from_library(lib) }.map_err(|e| missing(&path, e))?;
        Ok(Box::leak(Box::new(hccl)))
    }

    /// The graph capture functions ([`ASCENDCL_CAPTURE_SYMBOLS`]) of the `libascendcl.so` this
    /// toolkit loaded, resolved on first use. Each is an `Err` field when absent (toolkits before
    /// CANN 8.2); the library itself failing to open again is a [`LoadError::Library`].
    ///
    /// [`ASCENDCL_CAPTURE_SYMBOLS`]: crate::symbols::ASCENDCL_CAPTURE_SYMBOLS
    pub fn capture(&self) -> Result<&'static AclCapture, LoadError> {
        self.capture.get_or_init(|| self.load_capture()).clone()
    }

    fn load_capture(&self) -> Result<&'static AclCapture, LoadError> {
        let path = &self.paths[0];
        let lib = open(&self.dir, ASCENDCL).map_err(|why| LoadError::Library {
            library: ASCENDCL.into(),
            tried: vec![(path.display().to_string(), why)],
        })?;
        // SAFETY: the functions are resolved with the signatures bindgen derived from wrapper.h,
        // whose declarations are checked against acl_rt.h (tests/abi.rs); the library is the one
        // already loaded (dlopen counts references), and absent functions are `Err` fields.
        let capture = unsafe { AclCapture::from_library(lib) }.map_err(|e| missing(path, e))?;
        Ok(Box::leak(Box::new(capture)))
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

/// Why the CANN libraries, one operator, or HCCL could not be loaded: one variant per cause, as
/// a caller matches them (ort's `LoadError`, rusqlite's `Error`). Each `Display` says what was
/// tried and what to do about it.
///
/// Earlier versions had a struct whose `Option` fields encoded the cause (`operator: Some`
/// for [`LoadError::Operator`], `symbol: Some` for [`LoadError::Symbol`], neither for
/// [`LoadError::Library`]). [`library`](LoadError::library), [`tried`](LoadError::tried),
/// [`symbol`](LoadError::symbol) and [`operator`](LoadError::operator) read the same facts from
/// any variant.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadError {
    /// No place tried holds a loadable `library`.
    #[non_exhaustive]
    Library {
        /// The file name (e.g. `libascendcl.so`, `libnnopbase.so`, `libhccl.so`).
        library: String,
        /// Every path (or bare name) tried, in order, each with why it failed (`not found`, or
        /// `dlopen`'s reason).
        tried: Vec<(String, String)>,
    },
    /// `library` loaded but does not export `symbol`, which this crate calls: the toolkit is older
    /// (or newer) than the declarations bound here.
    #[non_exhaustive]
    Symbol {
        /// The library, as loaded (its path, or its file name when the system search path found it).
        library: String,
        /// The function it lacks (e.g. `aclrtStreamWaitEvent`, `HcclGetCommAsyncError`).
        symbol: String,
        /// The loader's words (`dlsym`'s error).
        reason: String,
    },
    /// No op library of this toolkit exports the operator's two functions; other operators may
    /// still load.
    #[non_exhaustive]
    Operator {
        /// The operator (e.g. `aclnnBatchNormStats`).
        operator: String,
        /// Every op library tried (`libopapi.so`, then its package's), each with why it failed
        /// (`not found`, `dlopen`'s reason, or the functions it lacks).
        tried: Vec<(String, String)>,
    },
}

impl LoadError {
    /// A library that loaded without `symbol` (for a function resolved after loading, such as one
    /// of [`HCCL_OPTIONAL_SYMBOLS`](crate::symbols::HCCL_OPTIONAL_SYMBOLS), when it is called).
    pub fn missing_symbol(
        library: impl Into<String>,
        symbol: impl Into<String>,
        reason: impl Into<String>,
    ) -> LoadError {
        LoadError::Symbol { library: library.into(), symbol: symbol.into(), reason: reason.into() }
    }

    /// The library that failed: its file name, its path when it loaded but lacked a symbol, or
    /// the op libraries tried for an operator (`libopapi.so|libopapi_nn.so`).
    pub fn library(&self) -> String {
        match self {
            LoadError::Library { library, .. } | LoadError::Symbol { library, .. } => library.clone(),
            LoadError::Operator { tried, .. } => {
                let files = tried.iter().map(|(path, _)| path.rsplit('/').next().unwrap_or(path));
                files.collect::<Vec<_>>().join("|")
            }
        }
    }

    /// Every path tried, each with why it failed (for [`LoadError::Symbol`], the one library).
    pub fn tried(&self) -> Vec<(String, String)> {
        match self {
            LoadError::Library { tried, .. } | LoadError::Operator { tried, .. } => tried.clone(),
            LoadError::Symbol { library, reason, .. } => vec![(library.clone(), reason.clone())],
        }
    }

    /// The missing symbol ([`LoadError::Symbol`]).
    pub fn symbol(&self) -> Option<&str> {
        match self {
            LoadError::Symbol { symbol, .. } => Some(symbol),
            _ => None,
        }
    }

    /// The operator that is not available ([`LoadError::Operator`]).
    pub fn operator(&self) -> Option<&str> {
        match self {
            LoadError::Operator { operator, .. } => Some(operator),
            _ => None,
        }
    }
}

/// Writes `; tried: PATH (WHY); ...;` (or `;` for an empty list), before the advice.
fn write_tried(f: &mut fmt::Formatter<'_>, tried: &[(String, String)]) -> fmt::Result {
    if tried.is_empty() {
        return write!(f, ";");
    }
    write!(f, "; tried:")?;
    for (path, why) in tried {
        write!(f, " {path} ({why});")?;
    }
    Ok(())
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Library { library, tried } => {
                write!(f, "could not load {library}")?;
                write_tried(f, tried)?;
                if library == HCCL {
                    write!(f, " collectives need CANN's HCCL: install it with the toolkit, or use CPU contexts")
                } else {
                    write!(
                        f,
                        " set ASCEND_TOOLKIT_HOME to a complete CANN install (source its set_env.sh) or pass its \
                         directory explicitly"
                    )
                }
            }
            LoadError::Symbol { library, symbol, reason } => write!(
                f,
                "{library} lacks the symbol `{symbol}` ({reason}): this CANN is older or newer than the \
                 declarations this crate binds; use a CANN 8.x or later toolkit, or one that exports `{symbol}`"
            ),
            LoadError::Operator { operator, tried } => {
                write!(f, "the operator {operator} is not in this CANN toolkit")?;
                write_tried(f, tried)?;
                write!(f, " install the CANN operator package that provides it, or run it on a CPU context")
            }
        }
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
        let nn_lib = open(dir, NNOPBASE).map_err(|why| LoadError::Library {
            library: NNOPBASE.into(),
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
            capture: OnceLock::new(),
        }));
        LOADED.lock().unwrap_or_else(|p| p.into_inner()).push(cann);
        return Ok(cann);
    }
    Err(LoadError::Library { library: ASCENDCL.into(), tried })
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
    let symbol = symbol.map(|s| s.trim().to_string()).unwrap_or(text.clone());
    LoadError::missing_symbol(path.display().to_string(), symbol, text)
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
        let e = LoadError::Library {
            library: ASCENDCL.into(),
            tried: vec![("/a/lib64/libascendcl.so".into(), "not found".into())],
        };
        let s = e.to_string();
        assert!(s.contains("libascendcl.so") && s.contains("/a/lib64/libascendcl.so (not found)"), "{s}");
        assert!(s.contains("set ASCEND_TOOLKIT_HOME"), "what to do: {s}");
        assert_eq!((e.library(), e.symbol(), e.operator()), (ASCENDCL.to_string(), None, None));
    }

    #[test]
    fn each_variant_says_what_failed_and_what_to_do() {
        let hccl = LoadError::Library {
            library: HCCL.into(),
            tried: vec![("/t/lib64/libhccl.so".into(), "not found".into())],
        };
        assert!(hccl.to_string().contains("install it with the toolkit, or use CPU contexts"), "{hccl}");
        let sym = LoadError::missing_symbol("/t/lib64/libhccl.so", "HcclGetCommAsyncError", "undefined symbol");
        let text = sym.to_string();
        assert!(text.contains("/t/lib64/libhccl.so lacks the symbol `HcclGetCommAsyncError`"), "{text}");
        assert_eq!(sym.tried(), vec![("/t/lib64/libhccl.so".to_string(), "undefined symbol".to_string())]);
        let op = LoadError::Operator {
            operator: "aclnnBatchNormStats".into(),
            tried: vec![
                ("/t/lib64/libopapi.so".into(), "not found".into()),
                ("/t/lib64/libopapi_math.so".into(), "not found".into()),
            ],
        };
        assert_eq!(op.library(), "libopapi.so|libopapi_math.so");
        assert_eq!(op.operator(), Some("aclnnBatchNormStats"));
        assert!(
            op.to_string().starts_with("the operator aclnnBatchNormStats is not in this CANN toolkit; tried:"),
            "{op}"
        );
    }
}
