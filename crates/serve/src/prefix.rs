//! The prefix cache shared by a model's slots: KV pages of prompt prefixes, one page per block of
//! [`BLOCK`] tokens (the KV pool's page size), found by a chain hash (block `i`'s key hashes the model fingerprint, block
//! `i - 1`'s key and block `i`'s tokens, so a key stands for the whole prefix up to it). In
//! memory a block is a reference to the page a finished request filled: a hit maps that page into
//! the new request's cache, nothing is copied. Blocks are kept with least-recently-used eviction (the scheduler evicts within the KV
//! budget) and, with `--kv-persist DIR`, also on disk: one file per block, written to a temporary
//! name, synced and renamed (a crash never leaves a half-written block under a real name), with
//! a SHA-256 over the whole file checked before a block is used; corrupt or foreign files are
//! deleted, temporary leftovers are removed at start, and the directory is kept under
//! `--kv-persist-max-bytes` by deleting the least recently used blocks.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};

/// Tokens per cached block: one page of the KV pool.
pub const BLOCK: usize = engine::model::PAGE;

pub type Key = [u8; 32];

const MAGIC: &[u8; 8] = b"HF2QKVB1";
const SUFFIX: &str = ".kvb";
const TMP_PREFIX: &str = ".tmp-";

/// The keys of the full blocks of `tokens`, in order.
pub fn chain_keys(fingerprint: &Key, tokens: &[u32]) -> Vec<Key> {
    let mut prev = *fingerprint;
    tokens
        .chunks_exact(BLOCK)
        .map(|b| {
            let mut h = Sha256::new();
            h.update(prev);
            for t in b {
                h.update(t.to_le_bytes());
            }
            prev = h.finalize().into();
            prev
        })
        .collect()
}

fn hex(k: &Key) -> String {
    k.iter().map(|b| format!("{b:02x}")).collect()
}

struct Entry<P> {
    page: P,
    used: u64,
}

/// A found block: a page in memory, or a block's bytes read from disk (for the caller to write
/// into its cache and hand back with [`PrefixStore::adopt`]).
pub enum Hit<P> {
    Page(P),
    Disk(Vec<u8>),
}

/// What is on disk: key → (file bytes, last use).
type DiskIndex = HashMap<Key, (u64, u64)>;

struct Persist {
    dir: PathBuf,
    index: Arc<Mutex<DiskIndex>>,
    writer: Sender<(Key, Vec<u32>, Arc<Vec<u8>>)>,
}

/// Blocks in memory (and on disk with persistence) for one model; `P` is the KV pool's page.
pub struct PrefixStore<P> {
    fingerprint: Key,
    entries: HashMap<Key, Entry<P>>,
    tick: u64,
    persist: Option<Persist>,
    /// Blocks loaded from disk / found corrupt there (for metrics and tests).
    pub disk_hits: u64,
    pub disk_rejected: u64,
}

impl<P: Clone> PrefixStore<P> {
    pub fn new(fingerprint: Key) -> PrefixStore<P> {
        PrefixStore {
            fingerprint,
            entries: HashMap::new(),
            tick: 0,
            persist: None,
            disk_hits: 0,
            disk_rejected: 0,
        }
    }

