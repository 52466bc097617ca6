//! Downloading a model repository from the HuggingFace Hub into hf2q's cache, the way
//! `huggingface_hub.snapshot_download` does, limited to the files a conversion reads.
//!
//! Protocol (the Hub's public HTTP API; `HF_ENDPOINT` replaces `https://huggingface.co`, `HF_TOKEN`
//! is sent as `Authorization: Bearer …`):
//! - `GET {endpoint}/api/models/{repo}/revision/{revision}` lists the files (`siblings[].rfilename`)
//!   and resolves the revision to a commit (`sha`).
//! - `GET {endpoint}/{repo}/resolve/{commit}/{file}` downloads one file, pinned to that commit so the
//!   snapshot is consistent even if the branch moves meanwhile. The Hub redirects LFS files to a
//!   CDN; redirects are followed by hand and the token is sent only to the endpoint's origin (as
//!   `requests` does for `huggingface_hub`, which drops it on a redirect to another host). The
//!   endpoint's response carries `X-Repo-Commit`, `X-Linked-Etag` (LFS: the SHA-256 of the
//!   content), `ETag` and `X-Linked-Size`.
//!
//! Cache layout, under `$HF2Q_CACHE/hub` (default `~/.cache/hf2q/hub`), a simplified version of
//! `huggingface_hub`'s (no separate blob store: the files live in the snapshot folder):
//!
//! ```text
//! models--ORG--NAME/
//!   refs/REVISION                          the commit REVISION resolved to when it was last complete
//!   snapshots/COMMIT/NAME/FILE             a complete, verified file
//!   snapshots/COMMIT/NAME/FILE.incomplete  a partial download, resumed with `Range: bytes=N-`
//! ```
//!
//! The snapshot's files sit in a folder named after the repository (`NAME`) so that converting it
//! derives the same `general.name`/`general.basename` as converting a local clone of the repository
//! (conversion reads them from the directory's name, as `convert_hf_to_gguf.py` does).
//!
//! A file is renamed into place only once complete and, for LFS files, once its SHA-256 matches the
//! Hub's linked ETag; a commit's files never change, so a file present in its snapshot folder is
//! never downloaded again. `refs/REVISION` is written only once every file of the snapshot is in
//! place: with `HF_HUB_OFFLINE=1`, or when the Hub cannot be reached, it names the snapshot to use.

use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// The files a conversion may read, besides the safetensors shards and sentence-transformers
/// pooling configs (downloaded when the repository has them).
pub const WANTED_FILES: &[&str] = &[
    "config.json",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.txt",
    "merges.txt",
    "added_tokens.json",
    "modules.json",
    "README.md",
];

const ATTEMPTS: u32 = 3;
const MAX_REDIRECTS: usize = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HubErrorKind {
    /// Bad input: an invalid repo id, an unknown repository, revision or file, missing credentials.
    Input,
    /// The network or the server failed (connection, timeout, 5xx, a truncated body); retried.
    Network,
    /// The bytes received do not match the Hub's hash or size; the download was discarded.
    Integrity,
    /// A local file could not be read or written.
    Io,
}

#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct HubError {
    pub kind: HubErrorKind,
    pub message: String,
}

impl HubError {
    fn new(kind: HubErrorKind, message: impl Into<String>) -> Self {
        HubError {
            kind,
            message: message.into(),
        }
    }
    fn input(message: impl Into<String>) -> Self {
        Self::new(HubErrorKind::Input, message)
    }
    fn network(message: impl Into<String>) -> Self {
        Self::new(HubErrorKind::Network, message)
    }
    fn io(path: &Path, e: std::io::Error) -> Self {
        Self::new(HubErrorKind::Io, format!("{}: {e}", path.display()))
    }
    /// Whether the user's input (repo id, revision, credentials) is at fault (exit code 3).
    pub fn is_invalid_input(&self) -> bool {
        self.kind == HubErrorKind::Input
    }
}

