//! `hf2q convert --repo`: downloads from a local HTTP server that speaks the HuggingFace Hub's API
//! (`/api/models/{repo}/revision/{rev}`, `/{repo}/resolve/{rev}/{file}` with `X-Repo-Commit`,
//! `X-Linked-Etag`, a redirect of the LFS file to a "CDN" on another host name, `Range` requests),
//! serving the tiny llama fixture. The converted file matches converting the directory; a second run
//! downloads nothing; a partial download resumes; a corrupted transfer is rejected; an unknown repo
//! and missing credentials exit 3; the token goes to the endpoint and not to the CDN.

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const LFS: &str = "model.safetensors";

fn llama_fixture() -> PathBuf {
    let base = match std::env::var_os("HF2Q_FIXTURES") {
        Some(d) => PathBuf::from(d).join("tiny"),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../convert/tests/data/tiny"),
    };
    let p = base.join("llama");
    assert!(p.join("config.json").is_file(), "{} missing", p.display());
    p
}

fn sha256_hex(b: &[u8]) -> String {
    format!("{:x}", Sha256::digest(b))
}

/// One request the server received.
#[derive(Debug, Clone)]
struct Req {
    path: String,
    host: String,
    auth: Option<String>,
    range: Option<String>,
}

#[derive(Default)]
struct Config {
    /// Serve these bytes for the LFS file instead of the real ones (the linked ETag stays right).
    corrupt: bool,
    /// Require `Authorization: Bearer TOKEN` on the endpoint (not on the CDN).
    token: Option<String>,
}

