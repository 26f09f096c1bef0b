//! The documentation names only what exists: every file path, API path, environment variable,
//! example, bench and test the READMEs and `docs/DESIGN.md` name is in the repository, and every
//! fact page the code cites (`docs/cann/*.md`) is committed.
//!
//! What is checked, in `README.md`, `benches/README.md`, `docs/DESIGN.md` and
//! `ascend-sys/README.md` (paths relative to the file's crate):
//! - every path in backticks (or a word of a shell block) under `src/`, `tests/`, `examples/`,
//!   `benches/`, `docs/`, `mock/`, `.ci/`, `ascend-sys/` or `scripts/` exists (`<op>` and `*`
//!   match any entry, `{a,b}` expands, a `:line` suffix is dropped);
//! - every `ascend::...` / `ascend_sys::...` path (in backticks, or in a Rust block's `use`) names
//!   public modules and items, and what follows an item (`Type::method`, `Enum::Variant`) is a
//!   public function, constant, field or variant of the crate; so is `Type::member` for a public
//!   type of the crate, and `receiver.method(..)` in backticks;
//! - `cargo ... --example/--bench/--test NAME` names a target that exists, `--features NAME` a
//!   feature;
//! - every `ASCEND_*` variable occurs as a string in the code (or, for CANN's own variables, in
//!   `docs/cann/`), and every fact page named by its bare name (`ASYNC.md`) exists;
//! - every test binary and example is listed in `README.md`, every bench in `benches/README.md`.
//!
//! And in the code (`src/`, `mock/`, `ascend-sys/`, `build.rs`, `tests/`, `benches/`,
//! `examples/`, `.ci/`): every `docs/...` path it cites exists (CANN's upstream pages,
//! `docs/zh/...` and `docs/en/...`, are sources named by repository, not files of ours), and so
//! does every fact page it names bare (`ASYNC.md 3`).
//!
//! From the packaged crate (no `.ci/`, no `ascend-sys/` beside it) the checks that need those
//! directories are skipped, and say so.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The repository (or the unpacked package) and what of it is present.
struct Repo {
    root: PathBuf,
    /// `ascend-sys/`, absent in the packaged crate.
    sys: Option<PathBuf>,
    /// `.ci/`, excluded from the package.
    ci: bool,
}

impl Repo {
    fn open() -> Repo {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let sys = Some(root.join("ascend-sys")).filter(|p| p.join("src/lib.rs").is_file());
        let ci = root.join(".ci/run").is_file();
        if sys.is_none() || !ci {
            eprintln!("documentation: not a full checkout; paths under ascend-sys/ and .ci/ are not checked");
        }
        Repo { root, sys, ci }
    }

    /// Whether a path under `top/` can be checked here.
    fn checkable(&self, path: &str) -> bool {
        !(path.starts_with(".ci/") && !self.ci || path.starts_with("ascend-sys/") && self.sys.is_none())
    }
}

/// Every file under `dir` (recursively) whose name ends with one of `exts`.
fn files(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if p.is_dir() {
            if name != "target" && name != "bindings" && !name.starts_with('.') || name == ".ci" {
                files(&p, exts, out);
            }
        } else if exts.is_empty() || exts.iter().any(|x| name.ends_with(x)) {
            out.push(p);
        }
    }
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

// ---------------------------------------------------------------------------------------------
// Markdown: prose code spans and fenced blocks.

struct Doc {
    /// Shown in failures.
    name: String,
    /// What relative paths in it are relative to.
    base: PathBuf,
    /// Inline code spans, with their line.
    spans: Vec<(usize, String)>,
    /// Fenced blocks: info string, first line, text.
    blocks: Vec<(String, usize, String)>,
    text: String,
}

fn parse(name: &str, base: PathBuf, text: String) -> Doc {
    let (mut spans, mut blocks) = (Vec::new(), Vec::new());
    let mut fence: Option<(String, usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if let Some(rest) = line.trim_start().strip_prefix("```") {
            match fence.take() {
                Some(block) => blocks.push(block),
                None => fence = Some((rest.trim().to_string(), n, String::new())),
            }
            continue;
        }
        if let Some((_, _, body)) = fence.as_mut() {
            body.push_str(line);
            body.push('\n');
            continue;
        }
        let parts: Vec<&str> = line.split('`').collect();
        // Odd pieces are inside backticks (a line's spans are closed on it in these files).
        for (k, piece) in parts.iter().enumerate() {
            if k % 2 == 1 && k + 1 < parts.len() {
                spans.push((n, piece.replace("\\|", "|")));
            }
        }
    }
    assert!(fence.is_none(), "{name}: an unclosed code fence");
    Doc { name: name.to_string(), base, spans, blocks, text }
}