/// Where to download from and to.
#[derive(Debug, Clone)]
pub struct HubOptions {
    /// The Hub's base URL, without a trailing slash.
    pub endpoint: String,
    /// Sent as `Authorization: Bearer TOKEN` to the endpoint.
    pub token: Option<String>,
    /// The `hub` folder of the cache.
    pub cache_dir: PathBuf,
    /// Use the cache only (`HF_HUB_OFFLINE=1`).
    pub offline: bool,
}

impl HubOptions {
    /// `HF_ENDPOINT` (default `https://huggingface.co`), `HF_TOKEN` and `HF_HUB_OFFLINE`, with the
    /// given cache folder.
    pub fn from_env(cache_dir: PathBuf) -> Self {
        let var = |k: &str| {
            std::env::var(k)
                .ok()
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let endpoint = var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        HubOptions {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token: var("HF_TOKEN"),
            cache_dir,
            offline: var("HF_HUB_OFFLINE")
                .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")),
        }
    }
}

/// Download progress, for a progress bar.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// A file starts (or resumes at `offset`); `size` when the server says it.
    Start {
        file: &'a str,
        offset: u64,
        size: Option<u64>,
    },
    /// `done` bytes of the file are on disk.
    Bytes { file: &'a str, done: u64 },
    /// The file is complete and verified.
    Done { file: &'a str },
}

/// A downloaded snapshot.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The folder holding the files: convert it as a local model directory.
    pub dir: PathBuf,
    /// The commit the revision resolved to.
    pub commit: String,
    /// Files fetched (or completed) by this call.
    pub downloaded: Vec<String>,
    /// Files that were already in the cache.
    pub cached: Vec<String>,
    /// Bytes received by this call.
    pub bytes_downloaded: u64,
}

/// Check a repo id the way `huggingface_hub.validate_repo_id` does: `NAME` or `ORG/NAME`, of
/// letters, digits, `-`, `_` and `.`, without `--` or `..`, not starting or ending with `-` or `.`.
pub fn validate_repo_id(repo: &str) -> Result<(), HubError> {
    let parts: Vec<&str> = repo.split('/').collect();
    let ok = (1..=2).contains(&parts.len())
        && repo.len() <= 96
        && !repo.contains("--")
        && !repo.contains("..")
        && !repo.ends_with(".git")
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                && !p.starts_with(['-', '.'])
                && !p.ends_with(['-', '.'])
        });
    if ok {
        Ok(())
    } else {
        Err(HubError::input(format!(
            "invalid --repo `{repo}`: expected ORG/NAME (letters, digits, `-`, `_`, `.`)"
        )))
    }
}

fn validate_revision(revision: &str) -> Result<(), HubError> {
    let ok = !revision.is_empty()
        && revision.len() <= 256
        && !revision.starts_with('/')
        && !revision.chars().any(|c| c.is_control() || c == '\\')
        && revision.split('/').all(|c| !c.is_empty() && c != "." && c != "..");
    if ok {
        Ok(())
    } else {
        Err(HubError::input(format!("invalid --revision `{revision}`")))
    }
}

/// A relative path inside the snapshot: no absolute paths, `..`, `.` or empty components.
fn safe_relative(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('/')
        && !name.contains('\\')
        && !name.chars().any(|c| c.is_control())
        && name.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
        && !name.ends_with(".incomplete")
}

/// The cache folder of a repository: `models--ORG--NAME`.
pub fn repo_folder(cache_dir: &Path, repo: &str) -> PathBuf {
    cache_dir.join(format!("models--{}", repo.replace('/', "--")))
}

/// The folder holding the files of `repo` at `commit`: `snapshots/COMMIT/NAME`.
fn snapshot_dir(folder: &Path, commit: &str, repo: &str) -> PathBuf {
    let name = repo.rsplit('/').next().unwrap_or(repo);
    folder.join("snapshots").join(commit).join(name)
}