/// A minimal HTTP/1.1 server on 127.0.0.1 speaking the Hub's resolve API; stops when dropped.
struct Hub {
    port: u16,
    log: Arc<Mutex<Vec<Req>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Hub {
    fn start(config: Config) -> Hub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut files = BTreeMap::new();
        for e in std::fs::read_dir(llama_fixture()).unwrap() {
            let p = e.unwrap().path();
            files.insert(
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            );
        }
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (log2, stop2) = (log.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        let _ = serve(s, port, &files, &config, &log2);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Err(_) => break,
                }
            }
        });
        Hub {
            port,
            log,
            stop,
            thread: Some(thread),
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn requests(&self) -> Vec<Req> {
        self.log.lock().unwrap().clone()
    }

    /// `hf2q ARGS` against this server, with the cache in `cache`.
    fn hf2q(&self, cache: &Path, token: Option<&str>, args: &[&str]) -> Output {
        let mut c = Command::new(env!("CARGO_BIN_EXE_hf2q"));
        c.args(args)
            .env("HF_ENDPOINT", self.endpoint())
            .env("HF2Q_CACHE", cache)
            .env_remove("HF_TOKEN")
            .env_remove("HF_HUB_OFFLINE");
        if let Some(t) = token {
            c.env("HF_TOKEN", t);
        }
        c.output().expect("run hf2q")
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn respond(s: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    s.flush()
}

fn serve(
    mut s: TcpStream,
    port: u16,
    files: &BTreeMap<String, Vec<u8>>,
    config: &Config,
    log: &Mutex<Vec<Req>>,
) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut r = BufReader::new(s.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let req = Req {
        path: path.clone(),
        host: headers.get("host").cloned().unwrap_or_default(),
        auth: headers.get("authorization").cloned(),
        range: headers.get("range").cloned(),
    };
    log.lock().unwrap().push(req.clone());

    let authorized = match &config.token {
        Some(t) => req.auth.as_deref() == Some(&format!("Bearer {t}")),
        None => true,
    };
    let commit = ("X-Repo-Commit", COMMIT.to_string());
    // The "CDN": another host name for the same server, no authentication, Range support.
    if let Some(name) = path.strip_prefix("/cdn/").map(|p| p.split('?').next().unwrap_or(p)) {
        let Some(data) = files.get(name) else {
            return respond(&mut s, "404 Not Found", &[], b"");
        };
        let mut data = data.clone();
        if config.corrupt {
            let n = data.len();
            data[n / 2] ^= 0xff;
        }
        let from = req
            .range
            .as_deref()
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.strip_suffix('-'))
            .and_then(|n| n.parse::<usize>().ok());
        return match from {
            Some(n) if n >= data.len() => respond(
                &mut s,
                "416 Range Not Satisfiable",
                &[("Content-Range", format!("bytes */{}", data.len()))],
                b"",
            ),
            Some(n) => respond(
                &mut s,
                "206 Partial Content",
                &[("Content-Range", format!("bytes {n}-{}/{}", data.len() - 1, data.len()))],
                &data[n..],
            ),
            None => respond(&mut s, "200 OK", &[], &data),
        };
    }
    if !authorized {
        return respond(
            &mut s,
            "401 Unauthorized",
            &[("X-Error-Code", "RepoNotFound".to_string())],
            b"{\"error\":\"Invalid credentials\"}",
        );
    }
    for rev in ["main", COMMIT] {
        if path == format!("/api/models/test/llama/revision/{rev}") {
            let siblings: Vec<_> = files.keys().map(|f| serde_json::json!({"rfilename": f})).collect();
            let body = serde_json::json!({"id": "test/llama", "sha": COMMIT, "siblings": siblings}).to_string();
            return respond(
                &mut s,
                "200 OK",
                &[("Content-Type", "application/json".into())],
                body.as_bytes(),
            );
        }
        if let Some(name) = path.strip_prefix(&format!("/test/llama/resolve/{rev}/")) {
            let Some(data) = files.get(name) else {
                return respond(
                    &mut s,
                    "404 Not Found",
                    &[("X-Error-Code", "EntryNotFound".into())],
                    b"",
                );
            };
            if name == LFS {
                let sha = sha256_hex(data);
                return respond(
                    &mut s,
                    "302 Found",
                    &[
                        commit,
                        ("X-Linked-Etag", format!("\"{sha}\"")),
                        ("X-Linked-Size", data.len().to_string()),
                        ("ETag", "\"abcdef0123456789abcdef0123456789abcdef01\"".into()),
                        (
                            "Location",
                            format!("http://localhost:{port}/cdn/{name}?X-Amz-Signature=x"),
                        ),
                    ],
                    b"",
                );
            }
            return respond(
                &mut s,
                "200 OK",
                &[commit, ("ETag", "\"abcdef0123456789abcdef0123456789abcdef01\"".into())],
                data,
            );
        }
    }
    respond(
        &mut s,
        "404 Not Found",
        &[("X-Error-Message", "Repository not found".into())],
        b"",
    )
}

fn snapshot(cache: &Path) -> PathBuf {
    cache
        .join("hub/models--test--llama/snapshots")
        .join(COMMIT)
        .join("llama")
}

fn convert_repo(hub: &Hub, cache: &Path, out: &Path, token: Option<&str>) -> Output {
    hub.hf2q(
        cache,
        token,
        &["convert", "--repo", "test/llama", "-o", out.to_str().unwrap()],
    )
}

fn file_requests(hub: &Hub) -> Vec<Req> {
    hub.requests()
        .into_iter()
        .filter(|r| !r.path.starts_with("/api/"))
        .collect()
}

#[test]
fn converts_like_the_local_directory_and_caches() {
    let hub = Hub::start(Config::default());
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let (a, b) = (tmp.path().join("repo.gguf"), tmp.path().join("dir.gguf"));
    let o = convert_repo(&hub, &cache, &a, None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = hub.hf2q(
        &cache,
        None,
        &["convert", llama_fixture().to_str().unwrap(), "-o", b.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
        "--repo output differs"
    );

    // Cache layout: the snapshot holds what conversion needs, not the rest; refs/main names it.
    let snap = snapshot(&cache);
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        assert_eq!(
            std::fs::read(snap.join(f)).unwrap(),
            std::fs::read(llama_fixture().join(f)).unwrap(),
            "{f}"
        );
    }
    assert!(!snap.join("build_info.json").exists(), "unneeded file downloaded");
    assert_eq!(
        std::fs::read_to_string(cache.join("hub/models--test--llama/refs/main")).unwrap(),
        COMMIT
    );
    let leftovers: Vec<_> = std::fs::read_dir(&snap)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".incomplete"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // The LFS file came through the redirect to the CDN, pinned to the commit.
    let reqs = file_requests(&hub);
    assert!(
        reqs.iter()
            .any(|r| r.path == format!("/test/llama/resolve/{COMMIT}/{LFS}")),
        "{reqs:?}"
    );
    assert!(
        reqs.iter().any(|r| r.path.starts_with("/cdn/model.safetensors")),
        "{reqs:?}"
    );

    // A second run downloads nothing: one listing request, no file requests.
    let n_before = hub.requests().len();
    let files_before = file_requests(&hub).len();
    let o = convert_repo(&hub, &cache, &a, None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(file_requests(&hub).len(), files_before, "second run downloaded files");
    assert_eq!(hub.requests().len(), n_before + 1, "{:?}", &hub.requests()[n_before..]);
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap());
}

#[test]
fn offline_and_unreachable_use_the_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let out = tmp.path().join("out.gguf");
    let args = ["convert", "--repo", "test/llama", "-o", out.to_str().unwrap()];
    // Nothing cached and the Hub unreachable: a network failure, exit 1.
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://127.0.0.1:{}", l.local_addr().unwrap().port())
    };
    let run = |endpoint: &str, offline: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_hf2q"));
        c.args(args)
            .env("HF_ENDPOINT", endpoint)
            .env("HF2Q_CACHE", &cache)
            .env_remove("HF_TOKEN");
        if offline {
            c.env("HF_HUB_OFFLINE", "1");
        } else {
            c.env_remove("HF_HUB_OFFLINE");
        }
        c.output().unwrap()
    };
    let o = run(&dead, false);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("test/llama") || err.contains("/api/models/test/llama"),
        "{err}"
    );
    let o = run(&dead, true);
    assert_eq!(o.status.code(), Some(3), "{}", String::from_utf8_lossy(&o.stderr));
    // Once downloaded, the cached snapshot serves offline and when the Hub cannot be reached.
    let hub = Hub::start(Config::default());
    let o = convert_repo(&hub, &cache, &out, None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let first = std::fs::read(&out).unwrap();
    drop(hub);
    for offline in [true, false] {
        std::fs::remove_file(&out).unwrap();
        let o = run(&dead, offline);
        assert!(
            o.status.success(),
            "offline={offline}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(std::fs::read(&out).unwrap() == first);
    }
}

#[test]
fn resumes_a_partial_download() {
    let hub = Hub::start(Config::default());
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let full = std::fs::read(llama_fixture().join(LFS)).unwrap();
    let half = full.len() / 2;
    let snap = snapshot(&cache);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::write(snap.join("model.safetensors.incomplete"), &full[..half]).unwrap();
    let out = tmp.path().join("out.gguf");
    let o = convert_repo(&hub, &cache, &out, None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ranged: Vec<_> = hub.requests().into_iter().filter(|r| r.range.is_some()).collect();
    assert!(
        ranged
            .iter()
            .any(|r| r.path.starts_with("/cdn/") && r.range.as_deref() == Some(&format!("bytes={half}-"))),
        "no Range request to the CDN: {ranged:?}"
    );
    assert!(std::fs::read(snap.join(LFS)).unwrap() == full, "resumed file differs");
    assert!(!snap.join("model.safetensors.incomplete").exists());
}

#[test]
fn corrupted_download_is_rejected_and_discarded() {
    let hub = Hub::start(Config {
        corrupt: true,
        ..Default::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let out = tmp.path().join("out.gguf");
    let o = convert_repo(&hub, &cache, &out, None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let mut bad = std::fs::read(llama_fixture().join(LFS)).unwrap();
    let good_sha = sha256_hex(&bad);
    let n = bad.len();
    bad[n / 2] ^= 0xff;
    let bad_sha = sha256_hex(&bad);
    assert!(err.contains("test/llama") && err.contains(LFS), "{err}");
    assert!(
        err.contains("SHA-256 mismatch") && err.contains(&good_sha) && err.contains(&bad_sha),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let snap = snapshot(&cache);
    assert!(!snap.join(LFS).exists() && !snap.join("model.safetensors.incomplete").exists());
    assert!(!out.exists());
    assert!(!cache.join("hub/models--test--llama/refs/main").exists());
}

#[test]
fn bad_input_exits_3() {
    let hub = Hub::start(Config::default());
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let out = tmp.path().join("out.gguf");
    let o = hub.hf2q(
        &cache,
        None,
        &["convert", "--repo", "test/nope", "-o", out.to_str().unwrap()],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("test/nope") && err.contains("not found") && err.contains("404"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let o = hub.hf2q(
        &cache,
        None,
        &[
            "convert",
            "--repo",
            "test/llama",
            "--revision",
            "v9",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(3), "{}", String::from_utf8_lossy(&o.stderr));
    for (args, msg) in [
        (vec!["convert", "--repo", "a/b/c", "-o", "x.gguf"], "invalid --repo"),
        (vec!["convert", "--repo", "../x", "-o", "x.gguf"], "invalid --repo"),
        (
            vec!["convert", "some/dir", "--repo", "test/llama", "-o", "x.gguf"],
            "not both",
        ),
        (vec!["convert", "-o", "x.gguf"], "DIR or --repo"),
        (
            vec!["convert", ".", "--revision", "main", "-o", "x.gguf"],
            "--repo only",
        ),
    ] {
        let o = hub.hf2q(&cache, None, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "{args:?}: {err}");
        assert!(err.contains(msg), "{args:?}: {err}");
    }
    assert!(!out.exists());
}

#[test]
fn token_goes_to_the_endpoint_only() {
    let hub = Hub::start(Config {
        token: Some("hf_secret".into()),
        ..Default::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let out = tmp.path().join("out.gguf");
    let o = convert_repo(&hub, &cache, &out, None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("authentication required: set HF_TOKEN") && err.contains("401"),
        "{err}"
    );

    let before = hub.requests().len();
    let o = convert_repo(&hub, &cache, &out, Some("hf_secret"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let reqs = &hub.requests()[before..];
    let (cdn, endpoint): (Vec<&Req>, Vec<&Req>) = reqs.iter().partition(|r| r.path.starts_with("/cdn/"));
    assert!(!cdn.is_empty() && !endpoint.is_empty());
    for r in endpoint {
        assert_eq!(r.auth.as_deref(), Some("Bearer hf_secret"), "{r:?}");
        assert!(r.host.starts_with("127.0.0.1:"), "{r:?}");
    }
    for r in cdn {
        assert!(r.host.starts_with("localhost:"), "{r:?}");
        assert_eq!(r.auth, None, "token forwarded to another host: {r:?}");
    }
}

mod common;

/// `hf2q serve --model ORG/NAME`: downloads the repository, converts it once into the cache (a
/// model under 2B parameters to Q8_0), serves it as ORG/NAME; a restart serves the cached file
/// without downloading or converting again. An unknown quantization type is a clear error.
#[test]
fn serve_a_hub_repository_by_name() {
    let hub = Hub::start(Config::default());
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let env = [
        ("HF_ENDPOINT", hub.endpoint()),
        ("HF2Q_CACHE", cache.to_string_lossy().into_owned()),
    ];
    let gguf = cache.join("models/test--llama").join(COMMIT).join("llama.Q8_0.gguf");
    let mtime = {
        let s = common::server::Server::start_env(&[PathBuf::from("test/llama")], &["-c", "256"], &env);
        let (st, r) = s.json("GET", "/v1/models", serde_json::json!({}), None);
        assert_eq!(st, 200, "{r}");
        assert_eq!(r["data"][0]["id"], "test/llama", "{r}");
        let (st, r) = s.json(
            "POST",
            "/v1/completions",
            serde_json::json!({"model": "test/llama", "prompt": [1, 2, 3], "max_tokens": 2}),
            None,
        );
        assert_eq!(st, 200, "{r}");
        assert!(gguf.is_file(), "{} missing", gguf.display());
        std::fs::metadata(&gguf).unwrap().modified().unwrap()
    };
    let downloads = file_requests(&hub).len();
    assert!(downloads > 0);
    {
        let s = common::server::Server::start_env(&[PathBuf::from("test/llama")], &["-c", "256"], &env);
        let (st, _) = s.json("GET", "/v1/models", serde_json::json!({}), None);
        assert_eq!(st, 200);
    }
    assert_eq!(
        file_requests(&hub).len(),
        downloads,
        "the second start downloaded files"
    );
    assert_eq!(
        std::fs::metadata(&gguf).unwrap().modified().unwrap(),
        mtime,
        "converted twice"
    );
    let out = hub.hf2q(&cache, None, &["serve", "-m", "test/llama:Q9_Z", "--port", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("Q9_Z"), "{err}");
}