// ---------------------------------------------------------------------------------------------
// Paths.

const PATH_TOPS: [&str; 9] =
    ["src/", "tests/", "examples/", "benches/", "docs/", "mock/", ".ci/", "ascend-sys/", "scripts/"];

/// `a{b,c}d` → `abd`, `acd` (nested braces expand too).
fn expand_braces(s: &str) -> Vec<String> {
    let Some(open) = s.find('{') else { return vec![s.to_string()] };
    let Some(close) = s[open..].find('}').map(|c| open + c) else { return vec![s.to_string()] };
    let (head, body, tail) = (&s[..open], &s[open + 1..close], &s[close + 1..]);
    body.split(',').flat_map(|alt| expand_braces(&format!("{head}{alt}{tail}"))).collect()
}

/// Whether `name` matches `pattern`, where `*` is any run of characters.
fn glob(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((pre, rest)) => name.starts_with(pre) && (pre.len()..=name.len()).any(|i| glob(rest, &name[i..])),
    }
}

/// Whether `path` (relative to `base`; `<x>` and `*` match any entry) names something present.
fn path_exists(base: &Path, path: &str) -> bool {
    let mut here = vec![base.to_path_buf()];
    for comp in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
        let pattern = if comp.starts_with('<') && comp.contains('>') {
            // `<op>.c`: the placeholder matches any run of characters.
            format!("*{}", &comp[comp.find('>').unwrap() + 1..])
        } else {
            comp.to_string()
        };
        let mut next = Vec::new();
        for dir in &here {
            if pattern.contains('*') {
                for e in fs::read_dir(dir).into_iter().flatten().flatten() {
                    if glob(&pattern, e.file_name().to_str().unwrap_or("")) {
                        next.push(e.path());
                    }
                }
            } else if dir.join(&pattern).exists() {
                next.push(dir.join(&pattern));
            }
        }
        here = next;
    }
    !here.is_empty()
}

/// The repository path a code span or shell word names, if it names one: trailing punctuation,
/// arguments and a `:line` suffix dropped.
fn as_path(word: &str) -> Option<String> {
    let word = word.split_whitespace().next()?;
    if !PATH_TOPS.iter().any(|t| word.starts_with(t)) {
        return None;
    }
    let word = word.trim_end_matches([',', ';', '.', ')', ':']);
    let word = match word.split_once(':') {
        Some((p, line)) if line.chars().all(|c| c.is_ascii_digit() || c == '-' || c == ',') => p,
        _ => word,
    };
    Some(word.to_string())
}

// ---------------------------------------------------------------------------------------------
// API paths, resolved over the sources as text.

/// The public items of a crate, read from its sources.
struct Crate {
    src: PathBuf,
    /// Every source file's text, for members defined in any `impl`.
    all: String,
}

impl Crate {
    fn new(src: PathBuf) -> Crate {
        let mut fs_ = Vec::new();
        files(&src, &[".rs"], &mut fs_);
        let all = fs_.iter().map(|p| read(p)).collect::<Vec<_>>().join("\n");
        Crate { src, all }
    }

    /// The file of module `dir/name`.
    fn module_file(dir: &Path, name: &str) -> Option<PathBuf> {
        [dir.join(format!("{name}.rs")), dir.join(name).join("mod.rs")].into_iter().find(|p| p.is_file())
    }

    /// The directory a module file's submodules live in.
    fn module_dir(file: &Path) -> PathBuf {
        let stem = file.file_stem().unwrap().to_str().unwrap();
        if stem == "mod" || stem == "lib" {
            file.parent().unwrap().to_path_buf()
        } else {
            file.parent().unwrap().join(stem)
        }
    }
}

/// Whether `text` has `word` as a whole identifier somewhere in `hay`.
fn has_ident(hay: &str, word: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    hay.match_indices(word).any(|(i, _)| {
        !hay[..i].chars().next_back().is_some_and(ident) && !hay[i + word.len()..].chars().next().is_some_and(ident)
    })
}