/// Percent-encode everything but unreserved characters (and `/` when `keep_slash`).
fn quote(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn is_commit_hash(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `"abc"`, `W/"abc"` → `abc`, lower-cased.
fn normalize_etag(e: &str) -> String {
    e.trim().trim_start_matches("W/").trim_matches('"').to_ascii_lowercase()
}

/// Download the files of `repo` at `revision` that a conversion needs into the cache, or find them
/// there, and return the snapshot folder.
pub fn download(
    repo: &str,
    revision: &str,
    opts: &HubOptions,
    progress: &mut dyn FnMut(Event),
) -> Result<Snapshot, HubError> {
    validate_repo_id(repo)?;
    validate_revision(revision)?;
    let folder = repo_folder(&opts.cache_dir, repo);
    if opts.offline {
        return cached_snapshot(&folder, repo, revision).ok_or_else(|| {
            HubError::input(format!(
                "{repo}@{revision}: not in the cache ({}) and HF_HUB_OFFLINE is set",
                folder.display()
            ))
        });
    }
    let client = Client::new(opts.token.clone());
    let listing = match list_files(&client, opts, repo, revision) {
        Ok(l) => l,
        Err(e) if e.kind == HubErrorKind::Network => {
            // As huggingface_hub does: the Hub cannot be reached, use the snapshot cached for this revision.
            return cached_snapshot(&folder, repo, revision).ok_or(e);
        }
        Err(e) => return Err(e),
    };
    let commit = listing.commit;
    let files = listing.files;
    if !files.iter().any(|f| f == "config.json") {
        return Err(HubError::input(format!(
            "{repo}@{revision}: no config.json: not a transformers model repository"
        )));
    }
    let snap = snapshot_dir(&folder, &commit, repo);
    let mut dl = Downloader {
        client: &client,
        opts,
        repo,
        commit: &commit,
        snap: &snap,
        progress,
        result: Snapshot {
            dir: snap.clone(),
            commit: commit.clone(),
            downloaded: Vec::new(),
            cached: Vec::new(),
            bytes_downloaded: 0,
        },
    };
    let has = |f: &str| files.iter().any(|x| x == f);
    // Small files first: the index and modules.json decide which other files are needed.
    for f in WANTED_FILES.iter().filter(|f| has(f)) {
        dl.fetch(f)?;
    }
    if has("modules.json") {
        for p in pooling_configs(&snap.join("modules.json")) {
            if has(&p) && safe_relative(&p) {
                dl.fetch(&p)?;
            }
        }
    }
    let shards: Vec<String> = if has("model.safetensors.index.json") {
        let index = snap.join("model.safetensors.index.json");
        let text = std::fs::read_to_string(&index).map_err(|e| HubError::io(&index, e))?;
        let j: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| HubError::input(format!("{repo}: model.safetensors.index.json: malformed JSON: {e}")))?;
        let mut v: Vec<String> = j
            .get("weight_map")
            .and_then(|m| m.as_object())
            .map(|m| m.values().filter_map(|v| v.as_str().map(String::from)).collect())
            .unwrap_or_default();
        v.sort();
        v.dedup();
        if let Some(bad) = v.iter().find(|f| !safe_relative(f)) {
            return Err(HubError::input(format!(
                "{repo}: model.safetensors.index.json names an invalid shard path `{bad}`"
            )));
        }
        v
    } else {
        files
            .iter()
            .filter(|f| !f.contains('/') && f.ends_with(".safetensors") && safe_relative(f))
            .cloned()
            .collect()
    };
    if shards.is_empty() {
        return Err(HubError::input(format!(
            "{repo}@{revision}: no *.safetensors weights (hf2q converts safetensors checkpoints only)"
        )));
    }
    for s in &shards {
        dl.fetch(s)?;
    }
    let result = dl.result;
    if revision != commit {
        let r = folder.join("refs").join(revision);
        let written = r
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|_| std::fs::write(&r, &commit));
        written.map_err(|e| HubError::io(&r, e))?;
    }
    Ok(result)
}

