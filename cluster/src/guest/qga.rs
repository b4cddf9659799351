//! A client of qemu's guest agent (qemu-ga in the guest, a virtio serial port on the guest's
//! side, a unix socket on the host's): the host runs commands and writes files in the guest
//! without any network path into it. One JSON command per line, one JSON answer per line.
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{Error, Result};

pub struct Agent {
    path: PathBuf,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

/// What a command run in the guest returned.
#[derive(Debug)]
pub struct Exited {
    pub code: i64,
    pub stdout: String,
    pub stderr: String,
}

impl Agent {
    /// Connects and synchronises (a guest-sync with a fresh id skips whatever an earlier client
    /// left unread).
    pub fn connect(path: &Path, timeout: Duration) -> Result<Self> {
        let stream = UnixStream::connect(path).map_err(Error::io(path))?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(Error::io(path))?;
        let writer = stream.try_clone().map_err(Error::io(path))?;
        let mut a = Self {
            path: path.to_path_buf(),
            reader: BufReader::new(stream),
            writer,
        };
        let id = u64::from(std::process::id()) << 20 | u64::from(fastish_nonce());
        a.send(&json!({"execute": "guest-sync", "arguments": {"id": id}}))?;
        loop {
            let v = a.read()?;
            if v["return"] == json!(id) {
                return Ok(a);
            }
        }
    }

    fn send(&mut self, cmd: &Value) -> Result<()> {
        let mut line = cmd.to_string();
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .map_err(Error::io(&self.path))
    }

    fn read(&mut self) -> Result<Value> {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self
                .reader
                .read_line(&mut line)
                .map_err(Error::io(&self.path))?;
            if n == 0 {
                return Err(Error::Command {
                    what: "qemu guest agent".into(),
                    detail: "connection closed".into(),
                });
            }
            // A sync's answer may be preceded by a stray byte (0xff) the agent sends to resync.
            let t = line.trim_start_matches(|c: char| c != '{').trim();
            if t.is_empty() {
                continue;
            }
            return serde_json::from_str(t).map_err(|e| Error::Command {
                what: "qemu guest agent".into(),
                detail: format!("not JSON ({e}): {t}"),
            });
        }
    }

    /// Runs one command and returns its `return` value.
    pub fn call(&mut self, execute: &str, arguments: Value) -> Result<Value> {
        self.send(&json!({"execute": execute, "arguments": arguments}))?;
        let v = self.read()?;
        if let Some(e) = v.get("error") {
            return Err(Error::Command {
                what: format!("guest agent {execute}"),
                detail: e.to_string(),
            });
        }
        Ok(v["return"].clone())
    }

    /// Starts `path args…` in the guest and returns its pid there (its output discarded).
    pub fn spawn(&mut self, path: &str, args: &[&str]) -> Result<i64> {
        self.start(path, args, false)
    }

    fn start(&mut self, path: &str, args: &[&str], capture: bool) -> Result<i64> {
        let r = self.call(
            "guest-exec",
            json!({"path": path, "arg": args, "capture-output": capture}),
        )?;
        r["pid"].as_i64().ok_or_else(|| Error::Command {
            what: "guest-exec".into(),
            detail: format!("no pid in {r}"),
        })
    }

    /// Runs `path args…` in the guest and waits for it (at most `timeout`).
    pub fn exec(&mut self, path: &str, args: &[&str], timeout: Duration) -> Result<Exited> {
        let pid = self.start(path, args, true)?;
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.call("guest-exec-status", json!({"pid": pid}))?;
            if s["exited"] == json!(true) {
                let text = |k: &str| {
                    s[k].as_str()
                        .map(|b| String::from_utf8_lossy(&base64_decode(b)).into_owned())
                        .unwrap_or_default()
                };
                return Ok(Exited {
                    code: s["exitcode"]
                        .as_i64()
                        .or_else(|| s["signal"].as_i64().map(|sig| 128 + sig))
                        .unwrap_or(-1),
                    stdout: text("out-data"),
                    stderr: text("err-data"),
                });
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: format!("{path} {} in the guest", args.join(" ")),
                    after: timeout,
                    detail: String::new(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Writes `data` to `path` in the guest (replacing it).
    pub fn write_file(&mut self, path: &str, data: &[u8]) -> Result<()> {
        let handle = self.call("guest-file-open", json!({"path": path, "mode": "w"}))?;
        // 1 MiB a command: the agent reads a whole command line into memory.
        for chunk in data.chunks(1 << 20) {
            self.call(
                "guest-file-write",
                json!({"handle": handle, "buf-b64": base64_encode(chunk)}),
            )?;
        }
        self.call("guest-file-close", json!({"handle": handle}))?;
        Ok(())
    }
}

fn fastish_nonce() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() >> 10)
        .unwrap_or(0)
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

pub(crate) fn base64_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(B64[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

pub(crate) fn base64_decode(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for b in text.bytes() {
        let Some(v) = B64.iter().position(|&x| x == b) else {
            continue;
        };
        acc = (acc << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips() {
        for s in ["", "f", "fo", "foo", "foob", "fooba", "foobar"] {
            let e = base64_encode(s.as_bytes());
            assert_eq!(base64_decode(&e), s.as_bytes(), "{e}");
        }
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
    }
}