/// Whether some line of `text`, trimmed, starts with one of `prefixes` followed by `name` as a
/// whole identifier.
fn declares(text: &str, prefixes: &[&str], name: &str) -> bool {
    text.lines().map(str::trim_start).any(|l| {
        prefixes.iter().any(|p| {
            l.strip_prefix(p)
                .and_then(|r| r.strip_prefix(name))
                .is_some_and(|r| !r.starts_with(|c: char| c.is_alphanumeric() || c == '_'))
        })
    })
}

const ITEM: [&str; 10] = [
    "pub struct ",
    "pub enum ",
    "pub trait ",
    "pub fn ",
    "pub const ",
    "pub static ",
    "pub type ",
    "pub unsafe fn ",
    "pub mod ",
    "macro_rules! ",
];

/// Whether module `file` makes `name` public: declared there, or re-exported by a `pub use`.
fn module_exports(file: &Path, name: &str) -> bool {
    let text = read(file);
    if declares(&text, &ITEM, name) {
        return true;
    }
    // `pub use a::b::{c, d as e};` possibly over several lines.
    let mut rest = text.as_str();
    while let Some(i) = rest.find("pub use ") {
        let stmt = &rest[i..];
        let end = stmt.find(';').unwrap_or(stmt.len());
        let stmt = &stmt[..end];
        let exported = stmt.split(['{', '}', ',', ':', ' ', '\n']).filter(|s| !s.is_empty()).collect::<Vec<_>>();
        // The last identifier of each leaf, or what follows `as`.
        if exported.contains(&name) {
            return true;
        }
        if stmt.trim_end().ends_with('*') {
            // A glob: `pub use bindings::*` re-exports the module's public items.
            let module = stmt["pub use ".len()..].trim_end_matches("::*").trim();
            let dir = Crate::module_dir(file);
            let leaf = module.rsplit("::").next().unwrap();
            if let Some(f) = Crate::module_file(&dir, leaf) {
                if module_exports(&f, name) {
                    return true;
                }
            }
        }
        rest = &rest[i + end.max(1)..];
    }
    false
}

/// Whether `member` (what follows a public item in a path) is a public function, constant,
/// field or enum variant somewhere in the crate.
fn is_member(krate: &Crate, member: &str) -> bool {
    const FNS: [&str; 6] = ["pub fn ", "pub unsafe fn ", "pub const fn ", "pub const ", "pub static ", "pub "];
    if declares(&krate.all, &FNS, member) {
        return true;
    }
    // A variant: a line `Name,`, `Name(..`, `Name {`, or a trait method `fn name` in a pub trait.
    let variant = member.starts_with(|c: char| c.is_ascii_uppercase())
        && krate.all.lines().map(str::trim_start).any(|l| {
            l.strip_prefix(member)
                .is_some_and(|r| r.is_empty() || r.starts_with([',', '(', ' ', '{']) && !r.starts_with(" =>"))
        });
    variant || declares(&krate.all, &["fn "], member) && krate.all.contains("pub trait ")
}

/// Resolves `seg[0]::seg[1]::...` in `krate` from `lib.rs`: modules, then an item, then members.
fn resolve(krate: &Crate, segs: &[&str], sys: Option<&Crate>) -> Result<(), String> {
    let mut file = krate.src.join("lib.rs");
    for (i, seg) in segs.iter().enumerate() {
        let text = read(&file);
        if *seg == "sys" && text.contains("pub use ascend_sys as sys;") {
            return match sys {
                Some(sys) => resolve(sys, &segs[i + 1..], None),
                None => Ok(()),
            };
        }
        let dir = Crate::module_dir(&file);
        let is_mod = declares(&text, &["pub mod "], seg);
        if is_mod {
            file = Crate::module_file(&dir, seg).ok_or_else(|| format!("module file of `{seg}` not found"))?;
            continue;
        }
        if !module_exports(&file, seg) {
            return Err(format!("`{seg}` is not public in {}", file.strip_prefix(&krate.src).unwrap().display()));
        }
        for member in &segs[i + 1..] {
            if !is_member(krate, member) {
                return Err(format!("`{member}` is not a public member of `{seg}`"));
            }
        }
        return Ok(());
    }
    Ok(())
}