/// The snapshot cached for `revision` (a commit hash, or a name with a `refs/` entry).
fn cached_snapshot(folder: &Path, repo: &str, revision: &str) -> Option<Snapshot> {
    let commit = if is_commit_hash(revision) {
        revision.to_string()
    } else {
        std::fs::read_to_string(folder.join("refs").join(revision))
            .ok()?
            .trim()
            .to_string()
    };
    if !is_commit_hash(&commit) {
        return None;
    }
    let dir = snapshot_dir(folder, &commit, repo);
    dir.join("config.json").is_file().then_some(Snapshot {
        dir,
        commit,
        downloaded: Vec::new(),
        cached: Vec::new(),
        bytes_downloaded: 0,
    })
}

/// `PATH/config.json` for each sentence-transformers pooling module in `modules.json`.
fn pooling_configs(modules: &Path) -> Vec<String> {
    let Some(j) = std::fs::read_to_string(modules)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
    else {
        return Vec::new();
    };
    j.as_array()
        .into_iter()
        .flatten()
        .filter(|m| {
            m.get("type")
                .and_then(|t| t.as_str())
                .is_some_and(|t| t.ends_with("Pooling"))
        })
        .filter_map(|m| m.get("path").and_then(|p| p.as_str()))
        .filter(|p| !p.is_empty())
        .map(|p| format!("{}/config.json", p.trim_end_matches('/')))
        .collect()
}

struct Listing {
    commit: String,
    files: Vec<String>,
}

fn list_files(client: &Client, opts: &HubOptions, repo: &str, revision: &str) -> Result<Listing, HubError> {
    let url = format!(
        "{}/api/models/{}/revision/{}",
        opts.endpoint,
        quote(repo, true),
        quote(revision, false)
    );
    let what = format!("{repo}@{revision}");
    let mut last = None;
    for attempt in 1..=ATTEMPTS {
        let r = client.get(&url, None).and_then(|(resp, _)| {
            if resp.status() != 200 {
                return Err(status_error(&what, None, &resp, opts));
            }
            let text = resp
                .into_string()
                .map_err(|e| HubError::network(format!("{what}: reading the file list from {url}: {e}")))?;
            parse_listing(&text).ok_or_else(|| {
                HubError::network(format!("{what}: unexpected answer from {url} (no `sha` or `siblings`)"))
            })
        });
        match r {
            Err(e) if e.kind == HubErrorKind::Network && attempt < ATTEMPTS => {
                last = Some(e);
                std::thread::sleep(Duration::from_secs(attempt as u64));
            }
            r => return r,
        }
    }
    Err(last.expect("at least one attempt"))
}

fn parse_listing(text: &str) -> Option<Listing> {
    let j: serde_json::Value = serde_json::from_str(text).ok()?;
    let commit = j.get("sha")?.as_str()?.to_string();
    if !is_commit_hash(&commit) {
        return None;
    }
    let files = j
        .get("siblings")?
        .as_array()?
        .iter()
        .filter_map(|s| s.get("rfilename").and_then(|f| f.as_str()).map(String::from))
        .collect();
    Some(Listing { commit, files })
}

/// The error for a non-success HTTP status: 401/403 and 4xx are bad input (exit 3), 5xx, 408 and
/// 429 are network failures (retried, then exit 1).
fn status_error(what: &str, file: Option<&str>, resp: &ureq::Response, opts: &HubOptions) -> HubError {
    let status = resp.status();
    let hub_message = resp
        .header("X-Error-Message")
        .map(|m| format!(": {}", m.trim()))
        .unwrap_or_default();
    let subject = match file {
        Some(f) => format!("{what}: {f}"),
        None => what.to_string(),
    };
    match status {
        401 | 403 if opts.token.is_none() => HubError::input(format!(
            "{subject}: authentication required: set HF_TOKEN (HTTP {status} from {}){hub_message}",
            opts.endpoint
        )),
        401 | 403 => HubError::input(format!(
            "{subject}: access denied with the HF_TOKEN given (HTTP {status} from {}){hub_message}",
            opts.endpoint
        )),
        404 if file.is_none() => HubError::input(format!(
            "{subject}: repository or revision not found on {} (HTTP 404){hub_message}",
            opts.endpoint
        )),
        404 => HubError::input(format!("{subject}: file not found (HTTP 404){hub_message}")),
        408 | 429 => HubError::network(format!("{subject}: HTTP {status} from {}{hub_message}", opts.endpoint)),
        400..=499 => HubError::input(format!("{subject}: HTTP {status} from {}{hub_message}", opts.endpoint)),
        _ => HubError::network(format!("{subject}: HTTP {status} from {}{hub_message}", opts.endpoint)),
    }
}