    /// Keep blocks in `dir` too (created if needed), at most `max_bytes` of them. Existing files
    /// are checked now: temporary leftovers, unreadable, corrupt or other models' blocks are
    /// deleted; valid ones become available to every slot.
    pub fn with_persistence(mut self, dir: &Path, max_bytes: u64) -> std::io::Result<PrefixStore<P>> {
        // One subdirectory per model, so models sharing DIR never see each other's blocks.
        let dir = &model_dir(dir, &self.fingerprint);
        std::fs::create_dir_all(dir)?;
        let mut index = DiskIndex::new();
        let mut entries: Vec<(std::time::SystemTime, Key, u64)> = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            if name.starts_with(TMP_PREFIX) {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let Some(key) = name.strip_suffix(SUFFIX).and_then(parse_key) else {
                continue;
            };
            match read_block(&path, &self.fingerprint, &key) {
                Ok((_, _)) => {
                    let meta = e.metadata()?;
                    let when = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
                    entries.push((when, key, meta.len()));
                }
                Err(why) => {
                    tracing::warn!("kv-persist: discarding {}: {why}", path.display());
                    self.disk_rejected += 1;
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        // Oldest first get the smallest use ticks.
        entries.sort();
        for (i, (_, key, bytes)) in entries.into_iter().enumerate() {
            index.insert(key, (bytes, i as u64));
        }
        self.tick = index.len() as u64;
        let index = Arc::new(Mutex::new(index));
        let (tx, rx) = channel::<(Key, Vec<u32>, Arc<Vec<u8>>)>();
        let (wdir, windex, fp) = (dir.to_path_buf(), index.clone(), self.fingerprint);
        crate::spawn_thread("hf2q-kv-persist".into(), move || {
            for (key, tokens, data) in rx {
                if let Err(e) = write_block(&wdir, &fp, &key, &tokens, &data, &windex, max_bytes) {
                    tracing::warn!("kv-persist: cannot write a block to {}: {e}", wdir.display());
                }
            }
        })?;
        self.persist = Some(Persist {
            dir: dir.to_path_buf(),
            index,
            writer: tx,
        });
        Ok(self)
    }

    pub fn fingerprint(&self) -> &Key {
        &self.fingerprint
    }

    /// Blocks held in memory.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether block `key` is available (in memory or on disk).
    pub fn contains(&self, key: &Key) -> bool {
        self.entries.contains_key(key)
            || self
                .persist
                .as_ref()
                .is_some_and(|p| p.index.lock().unwrap_or_else(|e| e.into_inner()).contains_key(key))
    }

    /// Block `key` whose tokens are `tokens`: its page from memory, or its bytes from disk. A disk
    /// block that fails its checks is deleted and reported as missing.
    pub fn get(&mut self, key: &Key, tokens: &[u32]) -> Option<Hit<P>> {
        self.tick += 1;
        if let Some(e) = self.entries.get_mut(key) {
            e.used = self.tick;
            return Some(Hit::Page(e.page.clone()));
        }
        let p = self.persist.as_ref()?;
        if !p.index.lock().unwrap_or_else(|e| e.into_inner()).contains_key(key) {
            return None;
        }
        let path = p.dir.join(format!("{}{SUFFIX}", hex(key)));
        match read_block(&path, &self.fingerprint, key) {
            Ok((toks, data)) if toks == tokens => {
                self.disk_hits += 1;
                if let Some(v) = p.index.lock().unwrap_or_else(|e| e.into_inner()).get_mut(key) {
                    v.1 = self.tick;
                }
                // Refresh the file's time so LRU order survives restarts.
                let _ = std::fs::File::options()
                    .append(true)
                    .open(&path)
                    .and_then(|f| f.set_modified(std::time::SystemTime::now()));
                Some(Hit::Disk(data))
            }
            // A valid block whose tokens are not the caller's: not this prefix (kept on disk).
            Ok(_) => None,
            Err(why) => {
                tracing::warn!("kv-persist: discarding {}: {why}", path.display());
                self.disk_rejected += 1;
                p.index.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    /// Keep the page a disk block was loaded into (it is on disk already).
    pub fn adopt(&mut self, key: Key, page: P) {
        self.tick += 1;
        self.entries.insert(key, Entry { page, used: self.tick });
    }

    /// Keep block `key` (the page holding `tokens`' K/V); with persistence it is also written to
    /// disk, as the bytes `data` gives (called only then).
    pub fn insert(&mut self, key: Key, tokens: &[u32], page: P, data: impl FnOnce() -> Vec<u8>) {
        self.tick += 1;
        if let Some(p) = &self.persist {
            let on_disk = p.index.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&key);
            if !on_disk {
                let _ = p.writer.send((key, tokens.to_vec(), Arc::new(data())));
            }
        }
        self.entries.insert(key, Entry { page, used: self.tick });
    }

    /// Drop the least recently used block from memory (it stays on disk); false when empty.
    pub fn evict_one(&mut self) -> bool {
        let Some(k) = self.entries.iter().min_by_key(|(_, e)| e.used).map(|(k, _)| *k) else {
            return false;
        };
        self.entries.remove(&k);
        true
    }
}

/// Where the blocks of the model with fingerprint `fp` live under a `--kv-persist` directory.
pub fn model_dir(dir: &Path, fp: &Key) -> PathBuf {
    dir.join(&hex(fp)[..16])
}

fn parse_key(s: &str) -> Option<Key> {
    if s.len() != 64 {
        return None;
    }
    let mut k = [0u8; 32];
    for (i, b) in k.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(k)
}

/// File layout: magic, fingerprint, key, token count (u32), payload length (u64), tokens (u32
/// each), payload, then the SHA-256 of everything before it.
fn encode_block(fp: &Key, key: &Key, tokens: &[u32], data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(84 + 4 * tokens.len() + data.len() + 32);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(fp);
    out.extend_from_slice(key);
    out.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
    out.extend_from_slice(&(data.len() as u64).to_le_bytes());
    for t in tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(data);
    let sum: [u8; 32] = Sha256::digest(&out).into();
    out.extend_from_slice(&sum);
    out
}

/// A block file's tokens and payload, after checking its length, checksum, model and key.
fn read_block(path: &Path, fp: &Key, key: &Key) -> Result<(Vec<u32>, Vec<u8>), String> {
    let b = std::fs::read(path).map_err(|e| e.to_string())?;
    let head = 8 + 32 + 32 + 4 + 8;
    if b.len() < head + 32 {
        return Err(format!("{} bytes is too short for a block", b.len()));
    }
    let (body, sum) = b.split_at(b.len() - 32);
    if Sha256::digest(body).as_slice() != sum {
        return Err("checksum mismatch".into());
    }
    if &body[..8] != MAGIC {
        return Err("not a hf2q KV block".into());
    }
    if &body[8..40] != fp {
        return Err("written for another model".into());
    }
    if &body[40..72] != key {
        return Err("key differs from the file name".into());
    }
    let n = u32::from_le_bytes(body[72..76].try_into().expect("4 bytes")) as usize;
    let len = u64::from_le_bytes(body[76..84].try_into().expect("8 bytes")) as usize;
    if body.len() != head + 4 * n + len {
        return Err("length fields disagree with the file size".into());
    }
    let tokens = body[head..head + 4 * n]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    Ok((tokens, body[head + 4 * n..].to_vec()))
}

fn write_block(
    dir: &Path,
    fp: &Key,
    key: &Key,
    tokens: &[u32],
    data: &[u8],
    index: &Mutex<DiskIndex>,
    max_bytes: u64,
) -> std::io::Result<()> {
    let bytes = encode_block(fp, key, tokens, data);
    if bytes.len() as u64 > max_bytes {
        return Ok(());
    }
    // Make room first: least recently used blocks go.
    loop {
        let mut idx = index.lock().unwrap_or_else(|e| e.into_inner());
        let total: u64 = idx.values().map(|v| v.0).sum();
        if total + bytes.len() as u64 <= max_bytes {
            break;
        }
        let Some(old) = idx.iter().min_by_key(|(_, v)| v.1).map(|(k, _)| *k) else {
            break;
        };
        idx.remove(&old);
        drop(idx);
        let _ = std::fs::remove_file(dir.join(format!("{}{SUFFIX}", hex(&old))));
    }
    let name = format!("{}{SUFFIX}", hex(key));
    let tmp = dir.join(format!("{TMP_PREFIX}{name}.{}", std::process::id()));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join(&name))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    let mut idx = index.lock().unwrap_or_else(|e| e.into_inner());
    let tick = idx.values().map(|v| v.1).max().map_or(0, |t| t + 1);
    idx.insert(*key, (bytes.len() as u64, tick));
    Ok(())
}

/// A fingerprint of a GGUF model for its KV blocks: the SHA-256 of the file's header, metadata
/// and tensor table (everything before the tensor data), its size, the KV type and block size.
pub fn model_fingerprint(path: &Path, kv_type: &str) -> std::io::Result<Key> {
    use std::io::Read;
    let f = gguf::GgufFile::open(path).map_err(|e| std::io::Error::other(e.to_string()))?;
    let head = f.header().data_offset;
    let mut h = Sha256::new();
    let mut r = std::fs::File::open(path)?.take(head);
    std::io::copy(&mut r, &mut h)?;
    h.update(f.file_size().to_le_bytes());
    h.update(kv_type.as_bytes());
    h.update((BLOCK as u64).to_le_bytes());
    Ok(h.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_round_trip_and_damage_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let fp = [7u8; 32];
        let tokens: Vec<u32> = (0..BLOCK as u32).collect();
        let key = chain_keys(&fp, &tokens)[0];
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let index = Mutex::new(DiskIndex::new());
        write_block(dir.path(), &fp, &key, &tokens, &data, &index, 1 << 20).unwrap();
        let path = dir.path().join(format!("{}{SUFFIX}", hex(&key)));
        assert_eq!(read_block(&path, &fp, &key).unwrap(), (tokens.clone(), data.clone()));
        // Another model's fingerprint, a wrong key, a flipped byte, a truncation: all refused.
        assert!(read_block(&path, &[8u8; 32], &key).is_err());
        assert!(read_block(&path, &fp, &[0u8; 32]).is_err());
        let mut b = std::fs::read(&path).unwrap();
        b[500] ^= 1;
        std::fs::write(&path, &b).unwrap();
        assert_eq!(read_block(&path, &fp, &key).unwrap_err(), "checksum mismatch");
        b[500] ^= 1;
        std::fs::write(&path, &b[..b.len() - 10]).unwrap();
        assert!(read_block(&path, &fp, &key).is_err());
    }

    #[test]
    fn a_restart_keeps_good_blocks_and_drops_bad_ones_and_leftovers() {
        let root = tempfile::tempdir().unwrap();
        let fp = [1u8; 32];
        let dir = model_dir(root.path(), &fp);
        let toks: Vec<u32> = (0..3 * BLOCK as u32).collect();
        let keys = chain_keys(&fp, &toks);
        {
            let mut s = PrefixStore::<()>::new(fp)
                .with_persistence(root.path(), 1 << 30)
                .unwrap();
            for (i, k) in keys.iter().enumerate() {
                s.insert(*k, &toks[i * BLOCK..(i + 1) * BLOCK], (), || vec![i as u8; 4096]);
            }
        }
        // The writer thread finishes when the store (its sender) is gone.
        let t = std::time::Instant::now();
        while std::fs::read_dir(&dir).unwrap().count() < 3 {
            assert!(t.elapsed().as_secs() < 10);
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        std::fs::write(dir.join(format!("{TMP_PREFIX}x.kvb.1")), b"half").unwrap();
        let bad = dir.join(format!("{}{SUFFIX}", hex(&keys[1])));
        let mut b = std::fs::read(&bad).unwrap();
        b[200] ^= 0xff;
        std::fs::write(&bad, b).unwrap();

        let mut s = PrefixStore::<()>::new(fp)
            .with_persistence(root.path(), 1 << 30)
            .unwrap();
        assert_eq!(s.disk_rejected, 1);
        assert!(s.contains(&keys[0]) && !s.contains(&keys[1]) && s.contains(&keys[2]));
        match s.get(&keys[0], &toks[..BLOCK]) {
            Some(Hit::Disk(d)) => assert_eq!(d.as_slice(), &[0u8; 4096][..]),
            _ => panic!("block 0 is on disk"),
        }
        // The key's tokens must match too.
        assert!(s.get(&keys[2], &toks[..BLOCK]).is_none());
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "the corrupt block and the leftover are gone: {names:?}");
        // A different model sees nothing (and deletes nothing).
        let other = PrefixStore::<()>::new([2u8; 32])
            .with_persistence(root.path(), 1 << 30)
            .unwrap();
        assert!(!other.contains(&keys[0]));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
    }

    #[test]
    fn the_directory_stays_under_its_cap() {
        let dir = tempfile::tempdir().unwrap();
        let fp = [3u8; 32];
        let index = Mutex::new(DiskIndex::new());
        let toks: Vec<u32> = (0..10 * BLOCK as u32).collect();
        let keys = chain_keys(&fp, &toks);
        let one = encode_block(&fp, &keys[0], &toks[..BLOCK], &[0u8; 1000]).len() as u64;
        for (i, k) in keys.iter().enumerate() {
            write_block(
                dir.path(),
                &fp,
                k,
                &toks[i * BLOCK..(i + 1) * BLOCK],
                &[0u8; 1000],
                &index,
                3 * one,
            )
            .unwrap();
        }
        let n = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(n, 3);
        // The newest three survive.
        for k in &keys[7..] {
            assert!(dir.path().join(format!("{}{SUFFIX}", hex(k))).is_file());
        }
    }
}