/// `ascend::a::{b, c::d}` → `ascend::a::b`, `ascend::a::c::d`.
fn expand_use(tree: &str) -> Vec<String> {
    // `x as y` keeps `x`: the alias is marked before the blanks go.
    let tree: String = tree.replace(" as ", "@").chars().filter(|c| !c.is_whitespace()).collect();
    fn go(prefix: &str, t: &str, out: &mut Vec<String>) {
        match t.find('{') {
            None => {
                let leaf = t.split('@').next().unwrap_or(t);
                let path = format!("{prefix}{leaf}");
                out.push(path.trim_end_matches("::self").to_string());
            }
            Some(open) => {
                let head = &t[..open];
                let body = &t[open + 1..t.rfind('}').unwrap_or(t.len())];
                let mut depth = 0;
                let mut start = 0;
                for (i, c) in body.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            go(&format!("{prefix}{head}"), &body[start..i], out);
                            start = i + 1;
                        }
                        _ => {}
                    }
                }
                if start < body.len() {
                    go(&format!("{prefix}{head}"), &body[start..], out);
                }
            }
        }
    }
    let mut out = Vec::new();
    go("", &tree, &mut out);
    out.retain(|p| !p.is_empty() && !p.ends_with("::"));
    out
}

/// The `ascend::...` or `ascend_sys::...` paths in a code span (up to the first `(` or space).
fn api_paths(span: &str) -> Vec<String> {
    let mut out = Vec::new();
    for start in ["ascend::", "ascend_sys::"] {
        for (i, _) in span.match_indices(start) {
            if span[..i].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let path: String = span[i..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':' || *c == '{' || *c == '}' || *c == ',')
                .collect();
            let path = path.trim_end_matches(':').to_string();
            if path.contains('{') {
                out.extend(expand_use(&path));
            } else {
                out.push(path);
            }
        }
    }
    out
}