/// Metadata of a resolve request, from the first response that carries each header (the endpoint's,
/// before any redirect to a CDN).
#[derive(Debug, Default)]
struct Meta {
    commit: Option<String>,
    linked_etag: Option<String>,
    etag: Option<String>,
    linked_size: Option<u64>,
}

impl Meta {
    fn fill(&mut self, r: &ureq::Response) {
        let h = |k: &str| r.header(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        self.commit = self.commit.take().or_else(|| h("X-Repo-Commit"));
        self.linked_etag = self.linked_etag.take().or_else(|| h("X-Linked-Etag"));
        self.etag = self.etag.take().or_else(|| h("ETag"));
        self.linked_size = self
            .linked_size
            .or_else(|| h("X-Linked-Size").and_then(|s| s.parse().ok()));
    }
    /// The SHA-256 the content must have: the linked ETag of an LFS file (64 hex digits). Regular
    /// files' ETags are git blob hashes, which are not checked.
    fn sha256(&self) -> Option<String> {
        let e = normalize_etag(self.linked_etag.as_deref().or(self.etag.as_deref())?);
        (e.len() == 64 && e.bytes().all(|b| b.is_ascii_hexdigit())).then_some(e)
    }
}

struct Client {
    agent: ureq::Agent,
    token: Option<String>,
}

impl Client {
    fn new(token: Option<String>) -> Self {
        let agent = ureq::AgentBuilder::new()
            .redirects(0)
            .timeout_connect(Duration::from_secs(30))
            .timeout_read(Duration::from_secs(120))
            .user_agent(concat!("hf2q/", env!("CARGO_PKG_VERSION")))
            .build();
        Client { agent, token }
    }

    /// GET `url`, following redirects by hand. The token goes only to the first URL's origin
    /// (scheme, host, port): a redirect elsewhere (the Hub's CDN) drops it for good.
    fn get(&self, url: &str, range_from: Option<u64>) -> Result<(ureq::Response, Meta), HubError> {
        let mut current = url::Url::parse(url).map_err(|e| HubError::input(format!("invalid URL `{url}`: {e}")))?;
        let origin = current.origin();
        let mut auth = self.token.is_some();
        let mut meta = Meta::default();
        for _ in 0..=MAX_REDIRECTS {
            auth = auth && current.origin() == origin;
            let mut req = self.agent.request_url("GET", &current);
            if let (true, Some(t)) = (auth, &self.token) {
                req = req.set("Authorization", &format!("Bearer {t}"));
            }
            if let Some(n) = range_from {
                req = req.set("Range", &format!("bytes={n}-"));
            }
            let resp = match req.call() {
                Ok(r) => r,
                Err(ureq::Error::Status(_, r)) => r,
                Err(ureq::Error::Transport(t)) => {
                    let mut detail = t.message().map(|m| format!(": {m}")).unwrap_or_default();
                    if let Some(src) = std::error::Error::source(&t) {
                        detail.push_str(&format!(": {src}"));
                    }
                    return Err(HubError::network(format!(
                        "GET {}: {}{detail}",
                        redact(&current),
                        t.kind()
                    )));
                }
            };
            meta.fill(&resp);
            let status = resp.status();
            if matches!(status, 301 | 302 | 303 | 307 | 308) {
                let loc = resp.header("Location").ok_or_else(|| {
                    HubError::network(format!("GET {}: HTTP {status} without a Location", redact(&current)))
                })?;
                current = current
                    .join(loc)
                    .map_err(|e| HubError::network(format!("GET {}: bad redirect `{loc}`: {e}", redact(&current))))?;
                continue;
            }
            return Ok((resp, meta));
        }
        Err(HubError::network(format!(
            "GET {url}: more than {MAX_REDIRECTS} redirects"
        )))
    }
}

/// A URL for messages: without its query (CDN URLs carry signatures there).
fn redact(u: &url::Url) -> String {
    let mut u = u.clone();
    u.set_query(None);
    u.to_string()
}

struct Downloader<'a> {
    client: &'a Client,
    opts: &'a HubOptions,
    repo: &'a str,
    commit: &'a str,
    snap: &'a Path,
    progress: &'a mut dyn FnMut(Event),
    result: Snapshot,
}

