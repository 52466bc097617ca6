//! A `hf2q serve` child process for the server tests and a few lines of HTTP/1.1 over a TCP
//! socket to talk to it (no client library needed).

use super::smollm2;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    pub child: Child,
    pub addr: String,
}

/// The hf2q binary under test: this build's, or `HF2Q_TEST_BIN` (to run the server tests against
/// another build, e.g. to see a regression test fail on the code before its fix).
pub fn bin() -> PathBuf {
    std::env::var_os("HF2Q_TEST_BIN")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_hf2q")))
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        Server::start_with(&[smollm2()], extra)
    }

    pub fn start_with(models: &[PathBuf], extra: &[&str]) -> Server {
        Server::start_env(models, extra, &[])
    }

    /// The same with extra environment variables (a Hub endpoint, a cache directory).
    pub fn start_env(models: &[PathBuf], extra: &[&str], env: &[(&str, String)]) -> Server {
        let mut cmd = Command::new(bin());
        cmd.arg("serve");
        for m in models {
            cmd.arg("-m").arg(m);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .args(["--port", "0", "-t", "2"])
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = loop {
            let line = lines.next().expect("server exited").unwrap();
            if let Some(a) = line.strip_prefix("hf2q serve: listening on http://") {
                break a.to_string();
            }
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        let s = Server { child, addr };
        let t = Instant::now();
        while s.request("GET", "/readyz", None, None).0 != 200 {
            assert!(t.elapsed() < Duration::from_secs(120), "model did not load");
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    }

    /// (status, headers, body) with chunked bodies decoded.
    pub fn request(&self, method: &str, path: &str, body: Option<&str>, key: Option<&str>) -> (u16, String, String) {
        let mut c = TcpStream::connect(&self.addr).unwrap();
        let body = body.unwrap_or("");
        let auth = key
            .map(|k| format!("Authorization: Bearer {k}\r\n"))
            .unwrap_or_default();
        write!(
            c,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = Vec::new();
        c.read_to_end(&mut raw).unwrap();
        split_response(&String::from_utf8(raw).unwrap())
    }

    pub fn json(&self, method: &str, path: &str, body: Value, key: Option<&str>) -> (u16, Value) {
        let (st, _, b) = self.request(method, path, Some(&body.to_string()), key);
        (
            st,
            serde_json::from_str(&b).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {b}")),
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The data of a chunked body; a body cut short (a client that stopped reading) gives what
/// arrived whole.
pub fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    loop {
        let Some((len, rest)) = s.split_once("\r\n") else {
            return out;
        };
        let Ok(n) = usize::from_str_radix(len.trim(), 16) else {
            return out;
        };
        if n == 0 || rest.len() < n {
            return out;
        }
        out.push_str(&rest[..n]);
        s = rest.get(n + 2..).unwrap_or("");
    }
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send raw bytes and read what comes back until the server closes the connection or
    /// `wait` passes.
    pub fn raw(&self, bytes: &[u8], wait: Duration) -> String {
        let mut c = TcpStream::connect(&self.addr).unwrap();
        c.set_read_timeout(Some(wait)).unwrap();
        c.write_all(bytes).unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        let t = Instant::now();
        while t.elapsed() < wait {
            match c.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// The value of one sample of `/metrics` (`name{labels}` as printed), if present.
    pub fn metric(&self, sample: &str) -> Option<f64> {
        let m = self.request("GET", "/metrics", None, None).2;
        m.lines()
            .find_map(|l| l.strip_prefix(sample).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
    }

    /// Wait until `sample` reads `want` (the engine updates its gauges just after a reply).
    pub fn wait_metric(&self, sample: &str, want: f64, limit: Duration) {
        let t = Instant::now();
        loop {
            let got = self.metric(sample);
            if got == Some(want) {
                return;
            }
            assert!(t.elapsed() < limit, "{sample} is {got:?}, expected {want}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A head and body split of a raw HTTP/1.1 response (chunked bodies decoded).
pub fn split_response(raw: &str) -> (u16, String, String) {
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap_or((raw, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    (status, head.to_string(), body)
}

/// CPU seconds (user + system) a process has used, from /proc.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // The kernel reports in clock ticks of USER_HZ, 100 on Linux.
    ticks / 100.0
}

/// Resident memory of a process in bytes, from /proc.
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

/// all-MiniLM-L6-v2 converted by hf2q to F16 GGUF in `dir`.
pub fn minilm_gguf(dir: &std::path::Path) -> PathBuf {
    let out = dir.join("minilm.gguf");
    let st = Command::new(bin())
        .arg("convert")
        .arg(super::minilm_dir())
        .args(["--quant", "f16", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    out
}

/// The JSON error object of an error response, or a panic naming what came back instead.
pub fn error_object(status: u16, head: &str, body: &str) -> Value {
    assert!(status >= 400, "not an error: {status} {head}");
    assert!(
        head.to_ascii_lowercase().contains("content-type: application/json"),
        "{status}: not JSON: {head}\n{body}"
    );
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{status}: {e}: {body:?}"));
    assert!(v["error"]["message"].is_string(), "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
    v
}

/// The assistant text of a chat completion's body: the message's content, or the streamed
/// deltas' contents joined.
#[allow(dead_code)]
pub fn chat_text(body: &str, streamed: bool) -> String {
    if streamed {
        body.split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .filter(|e| *e != "[DONE]")
            .filter_map(|e| serde_json::from_str::<serde_json::Value>(e).ok())
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_string))
            .collect()
    } else {
        serde_json::from_str::<serde_json::Value>(body).unwrap()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    }
}