/// `Type::member` pairs in `text` (a span or a Rust block), for types the crate declares.
fn type_members(text: &str) -> Vec<(String, String)> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    for (i, _) in text.match_indices("::") {
        let before = &text[..i];
        let ty: String = before.chars().rev().take_while(|c| ident(*c)).collect::<Vec<_>>().into_iter().rev().collect();
        let start = i - ty.len();
        if ty.is_empty()
            || !ty.starts_with(|c: char| c.is_ascii_uppercase())
            || text[..start].ends_with("::")
            || text[..start].ends_with('.')
        {
            continue;
        }
        let member: String = text[i + 2..].chars().take_while(|c| ident(*c)).collect();
        if !member.is_empty() {
            out.push((ty, member));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The checks.

struct Checker {
    repo: Repo,
    ascend: Crate,
    sys: Option<Crate>,
    /// The code's text, for environment variables (quoted), and the facts' text.
    code: String,
    facts: String,
    /// The crate's features, examples, benches and tests.
    features: BTreeSet<String>,
    failures: Vec<String>,
    /// How many names of each kind were checked (printed, so a check that stopped finding
    /// anything shows).
    counts: [usize; 6],
}

impl Checker {
    fn new() -> Checker {
        let repo = Repo::open();
        let ascend = Crate::new(repo.root.join("src"));
        let sys = repo.sys.as_ref().map(|s| Crate::new(s.join("src")));
        let mut code_files = Vec::new();
        for dir in ["src", "mock", "ascend-sys", "tests", "benches", "examples", ".ci"] {
            files(&repo.root.join(dir), &[".rs", ".c", ".h", ".py", ""], &mut code_files);
        }
        code_files.push(repo.root.join("build.rs"));
        code_files.retain(|p| {
            p.extension().is_none_or(|e| e != "md") && p.file_name().is_some_and(|n| n != "documentation.rs")
        });
        let code = code_files.iter().filter_map(|p| fs::read_to_string(p).ok()).collect::<Vec<_>>().join("\n");
        let mut fact_files = Vec::new();
        files(&repo.root.join("docs/cann"), &[".md"], &mut fact_files);
        let facts = fact_files.iter().map(|p| read(p)).collect::<Vec<_>>().join("\n");
        let manifest = read(&repo.root.join("Cargo.toml"));
        let features = manifest
            .split("[features]")
            .nth(1)
            .unwrap_or("")
            .lines()
            .skip(1)
            .take_while(|l| !l.starts_with('['))
            .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim().to_string()))
            .collect();
        Checker { repo, ascend, sys, code, facts, features, failures: Vec::new(), counts: [0; 6] }
    }

    fn fail(&mut self, doc: &str, line: usize, what: String) {
        self.failures.push(format!("{doc}:{line}: {what}"));
    }

    fn check_path(&mut self, doc: &Doc, line: usize, path: &str) {
        self.counts[0] += 1;
        let from_root = doc.base == self.repo.root;
        if from_root && !self.repo.checkable(path) {
            return;
        }
        if !expand_braces(path).iter().any(|p| path_exists(&doc.base, p)) {
            self.fail(&doc.name, line, format!("`{path}` does not exist"));
        }
    }

    fn check_api(&mut self, doc: &Doc, line: usize, path: &str) {
        self.counts[1] += 1;
        let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
        let r = match segs.first() {
            Some(&"ascend") => resolve(&self.ascend, &segs[1..], self.sys.as_ref()),
            Some(&"ascend_sys") => match &self.sys {
                Some(sys) => resolve(sys, &segs[1..], None),
                None => Ok(()),
            },
            _ => Ok(()),
        };
        if let Err(why) = r {
            self.fail(&doc.name, line, format!("`{path}`: {why}"));
        }
    }

    /// `Type::member` where `Type` is a public type of either crate.
    fn check_members(&mut self, doc: &Doc, line: usize, text: &str) {
        for (ty, member) in type_members(text) {
            let types = ["pub struct ", "pub enum ", "pub trait "];
            let ours = declares(&self.ascend.all, &types, &ty);
            let sys = self.sys.as_ref().is_some_and(|s| declares(&s.all, &types, &ty));
            self.counts[2] += usize::from(ours || sys);
            if (ours && !is_member(&self.ascend, &member))
                || (!ours && sys && !is_member(self.sys.as_ref().unwrap(), &member))
            {
                self.fail(&doc.name, line, format!("`{ty}::{member}`: no public `{member}` in the crate"));
            }
        }
    }

    /// `receiver.method(` in a prose span: `method` is a public function of the crate.
    fn check_method_call(&mut self, doc: &Doc, line: usize, span: &str) {
        let ident = |c: char| c.is_alphanumeric() || c == '_';
        let Some((recv, rest)) = span.split_once('.') else { return };
        if recv.is_empty() || !recv.chars().all(ident) || !recv.starts_with(|c: char| c.is_ascii_lowercase()) {
            return;
        }
        let method: String = rest.chars().take_while(|c| ident(*c)).collect();
        if method.is_empty() || !rest[method.len()..].starts_with('(') {
            return;
        }
        self.counts[2] += 1;
        if !declares(&self.ascend.all, &["pub fn ", "pub unsafe fn "], &method) {
            self.fail(&doc.name, line, format!("`{span}`: no public fn `{method}` in the crate"));
        }
    }

    /// `cargo ... --example X --bench Y --test Z --features F`.
    fn check_cargo(&mut self, doc: &Doc, line: usize, command: &str) {
        let words: Vec<&str> = command.split_whitespace().collect();
        for pair in words.windows(2) {
            let (flag, value) = (pair[0], pair[1]);
            let target = match flag {
                "--example" => Some(format!("examples/{value}.rs")),
                "--bench" => Some(format!("benches/{value}.rs")),
                "--test" => Some(format!("tests/{value}.rs")),
                _ => None,
            };
            if let Some(t) = target {
                self.counts[3] += 1;
                let dir = t.trim_end_matches(".rs").to_string() + "/main.rs";
                if !path_exists(&self.repo.root, &t) && !path_exists(&self.repo.root, &dir) {
                    self.fail(&doc.name, line, format!("`{flag} {value}`: no {t}"));
                }
            }
            if flag == "--features" {
                for f in value.split(',') {
                    if !self.features.contains(f) {
                        self.fail(&doc.name, line, format!("`--features {f}`: no such feature"));
                    }
                }
            }
        }
    }

    /// `ASCEND_*` variables: read by the code (named in a string) or CANN's own (in the facts).
    fn check_env(&mut self, doc: &Doc) {
        for (i, line) in doc.text.lines().enumerate() {
            for (at, _) in line.match_indices("ASCEND_") {
                if line[..at].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let var: String = line[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                self.counts[4] += 1;
                let quoted = format!("\"{var}\"");
                if !self.code.contains(&quoted) && !has_ident(&self.facts, &var) {
                    self.fail(
                        &doc.name,
                        i + 1,
                        format!("`{var}`: read nowhere in the code, and not CANN's (docs/cann)"),
                    );
                }
            }
        }
    }

    /// Bare fact-page names (`ASYNC.md`, `API.md`): a page of `docs/cann/` or `docs/`, or a
    /// root file. A name after `/` is part of a longer path (an upstream page).
    fn check_bare_pages(&mut self, name: &str, text: &str) {
        for (i, line) in text.lines().enumerate() {
            for (at, _) in line.match_indices(".md") {
                let stem: String = line[..at]
                    .chars()
                    .rev()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                let before = line[..at - stem.len()].chars().next_back();
                if stem.is_empty()
                    || !stem.starts_with(|c: char| c.is_ascii_uppercase())
                    || before.is_some_and(|c| c.is_alphanumeric() || c == '/' || c == '_' || c == '-')
                {
                    continue;
                }
                let page = format!("{stem}.md");
                let root = &self.repo.root;
                if ![root.join("docs/cann").join(&page), root.join("docs").join(&page), root.join(&page)]
                    .iter()
                    .any(|p| p.is_file())
                {
                    self.fail(name, i + 1, format!("`{page}` is cited and not in docs/cann/, docs/ or the root"));
                }
            }
        }
    }

    fn check_doc(&mut self, doc: &Doc) {
        for (line, span) in &doc.spans {
            if let Some(path) = as_path(span) {
                self.check_path(doc, *line, &path);
            }
            for api in api_paths(span) {
                self.check_api(doc, *line, &api);
            }
            self.check_members(doc, *line, span);
            self.check_method_call(doc, *line, span);
            if span.starts_with("cargo ") {
                self.check_cargo(doc, *line, span);
            }
        }
        for (info, first, body) in &doc.blocks {
            for (k, l) in body.lines().enumerate() {
                let line = first + 1 + k;
                if info == "rust" {
                    if let Some(tree) = l.trim().strip_prefix("use ").map(|t| t.trim_end_matches(';')) {
                        for api in expand_use(tree) {
                            self.check_api(doc, line, &api);
                        }
                    }
                    let code = l.split("//").next().unwrap_or(l);
                    self.check_members(doc, line, code);
                } else if info == "sh" {
                    for word in l.split_whitespace() {
                        if let Some(path) = as_path(word) {
                            self.check_path(doc, line, &path);
                        }
                    }
                    for command in l.split(['|', ';', '&']) {
                        if command.contains("cargo ") {
                            self.check_cargo(doc, line, command);
                        }
                    }
                }
            }
        }
        self.check_env(doc);
        self.check_bare_pages(&doc.name, &doc.text);
    }

    /// Every `docs/...` path the code cites, and every fact page it names bare.
    fn check_code_citations(&mut self) {
        let mut code_files = Vec::new();
        for dir in ["src", "mock", "ascend-sys", "tests", "benches", "examples", ".ci"] {
            files(&self.repo.root.join(dir), &[".rs", ".c", ".h", ".py", ""], &mut code_files);
        }
        code_files.push(self.repo.root.join("build.rs"));
        let mut fact_files = Vec::new();
        files(&self.repo.root.join("docs"), &[".md"], &mut fact_files);
        for file in code_files.iter().chain(&fact_files) {
            let Ok(text) = fs::read_to_string(file) else { continue };
            let name = file.strip_prefix(&self.repo.root).unwrap().display().to_string();
            if name.ends_with("documentation.rs") {
                continue;
            }
            let is_code = !name.ends_with(".md");
            for (i, line) in text.lines().enumerate() {
                for (at, _) in line.match_indices("docs/") {
                    let before = line[..at].chars().next_back();
                    if !is_code
                        || before.is_some_and(|c| c.is_alphanumeric() || c == '/' || c == '_' || c == '-' || c == '.')
                    {
                        continue;
                    }
                    let path: String =
                        line[at..].chars().take_while(|c| c.is_alphanumeric() || "/._-{},".contains(*c)).collect();
                    let path = path.trim_end_matches(['.', ',', '/']);
                    if path.starts_with("docs/zh/") || path.starts_with("docs/en/") || path == "docs" {
                        continue; // CANN's upstream pages, named with their repository
                    }
                    self.counts[5] += 1;
                    if !expand_braces(path).iter().any(|p| path_exists(&self.repo.root, p)) {
                        self.fail(&name, i + 1, format!("cites `{path}`, which is not in the repository"));
                    }
                }
            }
            self.check_bare_pages(&name, &text);
        }
    }
}

/// Every test binary is listed in `README.md`'s tests table, every example in `README.md`, and
/// every bench in `benches/README.md` (by path: `tests/x.rs` or `tests/x/`).
fn check_listed(c: &mut Checker) {
    let root = c.repo.root.clone();
    let readme = read(&root.join("README.md"));
    let benches = read(&root.join("benches/README.md"));
    for (dir, ext, listed_in, text) in [
        ("tests", "rs", "README.md", &readme),
        ("examples", "rs", "README.md", &readme),
        ("benches", "rs", "benches/README.md", &benches),
    ] {
        for e in fs::read_dir(root.join(dir)).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = if e.path().is_dir() {
                if !e.path().join("main.rs").is_file() {
                    continue; // `tests/common/`, `benches/common/`: shared code, not a target
                }
                format!("{dir}/{name}/")
            } else if name.ends_with(&format!(".{ext}")) {
                format!("{dir}/{name}")
            } else {
                continue;
            };
            c.counts[3] += 1;
            if !text.contains(&format!("`{path}`")) {
                c.failures.push(format!("{listed_in}: `{path}` is not listed"));
            }
        }
    }
}