impl Downloader<'_> {
    /// Make sure `file` is in the snapshot folder: present already, or downloaded (resuming a
    /// partial download), verified and renamed into place. Network failures are retried.
    fn fetch(&mut self, file: &str) -> Result<(), HubError> {
        let target = self.snap.join(file);
        if target.is_file() {
            self.result.cached.push(file.to_string());
            return Ok(());
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| HubError::io(parent, e))?;
        }
        let mut part = target.clone().into_os_string();
        part.push(".incomplete");
        let part = PathBuf::from(part);
        for attempt in 1..=ATTEMPTS {
            match self.try_fetch(file, &target, &part) {
                Ok(bytes) => {
                    self.result.downloaded.push(file.to_string());
                    self.result.bytes_downloaded += bytes;
                    (self.progress)(Event::Done { file });
                    return Ok(());
                }
                Err(e) if e.kind == HubErrorKind::Network && attempt < ATTEMPTS => {
                    std::thread::sleep(Duration::from_secs(attempt as u64));
                }
                Err(e) => return Err(e),
            }
        }
        unreachable!("the last attempt returns")
    }

    /// One attempt; returns the bytes received.
    fn try_fetch(&mut self, file: &str, target: &Path, part: &Path) -> Result<u64, HubError> {
        let url = format!(
            "{}/{}/resolve/{}/{}",
            self.opts.endpoint,
            quote(self.repo, true),
            quote(self.commit, false),
            quote(file, true)
        );
        let repo = self.repo;
        let offset = std::fs::metadata(part).map(|m| m.len()).unwrap_or(0);
        let (resp, meta) = self.client.get(&url, (offset > 0).then_some(offset))?;
        let status = resp.status();
        let start = match status {
            200 => 0,
            206 if content_range_start(resp.header("Content-Range")) == Some(offset) => offset,
            206 => {
                let _ = std::fs::remove_file(part);
                return Err(HubError::network(format!(
                    "{repo}: {file}: the server answered `Range: bytes={offset}-` with `Content-Range: {}`; starting over",
                    resp.header("Content-Range").unwrap_or("")
                )));
            }
            416 => {
                // The partial file is not shorter than the file: start over.
                let _ = std::fs::remove_file(part);
                return Err(HubError::network(format!(
                    "{repo}: {file}: partial download of {offset} bytes not resumable (HTTP 416); starting over"
                )));
            }
            _ => return Err(status_error(repo, Some(file), &resp, self.opts)),
        };
        let content_length = resp.header("Content-Length").and_then(|v| v.trim().parse::<u64>().ok());
        let size = meta.linked_size.or(content_length.map(|n| n + start));
        let expected_sha = meta.sha256();

        let mut hasher = Sha256::new();
        let mut out = if start > 0 {
            // Hash the bytes already there, then append.
            let mut f = std::fs::File::open(part).map_err(|e| HubError::io(part, e))?;
            let n = std::io::copy(&mut (&mut f).take(start), &mut hasher).map_err(|e| HubError::io(part, e))?;
            if n != start {
                return Err(HubError::io(part, std::io::ErrorKind::UnexpectedEof.into()));
            }
            std::fs::OpenOptions::new().append(true).open(part)
        } else {
            std::fs::File::create(part)
        }
        .map_err(|e| HubError::io(part, e))?;

        (self.progress)(Event::Start {
            file,
            offset: start,
            size,
        });
        let mut reader = resp.into_reader();
        let mut buf = vec![0u8; 1 << 20];
        let mut done = start;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Keep what arrived: the next attempt resumes from there.
                    let _ = out.flush();
                    return Err(HubError::network(format!(
                        "{repo}: {file}: download interrupted at {done} bytes: {e}"
                    )));
                }
            };
            out.write_all(&buf[..n]).map_err(|e| HubError::io(part, e))?;
            hasher.update(&buf[..n]);
            done += n as u64;
            (self.progress)(Event::Bytes { file, done });
        }
        out.sync_all().map_err(|e| HubError::io(part, e))?;
        drop(out);
        if let Some(size) = size {
            if done < size {
                return Err(HubError::network(format!(
                    "{repo}: {file}: download ended at {done} of {size} bytes"
                )));
            }
            if done > size {
                let _ = std::fs::remove_file(part);
                return Err(HubError::new(
                    HubErrorKind::Integrity,
                    format!("{repo}: {file}: received {done} bytes, expected {size}; the download was discarded"),
                ));
            }
        }
        if let Some(expected) = expected_sha {
            let actual = format!("{:x}", hasher.finalize());
            if actual != expected {
                let _ = std::fs::remove_file(part);
                return Err(HubError::new(
                    HubErrorKind::Integrity,
                    format!(
                        "{repo}: {file}: SHA-256 mismatch: expected {expected} (X-Linked-Etag), got {actual}; the download was discarded"
                    ),
                ));
            }
        }
        std::fs::rename(part, target).map_err(|e| HubError::io(target, e))?;
        Ok(done - start)
    }
}

/// The first byte of `Content-Range: bytes START-END/TOTAL`.
fn content_range_start(h: Option<&str>) -> Option<u64> {
    let rest = h?.trim().strip_prefix("bytes")?.trim_start();
    rest.split('-').next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids() {
        for ok in ["test/llama", "Qwen/Qwen3-0.6B", "gpt2", "a_b/c.d-e"] {
            assert!(validate_repo_id(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "/x", "a/b/c", "a//b", "../x", "a/..", "a--b/c", "a/b.git", "a b/c", "-a/b", "a/b.",
        ] {
            assert!(validate_repo_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn revisions_and_paths() {
        assert!(validate_revision("main").is_ok());
        assert!(validate_revision("refs/pr/1").is_ok());
        assert!(validate_revision("../x").is_err());
        assert!(validate_revision("").is_err());
        assert!(safe_relative("1_Pooling/config.json"));
        assert!(!safe_relative("../config.json"));
        assert!(!safe_relative("/etc/passwd"));
        assert!(!safe_relative("a//b"));
    }

    #[test]
    fn quoting_and_headers() {
        assert_eq!(quote("refs/pr/1", false), "refs%2Fpr%2F1");
        assert_eq!(quote("1_Pooling/config.json", true), "1_Pooling/config.json");
        assert_eq!(quote("a b", true), "a%20b");
        assert_eq!(normalize_etag("\"ABC\""), "abc");
        assert_eq!(normalize_etag("W/\"abc\""), "abc");
        assert_eq!(content_range_start(Some("bytes 100-199/200")), Some(100));
        assert_eq!(content_range_start(Some("bytes */200")), None);
        assert_eq!(content_range_start(None), None);
    }

    #[test]
    fn listing() {
        let l = parse_listing(
            r#"{"sha":"0123456789abcdef0123456789abcdef01234567","siblings":[{"rfilename":"config.json"}]}"#,
        )
        .unwrap();
        assert_eq!(l.files, vec!["config.json"]);
        assert!(parse_listing(r#"{"siblings":[]}"#).is_none());
    }
}