fn docs(repo: &Repo) -> Vec<Doc> {
    let mut out = Vec::new();
    for (name, base) in [
        ("README.md", repo.root.clone()),
        ("benches/README.md", repo.root.clone()),
        ("docs/DESIGN.md", repo.root.clone()),
    ] {
        out.push(parse(name, base, read(&repo.root.join(name))));
    }
    if let Some(sys) = &repo.sys {
        out.push(parse("ascend-sys/README.md", sys.clone(), read(&sys.join("README.md"))));
    }
    out
}

#[test]
fn the_documentation_names_only_what_exists() {
    let mut c = Checker::new();
    for doc in docs(&c.repo) {
        c.check_doc(&doc);
    }
    c.check_code_citations();
    check_listed(&mut c);
    let [paths, apis, members, targets, vars, cited] = c.counts;
    eprintln!(
        "checked {paths} file paths, {apis} API paths, {members} members and methods, {targets} cargo targets, \
         {vars} ASCEND_* variables, {cited} docs/ citations in the code"
    );
    assert!(paths > 50 && apis > 20 && members > 20 && targets > 5 && vars > 20 && cited > 20, "{:?}", c.counts);
    assert!(c.failures.is_empty(), "{} false names:\n{}", c.failures.len(), c.failures.join("\n"));
}

/// The checks themselves can fail: a planted name of each kind is caught.
#[test]
fn planted_bad_names_are_caught() {
    let mut c = Checker::new();
    let root = c.repo.root.clone();
    let text = "\
A path `src/no_such_file.rs`, a placeholder path `src/ops/<op>/no_such.rs`, a method
`Tensor::no_such_method`, a module path `ascend::no_such_module::Thing`, an item
`ascend::ops::no_such_op`, a variable `ASCEND_NO_SUCH_VARIABLE`, a page NO_SUCH_PAGE.md and
a call `stream.no_such_call()`.

```sh
cargo run --example no_such_example
cargo test --features no_such_feature
```

```rust
use ascend::{Context, ops::{no_such_entry, OutputMask}};
```
";
    let doc = parse("planted.md", root.clone(), text.to_string());
    c.check_doc(&doc);
    let expected = [
        "src/no_such_file.rs",
        "src/ops/<op>/no_such.rs",
        "Tensor::no_such_method",
        "no_such_module",
        "no_such_op",
        "ASCEND_NO_SUCH_VARIABLE",
        "NO_SUCH_PAGE.md",
        "no_such_call",
        "no_such_example",
        "no_such_feature",
        "no_such_entry",
    ];
    for name in expected {
        assert!(c.failures.iter().any(|f| f.contains(name)), "`{name}` not caught: {:#?}", c.failures);
    }
    assert_eq!(c.failures.len(), expected.len(), "only the planted names fail: {:#?}", c.failures);

    // ... while the same kinds of names, spelled right, pass.
    let mut c = Checker::new();
    let text = "\
`src/ops/<op>/mod.rs`, `tests/{api,loader}.rs`, `Tensor::from_slice`, `ascend::ops::batch_norm_stats`,
`ascend::hccl::Communicator::from_env`, `ascend_sys::LoadError::Symbol`, `ASCEND_BACKEND`, API.md,
`stream.synchronize()`.

```rust
use ascend::{Context, ops::{batch_norm_reduce_backward, OutputMask}};
```
";
    c.check_doc(&parse("right.md", root, text.to_string()));
    assert!(c.failures.is_empty(), "{:#?}", c.failures);
}
